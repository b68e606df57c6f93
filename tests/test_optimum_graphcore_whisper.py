"""Optimum Graphcore's Whisper notebooks after the one changed import line (docs/migrating.md, "Whisper").

The flow of its `notebooks/whisper-example.ipynb` (and `whisper-quantized-example.ipynb`): a `WhisperProcessorTorch`,
the stock `WhisperForConditionalGeneration`, `to_pipelined(model, ipu_config).parallelize(for_generation=True,
...knobs).half()`, `generate(input_features.half(), ...)`, `batch_decode`, `detachFromDevice()`; and its IPU config's
`inference_parallelize_kwargs` given to `pipeline()`. Run with OpenAI's Whisper tiny.en
(`../shared/models/whisper-tiny.en`) on `jfk.flac`: the text of `transformers`, with the IPU-only knobs named once.
"""

from __future__ import annotations

import logging

import pytest
import transformers

# from optimum.graphcore.models.whisper import WhisperProcessorTorch
from optimum_ipu.models.whisper import WhisperProcessorTorch
from transformers import WhisperForConditionalGeneration

# from optimum.graphcore import IPUConfig, pipeline
from optimum_ipu import IPUConfig, pipeline

# from optimum.graphcore.modeling_utils import to_pipelined
from optimum_ipu.modeling_utils import to_pipelined
from optimum_ipu.pipelines.audio import load_audio

SAID = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."
# the inference knobs of Optimum Graphcore's Whisper configs (its fine-tuning notebook and examples)
KNOBS = {
    "use_cache": True,
    "batch_size": 1,
    "max_length": 448,
    "on_device_generation_steps": 16,
    "use_cross_cache": True,
    "use_encoder_output_buffer": True,
}


@pytest.fixture(scope="module")
def checkpoint(shared_data) -> str:
    return str(shared_data.parent / "models" / "whisper-tiny.en")


@pytest.fixture(scope="module")
def speech(shared_data):
    return load_audio(str(shared_data / "fixtures" / "audio" / "jfk.flac"), 16_000)


def test_whisper_notebook_flow_transcribes_as_transformers(checkpoint, speech, tmp_path, caplog):
    processor = WhisperProcessorTorch.from_pretrained(checkpoint)
    model = WhisperForConditionalGeneration.from_pretrained(checkpoint)
    ipu_config = IPUConfig(executable_cache_dir=str(tmp_path / "exe_cache"), ipus_per_replica=2)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        pipelined_model = to_pipelined(model, ipu_config)
        pipelined_model = pipelined_model.parallelize(
            for_generation=True,
            use_cache=True,
            batch_size=1,
            max_length=448,
            on_device_generation_steps=16,
            use_encoder_output_buffer=True,
        ).half()
    # the IPU-only knob is said once, by name; what transformers' generation does anyway is not
    said = [r.getMessage() for r in caplog.records]
    assert sum("'on_device_generation_steps' has no effect" in m for m in said) == 1, said
    assert not any("use_encoder_output_buffer" in m for m in said), said
    layout = pipelined_model.describe_layout()  # the encoder's 4 layers on ipu0, the decoder's on ipu1
    assert "ipu0: embeddings + layers 0-3" in layout and "ipu1: layers 4-7 + heads" in layout, layout

    input_features = processor(speech, return_tensors="pt", sampling_rate=16_000).input_features.half()
    sample_output = pipelined_model.generate(
        input_features, use_cache=True, do_sample=False, max_length=448, min_length=3
    )
    transcription = processor.batch_decode(sample_output, skip_special_tokens=True)[0]
    assert transcription.strip() == SAID  # transformers' text (its pipeline's below), in the notebook's fp16 too
    pipelined_model.detachFromDevice()


def test_whisper_config_knobs_serve_the_pipeline_as_transformers(checkpoint, speech, caplog):
    ipu_config = IPUConfig(ipus_per_replica=2, inference_parallelize_kwargs=KNOBS)
    asr = pipeline("automatic-speech-recognition", model=checkpoint, ipu_config=ipu_config)
    reference = transformers.pipeline("automatic-speech-recognition", model=checkpoint)
    assert asr(speech) == reference(speech) == {"text": f" {SAID}"}
    # the quantized notebook's knobs: the IPU-only one named once, never refused; the quantization is realised
    # (int8 weights: tests/test_whisper_quantized.py)
    model = WhisperForConditionalGeneration.from_pretrained(checkpoint)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        to_pipelined(model, IPUConfig(ipus_per_replica=1, explicit_ir_inference=True)).parallelize(
            for_generation=True,
            use_cache=True,
            batch_size=1,
            num_beams=1,
            max_length=448,
            on_device_generation_steps=16,
            use_encoder_output_buffer=False,
            use_cond_encoder=True,
            use_group_quantized_linears=True,
        )
    said = [r.getMessage() for r in caplog.records]
    assert sum("'use_cond_encoder' has no effect" in m for m in said) == 1, said
    assert not any("use_group_quantized_linears" in m for m in said), said
