"""Optimum Graphcore's quantized Whisper (`notebooks/whisper-quantized-example.ipynb`), made real (issue 41, item 4).

`parallelize(..., use_group_quantized_linears=True)` stores the weight of every linear layer of the encoder and
decoder layers in int8, one scale per group of input features (`torchao`; `optimum_ipu.runtime.quantization`): the
weights really are int8, the model still generates (in fp32 and after the notebook's `.half()`) with logits close to
fp32's, its saved file is smaller and loads back quantized, `pipeline(quantize=True)` (or the config's
`inference_parallelize_kwargs` key) takes the same path, and without `torchao` the option fails in one line naming the
fix. The notebook's own flow runs with OpenAI's Whisper tiny.en on `jfk.flac`. Tiny random Whispers elsewhere:
d_model 32, so every group is 32 inputs (64 for `fc2`, whose inputs are the 64 of the feed-forward layer).
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import jiwer
import pytest
import torch
import transformers
from optimum_ipu.models.whisper import WhisperProcessorTorch
from transformers import WhisperForConditionalGeneration
from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

from optimum_ipu import IPUConfig, pipeline
from optimum_ipu.errors import IncompatibleIPUConfigError
from optimum_ipu.modeling_utils import to_pipelined
from optimum_ipu.pipelines.audio import load_audio
from optimum_ipu.runtime import quantization

from .tiny_models_vision_speech import save_tiny_whisper, tiny_config, tiny_inputs

JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
ENCODER_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "fc1", "fc2")
DECODER_LINEARS = (*ENCODER_LINEARS[:4], *(f"encoder_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "out_proj")))
# the notebook's parallelize() arguments (its IPU-only ones are named once and have no effect here)
NOTEBOOK_KNOBS = {
    "use_cache": True,
    "batch_size": 1,
    "num_beams": 1,
    "max_length": 448,
    "on_device_generation_steps": 16,
    "use_encoder_output_buffer": False,
    "use_cond_encoder": True,
}


def tiny_whisper() -> WhisperForConditionalGeneration:
    """The suite's tiny Whisper (2 + 2 layers, d_model 32) with 64-wide feed-forward layers, so that every linear
    layer has a group size that divides its inputs."""
    config = tiny_config("whisper")
    config.encoder_ffn_dim = config.decoder_ffn_dim = 64
    torch.manual_seed(0)
    return WhisperForConditionalGeneration(config).eval()


def expected_linears(model: WhisperForConditionalGeneration) -> set[str]:
    """Optimum Graphcore's choice (its `quantize_linear_layers`): every linear layer of the encoder and decoder
    layers; not the output projection, the embeddings or the convolutions."""
    config = model.config
    encoder = {f"model.encoder.layers.{i}.{p}" for i in range(config.encoder_layers) for p in ENCODER_LINEARS}
    decoder_parts = (*DECODER_LINEARS, "fc1", "fc2")
    decoder = {f"model.decoder.layers.{i}.{p}" for i in range(config.decoder_layers) for p in decoder_parts}
    return encoder | decoder


def int8_linears(model: torch.nn.Module) -> set[str]:
    """The linear layers whose weight is stored in int8."""
    return {
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and getattr(module.weight, "qdata", torch.empty(0)).dtype == torch.int8
    }


def quantized(model: WhisperForConditionalGeneration) -> torch.nn.Module:
    return to_pipelined(model, IPUConfig(ipus_per_replica=2)).parallelize(
        for_generation=True, use_cache=True, use_group_quantized_linears=True
    )


def tensor_bytes(path: Path) -> int:
    """The bytes of a safetensors file's tensors (its size less the JSON header, which for torchao's tensors carries
    a description of each: large beside a tiny model's weights)."""
    header = int.from_bytes(path.read_bytes()[:8], "little")
    return path.stat().st_size - 8 - header


def logits(model: torch.nn.Module, features: torch.Tensor) -> torch.Tensor:
    decoder_input_ids = torch.tensor([[3, 5, 7, 11, 13]] * features.shape[0])
    with torch.no_grad():
        return model(input_features=features, decoder_input_ids=decoder_input_ids).logits.float()


def test_a_model_with_nothing_to_quantize_is_refused():
    config = tiny_config("whisper")
    config.d_model, config.encoder_ffn_dim, config.decoder_ffn_dim = 24, 40, 40  # groups of 8 at most: under 16
    model = WhisperForConditionalGeneration(config).eval()
    with pytest.raises(ValueError, match="nothing would be quantized; leave the option out"):
        to_pipelined(model, IPUConfig()).parallelize(use_group_quantized_linears=True)


@pytest.fixture(scope="module", autouse=True)
def forget_warnings_said_once():
    """The notebook's IPU-only knobs are named once per process (`warning_once`), and other files count that one
    saying in their own tests: after this module, the process forgets what it said."""
    yield
    logging.Logger.warning_once.cache_clear()


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory) -> str:
    return save_tiny_whisper(tmp_path_factory.mktemp("whisper"))  # 37-wide feed-forward layers


@pytest.fixture(scope="module")
def features() -> torch.Tensor:
    return tiny_inputs("WhisperForConditionalGeneration")["input_features"]


def test_parallelize_stores_the_layers_linear_weights_in_int8(caplog):
    model = tiny_whisper()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with caplog.at_level(logging.WARNING):
        pipelined = quantized(model)
    said = [r.getMessage() for r in caplog.records]
    assert not any("use_group_quantized_linears" in m for m in said), said  # realised, never "no effect"
    assert int8_linears(model) == expected_linears(model)
    assert len(int8_linears(model)) == 2 * 6 + 2 * 10
    for name in expected_linears(model):
        weight = model.get_submodule(name).weight
        group = 64 if name.endswith("fc2") else 32  # the inputs of fc2 are the 64 of the feed-forward layer
        assert list(weight.block_size) == [1, group]
        assert weight.scale.numel() == weight.shape[0] * weight.shape[1] // group
        original = before[f"{name}.weight"]
        step = original.abs().amax() / 127  # at most half a step off, with a step of the largest group's
        assert (weight.dequantize() - original).abs().max() <= step / 2 + 1e-6
        assert not torch.equal(weight.dequantize(), original)
    # the output projection stays tied to the token embedding, in fp32, as are the convolutions and positions
    assert model.proj_out.weight is model.model.decoder.embed_tokens.weight
    assert type(model.proj_out.weight) is torch.nn.Parameter and model.proj_out.weight.dtype == torch.float32
    for name in (
        "model.encoder.conv1.weight",
        "model.encoder.embed_positions.weight",
        "model.decoder.embed_tokens.weight",
    ):
        assert torch.equal(model.get_parameter(name), before[name])
    assert pipelined.parallelize(use_group_quantized_linears=True) is pipelined  # again: nothing more to do
    assert int8_linears(model) == expected_linears(model)


def test_quantized_whisper_generates_close_to_fp32(features):
    reference = tiny_whisper()
    model = quantized(tiny_whisper())
    fp32, int8 = logits(reference, features), logits(model, features)
    # weight-only int8 in groups of 32: the logits move by a small fraction of their spread, never by nothing
    spread = fp32.max() - fp32.min()
    assert 0 < (int8 - fp32).abs().max() < 0.02 * spread
    assert torch.equal(int8.argmax(-1), fp32.argmax(-1))
    tokens = model.generate(features, max_length=12, min_length=3)
    assert torch.equal(tokens, reference.generate(features, max_length=12, min_length=3))
    # the notebook's `.half()`: the int8 weights stay int8, the activations and scales turn fp16
    half = model.half()
    assert int8_linears(half.model) == expected_linears(half.model)
    fp16 = logits(half, features.half())
    assert (fp16 - int8).abs().max() < 0.02 * spread
    assert torch.equal(half.generate(features.half(), max_length=12, min_length=3), tokens)


def test_saved_quantized_whisper_is_smaller_and_loads_back_int8(tmp_path, features):
    reference = tiny_whisper()
    to_pipelined(copy.deepcopy(reference), IPUConfig()).save_pretrained(tmp_path / "fp32")
    model = quantized(reference)
    model.save_pretrained(tmp_path / "int8")
    files = {kind: tmp_path / kind / "model.safetensors" for kind in ("fp32", "int8")}
    assert files["int8"].stat().st_size < files["fp32"].stat().st_size
    # the 32 linear layers hold ~80% of this model's weights: 4 bytes each become 1, plus a 4-byte scale and a
    # 1-byte zero point per group of 32 or 64: about 0.37 of fp32 in all
    sizes = {kind: tensor_bytes(path) for kind, path in files.items()}
    assert sizes["int8"] < 0.45 * sizes["fp32"], sizes
    assert (tmp_path / "int8" / "ipu_config.json").is_file()
    assert int8_linears(model.model) == expected_linears(model.model)  # saving does not undo the quantization
    loaded = WhisperForConditionalGeneration.from_pretrained(tmp_path / "int8").eval()
    assert int8_linears(loaded) == expected_linears(loaded)
    for name in expected_linears(loaded):  # the same int8 values and scales
        weight, saved = model.model.get_submodule(name).weight, loaded.get_submodule(name).weight
        assert torch.equal(saved.qdata, weight.qdata) and torch.equal(saved.scale, weight.scale)
    torch.testing.assert_close(logits(loaded, features), logits(model, features), rtol=0, atol=1e-6)


def test_without_torchao_the_option_fails_in_one_line(monkeypatch, whisper_dir):
    model = tiny_whisper()
    monkeypatch.setattr(quantization, "torchao_version", lambda: None)
    with pytest.raises(ImportError) as missing:
        to_pipelined(model, IPUConfig()).parallelize(for_generation=True, use_group_quantized_linears=True)
    message = str(missing.value)
    assert "\n" not in message and 'pip install "optimum-ipu[quantization]"' in message, message
    assert "use_group_quantized_linears=True" in message and "torchao" in message
    assert not int8_linears(model)  # nothing was quantized on the way
    # without asking, nothing needs torchao
    to_pipelined(model, IPUConfig()).parallelize(for_generation=True, use_group_quantized_linears=False)
    monkeypatch.setattr(quantization, "torchao_version", lambda: "0.16.0")
    with pytest.raises(
        ImportError, match=r"^quantize=True on backend='eager' needs torchao>=0\.17\.0, found 0\.16\.0: pip"
    ):
        pipeline("automatic-speech-recognition", model=whisper_dir, quantize=True)


def test_quantizing_a_model_in_training_is_refused():
    model = tiny_whisper().train()
    with pytest.raises(IncompatibleIPUConfigError, match=r"call \.eval\(\)"):
        to_pipelined(model, IPUConfig()).parallelize(use_group_quantized_linears=True)
    assert not int8_linears(model)


@pytest.mark.parametrize("how", ["quantize=True", "inference_parallelize_kwargs"])
def test_pipeline_quantizes_whisper_on_the_eager_backend(whisper_dir, how, caplog):
    kwargs = {"quantize": True} if how == "quantize=True" else {}
    if how == "inference_parallelize_kwargs":
        kwargs["ipu_config"] = IPUConfig(inference_parallelize_kwargs={"use_group_quantized_linears": True})
    speech = torch.sin(torch.arange(8_000) / 5.0).numpy()
    with caplog.at_level(logging.WARNING):
        asr = pipeline("automatic-speech-recognition", model=whisper_dir, **kwargs)
        text = asr(speech, generate_kwargs={"max_new_tokens": 8})["text"]
    said = [r.getMessage() for r in caplog.records]
    assert not any("has no effect" in m for m in said), said
    fc2 = {name for name in expected_linears(asr.model) if name.endswith("fc2")}
    # fc2's 37 inputs have no group of 16 or more: kept in fp32, and said so once
    assert int8_linears(asr.model) == expected_linears(asr.model) - fc2
    assert sum("4 linear layer(s) kept unquantized" in m for m in said) == 1, said
    plain = pipeline("automatic-speech-recognition", model=whisper_dir)
    assert not int8_linears(plain.model)
    assert isinstance(text, str) and text == plain(speech, generate_kwargs={"max_new_tokens": 8})["text"]


def test_optimum_graphcore_quantized_notebook_transcribes_jfk(shared_data: Path, tmp_path):
    checkpoint = str(shared_data.parent / "models" / "whisper-tiny.en")
    speech = load_audio(str(shared_data / "fixtures" / "audio" / "jfk.flac"), 16_000)
    processor = WhisperProcessorTorch.from_pretrained(checkpoint)
    model = WhisperForConditionalGeneration.from_pretrained(checkpoint)
    ipu_config = IPUConfig(
        ipus_per_replica=1, explicit_ir_inference=True, executable_cache_dir=str(tmp_path / "exe_cache")
    )
    pipelined_model = to_pipelined(model, ipu_config)
    pipelined_model = pipelined_model.parallelize(
        for_generation=True, use_group_quantized_linears=True, **NOTEBOOK_KNOBS
    ).half()
    assert len(int8_linears(model)) == 4 * 6 + 4 * 10  # tiny.en: 4 encoder and 4 decoder layers
    input_features = processor(speech, return_tensors="pt", sampling_rate=16_000).input_features.half()
    sample_output = pipelined_model.generate(input_features, use_cache=True, num_beams=1, max_length=448, min_length=3)
    transcription = processor.batch_decode(sample_output, skip_special_tokens=True)[0]
    normalize = EnglishTextNormalizer({})
    assert jiwer.wer(normalize(JFK), normalize(transcription)) <= 1 / 22, transcription  # at most 1 of its 22 words
    pipelined_model.detachFromDevice()


def test_transformers_reads_the_quantization_it_was_given(tmp_path):
    """The config written beside the int8 weights is `transformers`' own `TorchAoConfig`."""
    model = tiny_whisper()
    quantized(model).save_pretrained(tmp_path)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert config.quantization_config["quant_method"] == "torchao"
    assert config.quantization_config["modules_to_not_convert"] == ["proj_out"]
