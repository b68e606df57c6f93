"""A training set whose every label is -100 (ignored by the loss) trained with loss 0.0 and exited 0 having learned
nothing; it is refused before the first step, in one line naming the data and its label column (issue 28, item 5).
A set with some used labels among many ignored ones trains."""

from __future__ import annotations

import datasets
import pytest
import torch

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.trainer.label_check import check_some_label_used

from ..tiny_models import tiny_inputs, tiny_model

CLASS = "BertForTokenClassification"


def token_data(rows: int, used: int) -> datasets.Dataset:
    """`rows` rows of tiny token-classification inputs whose labels are all -100 but `used` of them."""
    data = {k: v.tolist() for k, v in tiny_inputs(CLASS, batch=rows, seed=0).items()}
    labels = torch.full((rows, len(data["input_ids"][0])), -100)
    labels.view(-1)[: used * 7 : 7] = 1
    data["labels"] = labels.tolist()
    return datasets.Dataset.from_dict(data)


def trainer(tmp_path, train: datasets.Dataset) -> IPUTrainer:
    args = IPUTrainingArguments(output_dir=str(tmp_path), report_to=[], per_device_train_batch_size=2, max_steps=1)
    return IPUTrainer(tiny_model(CLASS), IPUConfig(), args, train_dataset=train)


def test_every_label_ignored_is_refused_before_training(tmp_path, reliability):
    run = trainer(tmp_path, token_data(4, used=0))
    reliability.expect_clear_error(run.train, ("every label of the training data", "'labels'", "-100", "--doc_stride"))
    assert run.state.global_step == 0


@pytest.mark.parametrize(
    ("column", "values"), [("label", [-100] * 5), ("labels", [[[-100, -100]], [[-100]]]), ("labels", [-100.0] * 3)]
)
def test_every_shape_of_label_column_is_read(reliability, column, values):
    data = datasets.Dataset.from_dict({column: values})
    reliability.expect_clear_error(lambda: check_some_label_used(data), (f"{column!r}", f"{len(values)} rows"))
    selected = datasets.Dataset.from_dict({column: [1, *[-100] * 4]}).select([1, 2])  # the rows kept count
    reliability.expect_clear_error(lambda: check_some_label_used(selected), "2 rows")


def test_a_run_with_some_used_labels_trains(tmp_path, monkeypatch):
    monkeypatch.setattr("optimum_ipu.trainer.label_check.CHUNK_ROWS", 2)  # the used label is in a later chunk
    data = token_data(4, used=1).select([1, 2, 3, 0])
    check_some_label_used(data)
    check_some_label_used(datasets.Dataset.from_dict({"label": [-100, 0]}))
    check_some_label_used(datasets.Dataset.from_dict({"labels": ["a", "b"]}))  # not numbers: not read
    assert trainer(tmp_path, token_data(4, used=1)).train().global_step == 1
