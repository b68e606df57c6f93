"""Stage i on device i in one process (`optimum_ipu.models.stage_placement`, issue 23): the `device_map` follows the
inference layout and covers every weight, `transformers` loads by it, and `from_pretrained(device_map="stages")`
refuses in one line where there are fewer GPUs than stages. Placing the stages on two GPUs is tested where a machine
has them (none has been lent to this project: the last test is skipped here and says so)."""

from __future__ import annotations

import pytest
import torch
import transformers

from optimum_ipu import AutoModelForCausalLM, IPUConfig
from optimum_ipu.errors import IncompatibleIPUConfigError
from optimum_ipu.models.stage_placement import stage_device_map

from .tiny_models import tiny_model
from .tiny_models_vision_speech import tiny_config

LAYOUT = IPUConfig(layers_per_ipu=[1, 1], inference_layers_per_ipu=[1, 3], ipus_per_replica=2)


def test_each_stage_of_the_inference_layout_gets_its_device():
    model = tiny_model("LlamaForCausalLM")  # 4 layers: 1 on stage 0, 3 on stage 1 when serving
    device_map = stage_device_map(model, LAYOUT, ["first", "second"])
    assert device_map["model.embed_tokens"] == device_map["model.layers.0"] == "first"
    assert {device_map[f"model.layers.{i}"] for i in (1, 2, 3)} == {"second"}
    assert device_map["model.norm"] == device_map["lm_head"] == "second"
    assert device_map["model.rotary_emb"] == "first"  # a buffer the model uses before its first layer
    for name in [*dict(model.named_parameters()), *dict(model.named_buffers())]:  # each weight placed once
        assert sum(name.startswith(path + ".") for path in device_map) == 1, name


@pytest.mark.parametrize(
    "class_name", ["GPT2LMHeadModel", "T5ForConditionalGeneration", "BertForQuestionAnswering", "Wav2Vec2ForCTC"]
)
def test_transformers_loads_by_the_map(tmp_path, class_name):
    """The map is a `device_map` `transformers` takes as it is (every weight covered; tied embeddings as they are):
    on the CPU, every stage's device the CPU, the model's outputs are the stock model's."""
    stock = tiny_wav2vec2() if class_name == "Wav2Vec2ForCTC" else tiny_model(class_name)
    stock.save_pretrained(tmp_path)
    device_map = stage_device_map(stock, IPUConfig(layers_per_ipu=[1, -1], ipus_per_replica=2), ["cpu", "cpu"])
    placed = type(stock).from_pretrained(tmp_path, device_map=device_map)
    ids = torch.randint(1, 32, (2, 6))
    inputs = {"input_ids": ids, **({"decoder_input_ids": ids} if stock.config.is_encoder_decoder else {})}
    if class_name.startswith("Wav2Vec2"):  # its mask embedding sits on the module above the encoder's layers
        assert device_map["wav2vec2.masked_spec_embed"] == "cpu" and "wav2vec2.encoder.layers.0" in device_map
        inputs = {"input_values": torch.randn(2, 800)}
    with torch.no_grad():
        want, got = stock.eval()(**inputs), placed(**inputs)
    key = "logits" if "logits" in want else "start_logits"
    torch.testing.assert_close(got[key], want[key])


def tiny_wav2vec2() -> transformers.Wav2Vec2ForCTC:
    torch.manual_seed(0)
    config = tiny_config("wav2vec2")
    config.mask_time_prob = 0.05  # what makes Wav2Vec2 hold its mask embedding (above the encoder's layers)
    return transformers.Wav2Vec2ForCTC(config).eval()


def test_fewer_gpus_than_stages_is_one_line(tmp_path):
    tiny_model("LlamaForCausalLM").save_pretrained(tmp_path)
    with pytest.raises(IncompatibleIPUConfigError, match=r'device_map="stages": the inference layout has 2 stages'):
        AutoModelForCausalLM.from_pretrained(tmp_path, ipu_config=LAYOUT, device_map="stages")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="placing stages on GPUs needs two (none lent so far)")
def test_stages_on_two_gpus_generate_the_one_device_tokens(tmp_path):
    tiny_model("LlamaForCausalLM").save_pretrained(tmp_path)
    placed = AutoModelForCausalLM.from_pretrained(tmp_path, ipu_config=LAYOUT, device_map="stages").model
    assert {str(p.device) for p in placed.parameters()} == {"cuda:0", "cuda:1"}
    one = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).to("cuda:0")
    ids = torch.randint(1, 32, (2, 6), device="cuda:0")
    kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(placed.generate(input_ids=ids, **kwargs).cpu(), one.generate(input_ids=ids, **kwargs).cpu())
