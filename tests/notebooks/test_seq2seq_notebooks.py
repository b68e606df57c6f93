"""Optimum Graphcore's sequence-to-sequence notebooks (summarization, translation, mT5, Flan-T5), run cell by cell
after the one changed import (`tests/notebooks/runner.py`): tiny T5 / BART / mT5 stand-ins under the notebooks'
Hub ids, WMT16 en-ro of ../shared/data and XSum's fixture rows, a few optimizer steps."""

from __future__ import annotations

import re


def logged(printed: str, key: str) -> list[float]:
    """The values of `key` in the trainer's logged dicts (`{'loss': 1.2, ...}`) the run printed."""
    return [float(v) for v in re.findall(rf"'{key}': '?([0-9.eE+-]+|nan)'?", printed)]


def test_summarization(run_notebook):
    summary, printed = run_notebook("summarization.ipynb")
    assert summary["not_applicable"] == 1, summary  # notebook_login()
    assert logged(printed, "eval_rouge1") and logged(printed, "eval_gen_len"), printed[-3000:]
    assert logged(printed, "train_loss"), printed[-3000:]


def test_translation(run_notebook):
    summary, printed = run_notebook("translation.ipynb")
    assert summary["not_applicable"] == 1, summary
    assert logged(printed, "eval_bleu") and logged(printed, "train_loss"), printed[-3000:]


def test_mt5_translation(run_notebook):
    summary, printed = run_notebook("mt5_translation.ipynb")
    assert summary["not_applicable"] == 1, summary
    assert logged(printed, "eval_bleu") and logged(printed, "train_loss"), printed[-3000:]


def test_flan_t5_inference(run_notebook):
    summary, printed = run_notebook("flan_t5_inference.ipynb")
    assert summary["not_applicable"] == 1, summary  # detachFromDevice()
    assert printed.count("{'generated_text': ") >= 4, printed[-3000:]  # the four questions' answers
    assert "[Customer]: Where is Graphcore located?" in printed and "Ending session" in printed, printed[-3000:]


def test_text_summarization(run_notebook):
    summary, printed = run_notebook("text_summarization.ipynb")
    assert summary["not_applicable"] == 1, summary  # detachFromDevice()
    assert printed.count("'summary_text': ") == 4, printed[-3000:]  # the four texts summarized
