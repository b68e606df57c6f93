"""A training set whose every label is -100 (ignored by the loss) trained with loss 0.0 and exited 0 having learned
nothing; it is refused before the first step, in one line naming the data and its label column (issue 28, item 5).
A set with some used labels among many ignored ones trains."""

from __future__ import annotations

import datasets
import pytest
import torch

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.trainer.label_check import check_some_label_used

from ..conftest import REPO_ROOT
from ..tiny_models import tiny_inputs, tiny_model
from .test_script_errors import load_script, one_clear_line, run_main

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
    assert check_some_label_used(datasets.Dataset.from_dict({"labels": [[-100, 3]]}))
    assert trainer(tmp_path, token_data(4, used=1)).train().global_step == 1  # its one step may have no label


def on_the_fly(data: datasets.Dataset) -> datasets.Dataset:
    """`data` prepared by a transform (as the speech and vision scripts do): its columns cannot be read ahead."""
    data.set_transform(lambda batch: {key: torch.tensor(value) for key, value in batch.items()})
    return data


def test_data_prepared_on_the_fly_is_refused_after_its_first_steps(tmp_path, monkeypatch, reliability):
    monkeypatch.setattr("optimum_ipu.trainer.label_check.WATCH_STEPS", 2)
    run = trainer(tmp_path, on_the_fly(token_data(4, used=0)))
    run.args.max_steps = 3
    reliability.expect_clear_error(run.train, ("every label of the training data", "first 2 optimizer steps"))
    assert run.state.global_step == 1  # stopped at the end of the second step, before the third


def test_a_short_run_on_the_fly_is_warned_not_refused(tmp_path, caplog):
    run = trainer(tmp_path, on_the_fly(token_data(4, used=0)))
    with caplog.at_level("WARNING", logger="optimum_ipu.trainer.label_check"):
        assert run.train().global_step == 1
    assert "every label of the 1 optimizer steps" in caplog.text


def test_data_prepared_on_the_fly_with_a_used_label_trains(tmp_path, monkeypatch):
    monkeypatch.setattr("optimum_ipu.trainer.label_check.WATCH_STEPS", 2)  # one epoch: the used label is seen
    run = trainer(tmp_path, on_the_fly(token_data(4, used=1)))
    run.args.max_steps = 2
    assert run.train().global_step == 2


def test_run_ner_whose_windows_hold_no_word_ends_in_one_line(tmp_path, shared_data, tiny_pretrained, reliability):
    """--max_seq_length 2 keeps [CLS] and [SEP] only: every token label is -100."""
    run_ner = load_script(REPO_ROOT / "examples" / "token-classification", "run_ner")
    sample = str(shared_data / "fixtures" / "conll" / "sample.json")
    argv = ["--model_name_or_path", str(tiny_pretrained("BertForTokenClassification")), "--ignore_mismatched_sizes"]
    argv += ["--train_file", sample, "--text_column_name", "words", "--label_column_name", "ner", "--do_train"]
    argv += ["--max_seq_length", "2", "--output_dir", str(tmp_path / "out"), "--report_to", "none"]
    code, stderr = run_main(run_ner, argv)
    one_clear_line(reliability, code, stderr, ("every label of the training data", "'labels'", "--max_seq_length"))
