"""`optimum-ipu benchmark --mode latency --task automatic-speech-recognition` on a tiny random Whisper: both runners
transcribe jfk.flac and FSDD clips one at a time, the report and chart are written, and ours gives `transformers`'
transcripts. (Timings of a loaded CI machine mean nothing: nothing here compares them.)"""

from __future__ import annotations

import json

import pytest
import transformers

from optimum_ipu.benchmark import format_report, run_benchmark
from optimum_ipu.benchmark.speech_latency import SHARED_DATA_ENV, word_error_rate

from .tiny_models_vision_speech import save_tiny_whisper

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory) -> str:
    """The tiny Whisper, generating at most 6 tokens (its generation config: both pipelines read it)."""
    folder = save_tiny_whisper(tmp_path_factory.mktemp("whisper"))
    config = transformers.GenerationConfig.from_pretrained(folder)
    config.max_length = 6
    config.save_pretrained(folder)
    return folder


def test_speech_latency_mode_times_ours_and_transformers(tiny_whisper, shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv(SHARED_DATA_ENV, str(shared_data))
    report = run_benchmark(
        model=tiny_whisper,
        task="automatic-speech-recognition",
        mode="latency",
        steps=3,
        warmup=1,
        output_dir=str(tmp_path),
    )
    names = [r["name"] for r in report["results"]]
    assert names[0].startswith("optimum-ipu pipeline (") and names[1] == "transformers pipeline"
    assert report["requests"] == {"jfk": 6, "fsdd": 3} and report["batch_size"] == 1
    assert report["generation"]["num_beams"] == 5 and report["generation"]["max_length"] == 6  # the same for both
    for result in report["results"]:
        assert 0 < result["jfk"]["p50_ms"] <= result["jfk"]["p99_ms"] and result["fsdd"]["p50_ms"] > 0
        assert result["wer"] >= 0  # random weights: computed, not meaningful
    assert report["results"][0]["transcripts_equal_to_transformers"] == 1.0
    assert set(report["ratios"]) == {
        "ours p50 / transformers pipeline p50 (jfk.flac, 11 s)",
        "ours p50 / transformers pipeline p50 (FSDD clips, <1 s)",
    }
    assert json.loads((tmp_path / "benchmark.json").read_text()) == json.loads(json.dumps(report))
    assert (tmp_path / "benchmark.png").read_bytes()[:8] == PNG_MAGIC
    table = format_report(report)
    assert "jfk p50 ms" in table and "transformers pipeline" in table and "load average" in table
    with pytest.raises(ValueError, match="is timed in --mode latency"):
        run_benchmark(model=tiny_whisper, task="automatic-speech-recognition", mode="throughput")


def test_word_error_rate_after_whispers_normalizer():
    assert word_error_rate(["Zero.", " nine"], ["zero", "nine"]) == 0.0
    assert word_error_rate(["one two"], ["one"]) == 1.0  # an inserted word over one reference word
    assert word_error_rate(["Ask not what your country"], ["ask not what our country can do"]) == pytest.approx(3 / 7)
