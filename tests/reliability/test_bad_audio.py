"""Audio that would poison a run is refused where it is decoded, by the file's name (issue 28, item 3): NaN or Inf
samples, an empty or near-empty clip, a header whose sample rate is absurd (checked before anything is read or
resampled), a resampled size over the bound; in `load_audio` / `read_audio`, in `pipeline()` and in an example
script (one line, exit code 2)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import soundfile

from optimum_ipu.pipelines import audio
from optimum_ipu.pipelines.audio import load_audio, read_audio, resample

from ..conftest import REPO_ROOT
from ..examples.test_run_audio_classification import TINY
from .test_script_errors import load_script, one_clear_line, run_main

RATE = 16_000


def wav(path, samples: np.ndarray, rate: int = 8_000, subtype: str = "FLOAT"):
    soundfile.write(path, samples.astype(np.float32), rate, subtype=subtype)
    return path


def with_header_rate(path, rate: int):
    """The WAV at `path` with its header claiming `rate` Hz (the `fmt ` chunk's rate and byte rate)."""
    data = bytearray(path.read_bytes())
    at = data.index(b"fmt ") + 8
    channels, bits = struct.unpack_from("<H", data, at + 2)[0], struct.unpack_from("<H", data, at + 14)[0]
    struct.pack_into("<II", data, at + 4, rate, (rate * channels * bits // 8) & 0xFFFFFFFF)
    path.write_bytes(bytes(data))
    return path


def speech(n: int = 8_000) -> np.ndarray:
    return (0.1 * np.sin(np.arange(n) / 7.0)).astype(np.float32)


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("at", [0, 4_321, -1])
def test_non_finite_samples_name_the_file(tmp_path, reliability, poison, at):
    samples = speech()
    samples[at] = poison
    path = wav(tmp_path / "clip.wav", samples)
    for call in (
        lambda: read_audio(path),
        lambda: load_audio(str(path), RATE),
        lambda: load_audio(path.read_bytes(), RATE),
    ):
        err = reliability.expect_clear_error(call, ("NaN or infinite", "re-export"))
        assert str(path) in str(err) or "<bytes>" in str(err)


@pytest.mark.parametrize("form", ["array", "dict", "tensor"])
def test_non_finite_arrays_name_the_waveform(reliability, form):
    samples = speech()
    samples[100] = np.nan
    value = {"array": samples, "sampling_rate": 8_000} if form == "dict" else samples
    if form == "tensor":
        import torch

        value = torch.from_numpy(samples)
    reliability.expect_clear_error(lambda: load_audio(value, RATE), ("the waveform", "NaN or infinite"))


@pytest.mark.parametrize("frames", [0, 1, 79])
def test_empty_and_near_empty_clips_name_the_file(tmp_path, reliability, frames):
    path = wav(tmp_path / "short.wav", speech(frames), subtype="PCM_16")
    reliability.expect_clear_error(lambda: load_audio(str(path), RATE), (str(path), "shorter than 10 ms"))
    reliability.expect_clear_error(lambda: load_audio(speech(frames * 2), RATE), ("the waveform", "10 ms"))


def test_ten_milliseconds_and_silence_are_accepted(tmp_path):
    assert load_audio(str(wav(tmp_path / "a.wav", speech(80), subtype="PCM_16")), RATE).shape == (160,)
    assert load_audio(np.zeros(RATE, np.float32), RATE).shape == (RATE,)


@pytest.mark.parametrize("claimed", [1, 999, 384_001, 2**31 - 1, 2**32 - 1])
def test_an_absurd_header_rate_is_refused_before_any_allocation(tmp_path, monkeypatch, reliability, claimed):
    path = with_header_rate(wav(tmp_path / "lying.wav", speech(), subtype="PCM_16"), claimed)
    monkeypatch.setattr(audio, "_resample_poly", lambda: pytest.fail("resampled an absurd rate"))
    reliability.expect_clear_error(lambda: load_audio(str(path), RATE), (str(path), f"{claimed} Hz", "re-encode"))


def test_bounds_on_rates_and_resampled_size_for_arrays(monkeypatch, reliability):
    monkeypatch.setattr(audio, "_resample_poly", lambda: pytest.fail("resampled past the bound"))
    for rate in (0, -8_000, 10**9, 8_000.5):
        value = {"array": speech(), "sampling_rate": rate}
        reliability.expect_clear_error(lambda v=value: load_audio(v, RATE), ("the waveform", repr(rate), "Hz"))
    monkeypatch.setattr(audio, "MAX_RESAMPLED_SAMPLES", 10_000)
    reliability.expect_clear_error(lambda: resample(speech(), 8_000, RATE, "big.wav"), ("big.wav", "16000", "cut"))


def test_the_pipelines_refuse_poisoned_audio(tmp_path, reliability):
    from optimum_ipu.pipelines.speech import _decode  # what every speech pipeline's preprocess decodes through

    samples = speech()
    samples[5] = np.inf
    path = wav(tmp_path / "inf.wav", samples)
    reliability.expect_clear_error(lambda: _decode(str(path), RATE), (str(path), "NaN or infinite"))
    reliability.expect_clear_error(lambda: _decode({"raw": samples, "sampling_rate": 8_000}, RATE), "the waveform")
    reliability.expect_clear_error(lambda: _decode({"array": speech(0), "sampling_rate": 8_000}, RATE), "10 ms")


def test_an_example_script_ends_in_one_line_naming_the_file(tmp_path, reliability):
    folder = tmp_path / "eval"
    folder.mkdir()
    bad = speech()
    bad[10] = np.nan
    for name, samples in (("a.wav", speech()), ("b.wav", bad)):
        wav(folder / name, samples)
    (folder / "metadata.csv").write_text("file_name,label\na.wav,yes\nb.wav,no\n")
    script = load_script(REPO_ROOT / "examples" / "audio-classification", "run_audio_classification")
    argv = ["--model_type", "wav2vec2", "--config_overrides", json.dumps(TINY), "--eval_dir", str(folder)]
    argv += ["--do_eval", "--max_length_seconds", "1", "--output_dir", str(tmp_path / "out"), "--report_to", "none"]
    code, stderr = run_main(script, argv)
    one_clear_line(reliability, code, stderr, (str(folder / "b.wav"), "NaN or infinite"))


def test_pipeline_refuses_poisoned_audio_by_name(tmp_path, reliability):
    import transformers

    from optimum_ipu import pipeline

    model = transformers.Wav2Vec2ForSequenceClassification(transformers.Wav2Vec2Config(**TINY, num_labels=2))
    extractor = transformers.Wav2Vec2FeatureExtractor(return_attention_mask=True)
    classify = pipeline("audio-classification", model=model, feature_extractor=extractor)
    samples = speech(RATE)
    assert len(classify(samples)) == 2  # a sound clip is classified
    samples[7] = np.nan
    path = wav(tmp_path / "nan.wav", samples, rate=RATE)
    reliability.expect_clear_error(lambda: classify(str(path)), (str(path), "NaN or infinite"))
    reliability.expect_clear_error(lambda: classify(samples), ("the waveform", "NaN or infinite"))
    reliability.expect_clear_error(lambda: classify(np.zeros(0, np.float32)), ("the waveform", "10 ms"))
