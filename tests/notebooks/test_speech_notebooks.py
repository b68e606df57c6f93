"""Optimum Graphcore's speech notebooks, run cell by cell after the one changed import, with OpenAI's Whisper
tiny.en (`../shared/models`) under its Hub id and real recordings in place of LibriSpeech's dummy split."""

from __future__ import annotations

import jiwer
import pytest

# Whisper tiny.en's text of the clip (transformers' own pipeline gives it too: tests/test_optimum_graphcore_whisper.py)
SAID = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."


def test_whisper_example(run_notebook):
    summary, printed = run_notebook("whisper-example.ipynb")
    assert f"Transcribed:  {SAID}" in printed, printed[-2000:]  # the notebook's sample, its row 2
    assert summary["ran"] == summary["cells"] and summary["stand_ins"] == 1, summary
    assert "Using whisper-tiny config with the checkpoint 'openai/whisper-tiny.en'." in printed


def test_whisper_quantized_example(run_notebook):
    pytest.importorskip("torchao")
    summary, printed = run_notebook("whisper-quantized-example.ipynb")
    said = printed.split("Transcribed: ", 1)[1].splitlines()[0].strip()
    assert jiwer.wer(SAID.lower(), said.lower()) <= 0.1, said  # int8 weights: the clip's words, or nearly
    assert summary["ran"] == summary["cells"] - summary["shell_only"], summary  # its SDK check only warns
