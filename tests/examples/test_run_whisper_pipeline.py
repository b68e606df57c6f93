"""`examples/speech-recognition/run_whisper_pipeline.py`, Optimum Graphcore's Whisper pipeline script with its flags:
OpenAI's Whisper tiny.en transcribes the 11 s JFK clip word for word (beam search, KV cache), the IPU-only knobs are
named once, and a path that is neither a file nor a URL is one line, exit 2."""

from __future__ import annotations

import jiwer

from ..conftest import REPO_ROOT
from ..helpers import run_example

FOLDER = REPO_ROOT / "examples" / "speech-recognition"
TRANSCRIPT = (
    "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
)


def _words(text: str) -> str:
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c.isspace()).split())


def test_whisper_pipeline_script_transcribes_the_clip(shared_data):
    clip = shared_data / "fixtures" / "audio" / "jfk.flac"
    model = shared_data.parent / "models" / "whisper-tiny.en"
    flags = ["--model", str(model), "--use-cache", "--num-beams", "2", "--on-device-generation-steps", "16"]
    run = run_example(FOLDER, "run_whisper_pipeline.py", str(clip), *flags, "--time-it")
    assert run.returncode == 0, run.stderr[-3000:]
    printed = run.stdout.strip().splitlines()[-1]
    assert printed.startswith("'") and printed.endswith("'")
    assert jiwer.wer(_words(TRANSCRIPT), _words(printed[1:-1])) == 0.0
    assert run.stderr.count("'on_device_generation_steps' has no effect") == 1
    assert "Transcription performed in" in run.stderr
    missing = run_example(FOLDER, "run_whisper_pipeline.py", "no-such.flac", "--model", str(model))
    assert missing.returncode == 2
    assert "input_file: 'no-such.flac' is neither a file nor an http(s) URL" in missing.stderr.strip().splitlines()[-1]
