"""The speed path of `pipeline("automatic-speech-recognition")` for Whisper (the encoder run apart, in bf16 on CPUs
that compute it natively; `optimum_ipu.pipelines.speech`) gives `transformers`' own pipeline's text: OpenAI's Whisper
tiny.en (`../shared/models/whisper-tiny.en`) on `jfk.flac` and spoken digits of the FSDD test split. (Its speed is
measured by `optimum-ipu benchmark --mode latency --task automatic-speech-recognition`, never here.)"""

from __future__ import annotations

import pytest
import transformers

from optimum_ipu import pipeline
from optimum_ipu.pipelines.audio import load_audio
from optimum_ipu.runtime.inference.runner import encoder_precision

RATE = 16_000
TASK = "automatic-speech-recognition"
SAID = " And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."


@pytest.fixture(scope="module")
def whisper_pipelines(shared_data):
    model_dir = shared_data.parent / "models" / "whisper-tiny.en"
    return pipeline(TASK, model=model_dir), transformers.pipeline(TASK, model=str(model_dir))


def test_speed_path_transcribes_as_transformers(whisper_pipelines, shared_data):
    ours, reference = whisper_pipelines
    assert ours.encoder_engine.precision == encoder_precision(ours.device)  # bf16 where the CPU has AVX512-BF16
    assert ours.speed_path() == f"encoder {encoder_precision(ours.device)}, decoder fp32"
    speech = load_audio(str(shared_data / "fixtures" / "audio" / "jfk.flac"), RATE)
    assert ours(speech) == reference(speech) == {"text": SAID}
    folder = shared_data / "audio" / "fsdd" / "test"
    clips = [load_audio(str(folder / name), RATE) for name in ("1_nicolas_3.wav", "6_lucas_4.wav", "8_jackson_2.wav")]
    assert ours(clips) == [reference(clip) for clip in clips]
