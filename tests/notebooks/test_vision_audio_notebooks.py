"""Optimum Graphcore's vision and audio notebooks (image and audio classification, Whisper and Wav2Vec2
fine-tuning), run cell by cell after the one changed import (`tests/notebooks/runner.py`): tiny stand-ins under the
notebooks' Hub ids (with their image processor or feature extractor), FSDD's spoken digits and UCI's handwritten
digits of ../shared/data in place of the Hub's data sets, a few optimizer steps."""

from __future__ import annotations

from .test_seq2seq_notebooks import logged


def test_audio_classification(run_notebook):
    summary, printed = run_notebook("audio_classification.ipynb")
    assert summary["not_applicable"] == 2, summary  # notebook_login(), the push cell
    assert logged(printed, "train_loss"), printed[-3000:]
    assert 0.0 <= logged(printed, "eval_accuracy")[-1] <= 1.0, printed[-3000:]


def test_whisper_finetuning(run_notebook):
    summary, printed = run_notebook("whisper_finetuning.ipynb")
    assert summary["ran"] == summary["cells"], summary
    assert len(logged(printed, "eval_wer")) >= 2, printed[-3000:]  # evaluated before training and at its step
    assert logged(printed, "train_loss"), printed[-3000:]


def test_wav2vec2_fine_tuning(run_notebook):
    summary, printed = run_notebook("wav2vec2/wav2vec2-fine-tuning-checkpoint.ipynb")
    assert summary["ran"] + summary["shell_only"] == summary["cells"], summary
    assert logged(printed, "eval_wer") and logged(printed, "train_loss"), printed[-3000:]
    assert "'[UNK]': 16, '[PAD]': 17}" in printed  # the character vocabulary built from the digits' words
