"""Evaluation at sequence buckets: `trim_to_bucket` cuts only trailing padding (and labels that are ignored there),
and `IPUTrainer.evaluate` / `predict` give the numbers of a full-width run while the model really sees shorter
batches."""

from __future__ import annotations

import logging

import datasets
import numpy as np
import pytest
import torch

from optimum_ipu import IPUConfig, IPUTrainer
from optimum_ipu.runtime.inference.runner import check_sequence_buckets, trim_to_bucket

from .helpers import training_arguments
from .tiny_models import LABELS, VOCAB, tiny_model

WIDTH = 48  # default_buckets(48) == [16, 32, 48]
# three batches of 4 rows, longest 16, 30 and 44 tokens: buckets 16, 32 and 48 (the last is not cut)
LENGTHS = [5, 9, 12, 16, 20, 30, 8, 11, 40, 44, 3, 7]
FULL_WIDTH = {"sequence_buckets": [WIDTH]}  # one bucket, the width itself: nothing is cut


def right_padded(lengths: list[int], width: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(3, VOCAB, (len(lengths), width), generator=g) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


# ------------------------------------------------------------------ trim_to_bucket
def test_right_padding_is_cut_to_the_smallest_bucket_that_holds_the_longest_row():
    batch = right_padded([150, 90, 12], 384)
    batch["labels"] = torch.tensor([0, 2, 1])  # class labels: one per row, kept
    trimmed = trim_to_bucket(batch)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert trimmed[key].shape == (3, 192)  # default_buckets(384): 64, 128, 192, ...
        assert torch.equal(trimmed[key], batch[key][:, :192])
    assert trimmed["labels"] is batch["labels"]
    assert trimmed is not batch and batch["input_ids"].shape == (3, 384)  # the caller's batch is not changed


def test_configured_buckets_never_exceed_the_width():
    batch = right_padded([150, 10], 384)
    assert trim_to_bucket(batch, [100, 200, 500])["input_ids"].shape[1] == 200
    assert trim_to_bucket(right_padded([250, 10], 384), [100, 200, 500])["input_ids"].shape[1] == 384
    assert trim_to_bucket(batch, [384]) is batch  # one bucket, the width: nothing to cut
    assert trim_to_bucket(batch, [4096]) is batch
    assert trim_to_bucket(right_padded([3, 10], 384), [16, 384])["input_ids"].shape[1] == 16


def test_leading_padding_and_padding_only_rows_are_left_whole():
    left = right_padded([10, 20], 64)
    left["attention_mask"] = left["attention_mask"].flip(1)  # left padding: the last column is real
    assert trim_to_bucket(left) is left
    empty = right_padded([10, 0], 64)  # a row without a token: its output depends on the width
    assert trim_to_bucket(empty) is empty


def test_token_labels_are_cut_only_where_they_are_ignored():
    batch = right_padded([10, 20], 64)
    labels = torch.randint(0, LABELS, (2, 64))
    batch["labels"] = labels.masked_fill(batch["attention_mask"] == 0, -100)
    trimmed = trim_to_bucket(batch)
    assert trimmed["labels"].shape == (2, 32) and torch.equal(trimmed["labels"], batch["labels"][:, :32])
    batch["labels"] = labels  # labels where the padding is: cutting them would change the loss
    assert trim_to_bucket(batch) is batch


def test_other_widths_one_dimensional_keys_and_non_token_inputs_are_kept():
    batch = right_padded([10, 20], 64)
    batch["labels"] = torch.randint(0, VOCAB, (2, 7))  # a decoder's labels
    batch["decoder_input_ids"] = torch.randint(0, VOCAB, (2, 7))
    trimmed = trim_to_bucket(batch)
    assert trimmed["input_ids"].shape[1] == 32
    assert trimmed["labels"] is batch["labels"] and trimmed["decoder_input_ids"] is batch["decoder_input_ids"]
    pixels = {"pixel_values": torch.randn(2, 3, 16, 16), "labels": torch.tensor([0, 1])}
    assert trim_to_bucket(pixels) is pixels
    features = {"input_features": torch.randn(2, 80, 64)}
    assert trim_to_bucket(features) is features
    choices = {"input_ids": torch.ones(2, 3, 64, dtype=torch.long), "attention_mask": torch.ones(2, 3, 64)}
    assert trim_to_bucket(choices) is choices  # a 3-D mask (multiple choice): left whole


def test_span_labels_keep_the_width():
    batch = right_padded([10, 20], 64)
    batch["start_positions"], batch["end_positions"] = torch.tensor([1, 2]), torch.tensor([3, 4])
    assert trim_to_bucket(batch) is batch  # the span loss is a softmax over every column


def test_malformed_buckets_are_named():
    assert check_sequence_buckets([384, 128, 128]) == [128, 384]
    for bad in ("128", [], [0, 128], [1.5], list(range(16, 400, 16))):
        with pytest.raises(ValueError, match=r"^buckets: "):
            check_sequence_buckets(bad)


def test_the_trainer_names_a_malformed_field(tmp_path):
    config = IPUConfig(inference_parallelize_kwargs={"sequence_buckets": [0, 64]})
    with pytest.raises(ValueError, match=r"inference_parallelize_kwargs\.sequence_buckets: got \[0, 64\]"):
        IPUTrainer(tiny_model("BertForQuestionAnswering"), config, training_arguments(tmp_path))


# ------------------------------------------------------------------ IPUTrainer: same numbers, shorter batches
def seen_widths(model: torch.nn.Module) -> list[int]:
    """The sequence width of every forward of `model` from now on."""
    widths: list[int] = []

    def hook(module, args, kwargs):
        widths.append(kwargs["input_ids"].shape[1])

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return widths


def evaluated(tmp_path, class_name: str, data: datasets.Dataset, parallelize_kwargs: dict | None, evaluate: bool):
    model = tiny_model(class_name)
    widths = seen_widths(model)
    config = IPUConfig(inference_parallelize_kwargs=parallelize_kwargs)
    args = training_arguments(tmp_path, per_device_eval_batch_size=4)
    trainer = IPUTrainer(model, config, args)
    result = trainer.evaluate(data) if evaluate else trainer.predict(data)
    return result, widths


def real_positions(predictions: np.ndarray) -> np.ndarray:
    mask = right_padded(LENGTHS, WIDTH)["attention_mask"].bool().numpy()
    return predictions[:, :WIDTH][mask]


def test_question_answering_predictions_at_buckets_equal_full_width(tmp_path, caplog):
    data = datasets.Dataset.from_dict({k: v.tolist() for k, v in right_padded(LENGTHS, WIDTH).items()})
    with caplog.at_level(logging.INFO, logger="optimum_ipu.trainer.trainer"):
        bucketed, widths = evaluated(tmp_path / "a", "BertForQuestionAnswering", data, None, evaluate=False)
    full, full_widths = evaluated(tmp_path / "b", "BertForQuestionAnswering", data, FULL_WIDTH, evaluate=False)
    assert widths == [16, 32, 48] and full_widths == [WIDTH] * 3
    assert caplog.text.count("each batch runs at the smallest sequence bucket") == 1
    assert "[16, 32, 48] for 48 columns" in caplog.text
    for ours, reference in zip(bucketed.predictions, full.predictions, strict=True):  # start and end logits
        assert ours.shape == reference.shape == (len(LENGTHS), WIDTH)  # padded with -100 across batches
        np.testing.assert_allclose(real_positions(ours), real_positions(reference), atol=1e-4, rtol=0)
    assert (bucketed.predictions[0][:4, 16:] == -100).all()  # the first batch ran 16 wide


def test_question_answering_loss_keeps_the_full_width(tmp_path):
    columns = {k: v.tolist() for k, v in right_padded(LENGTHS, WIDTH).items()}
    columns["start_positions"] = [n // 3 for n in LENGTHS]
    columns["end_positions"] = [n // 2 for n in LENGTHS]
    data = datasets.Dataset.from_dict(columns)
    bucketed, widths = evaluated(tmp_path / "a", "BertForQuestionAnswering", data, None, evaluate=True)
    full, _ = evaluated(tmp_path / "b", "BertForQuestionAnswering", data, FULL_WIDTH, evaluate=True)
    assert widths == [WIDTH] * 3  # a softmax over every position: cutting columns would change the loss
    assert bucketed["eval_loss"] == pytest.approx(full["eval_loss"], abs=1e-5)


def test_token_classification_loss_and_predictions_at_buckets_equal_full_width(tmp_path):
    columns = right_padded(LENGTHS, WIDTH)
    labels = torch.randint(0, LABELS, (len(LENGTHS), WIDTH), generator=torch.Generator().manual_seed(1))
    columns["labels"] = labels.masked_fill(columns["attention_mask"] == 0, -100)
    data = datasets.Dataset.from_dict({k: v.tolist() for k, v in columns.items()})
    bucketed, widths = evaluated(tmp_path / "a", "BertForTokenClassification", data, None, evaluate=False)
    full, full_widths = evaluated(tmp_path / "b", "BertForTokenClassification", data, FULL_WIDTH, evaluate=False)
    assert widths == [16, 32, 48] and full_widths == [WIDTH] * 3
    assert bucketed.metrics["test_loss"] == pytest.approx(full.metrics["test_loss"], abs=1e-5)
    np.testing.assert_allclose(real_positions(bucketed.predictions), real_positions(full.predictions), atol=1e-4)
    np.testing.assert_array_equal(bucketed.label_ids, full.label_ids)  # cut labels were -100, padded back with it
    configured, configured_widths = evaluated(
        tmp_path / "c", "BertForTokenClassification", data, {"sequence_buckets": [24, 64]}, evaluate=True
    )
    assert configured_widths == [24, 48, 48]  # the configured buckets below the width, then the width
    assert configured["eval_loss"] == pytest.approx(full.metrics["test_loss"], abs=1e-5)
