"""Optimum Graphcore's packed-BERT notebooks are not run here (`registry.py` says why): each imports modules of its
own notebooks folder (its packed dataset creator, a forked packed BERT on poptorch and its packed inference
pipelines), which are no part of `optimum.graphcore` and are not vendored. These tests keep that reason true (the day
the notebooks' imports change, they fail), and that what they do is here: `optimum_ipu.packing`'s training and
inference (`tests/test_packing*.py` test them against unpacked runs)."""

from __future__ import annotations

import pytest

import optimum_ipu.packing
from tests.notebooks.registry import BY_PATH, NOT_RUN
from tests.notebooks.runner import ONE_IMPORT_CHANGE, code_cells

from .registry import NOTEBOOKS_DIR

PACKED = {
    "packed_bert/packedBERT_single_label_text_classification.ipynb": "PackedBertTextClassificationPipeline",
    "packed_bert/packedBERT_multi_label_text_classification.ipynb": "PackedBertTextClassificationPipeline",
    "packed_bert/packedBERT_question_answering.ipynb": "PackedBertQuestionAnsweringPipeline",
}
FOLDER_MODULES = ("utils.packing.dataset_creator", "models.modeling_bert_packed", "pipeline.packed_bert")


@pytest.mark.parametrize("path", sorted(PACKED))
def test_packed_bert_notebook_needs_its_folder_modules(path):
    assert BY_PATH[path].status == NOT_RUN
    source = "\n".join(cell.replace(*ONE_IMPORT_CHANGE) for cell in code_cells(NOTEBOOKS_DIR / path))
    for module in FOLDER_MODULES:
        assert f"from {module} import" in source, module
    assert f"from pipeline.packed_bert import {PACKED[path]}" in source
    assert not (NOTEBOOKS_DIR / "packed_bert" / "pipeline").exists()
    # what their folder's modules do is here: packing for training and for inference
    for name in ("prepare_packed_training", "predict_packed_classification", "predict_packed_question_answering"):
        assert name in optimum_ipu.packing.__all__, name
