"""Optimum Graphcore's inference notebooks built on `pipelines.pipeline`, run cell by cell after the one changed
import (`tests/notebooks/runner.py`), their downloads served by tiny stand-ins."""

from __future__ import annotations


def test_sentiment_analysis(run_notebook):
    summary, printed = run_notebook("sentiment_analysis.ipynb")
    # a gc-monitor cell and three detaching ones not run; the pip cell is magics only (the %%timeit cells run once)
    assert (summary["not_applicable"], summary["shell_only"]) == (4, 1), summary
    assert "'label': 'POSITIVE'" in printed or "'label': 'NEGATIVE'" in printed  # the first pipeline's answers


def test_managing_ipu_resources(run_notebook):
    summary, printed = run_notebook("managing_ipu_resources.ipynb")
    # 9 gc-monitor cells and 1 detaching not run; its %%timeit / %%time cells run once
    assert (summary["ran"], summary["not_applicable"]) == (9, 10), summary
    assert printed.count("'label': ") >= 4  # the two pipelines' answers
