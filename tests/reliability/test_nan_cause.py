"""A NaN loss names its cause when the batch holds it (issue 42, item 14): NaN inputs are the data's fault, and the
message said "lower the learning rate" for them."""

from __future__ import annotations

import datasets
import pytest
import torch
import torch.nn.functional as F

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments

from ..tiny_models import tiny_inputs, tiny_model
from ..tiny_models_vision_speech import tiny_inputs as vision_inputs
from ..tiny_models_vision_speech import tiny_model as vision_model


def _train(tmp_path, model, data: dict[str, torch.Tensor], **trainer_kwargs) -> None:
    args = IPUTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_train_epochs=1, report_to=[], save_strategy="no"
    )
    dataset = datasets.Dataset.from_dict({k: v.tolist() for k, v in data.items()}).with_format("torch")
    IPUTrainer(model, IPUConfig(), args, train_dataset=dataset, **trainer_kwargs).train()


def test_nan_inputs_name_the_input_not_the_learning_rate(tmp_path, reliability):
    data = vision_inputs("ConvNextForImageClassification", batch=6)
    data["pixel_values"][3, 0, 1, 1] = float("nan")
    with pytest.raises(FloatingPointError, match="at step .*'pixel_values' holds NaN or infinite values") as error:
        _train(tmp_path, vision_model("ConvNextForImageClassification"), data)
    assert "learning rate" not in str(error.value)
    reliability.bad_input(True)


def test_a_batch_of_ignored_labels_is_no_nan(tmp_path):
    """A batch whose every label is -100 weighs 0 in its step (its items over the step's): loss 0, not NaN."""
    data = tiny_inputs("BertForSequenceClassification", batch=6, seed=0)
    data["labels"][2:] = -100  # 4 of 6 rows in batches of 2: one batch at least has no label
    mean_loss = lambda outputs, labels, num_items_in_batch=None: F.cross_entropy(outputs.logits, labels)  # noqa: E731
    _train(tmp_path, tiny_model("BertForSequenceClassification"), data, compute_loss_func=mean_loss)


@pytest.mark.parametrize("call", ["evaluate", "predict"])
def test_a_set_smaller_than_one_host_call_is_refused_not_dropped(tmp_path, call, reliability):
    """With --dataloader_drop_last, 3 rows under a host call of 4 were dropped whole: `evaluate()` returned no
    metric, exit 0 (the notebooks' helper found it)."""
    args = IPUTrainingArguments(
        output_dir=str(tmp_path), per_device_eval_batch_size=4, dataloader_drop_last=True, report_to=[]
    )
    data = tiny_inputs("BertForSequenceClassification", batch=3, seed=0)
    dataset = datasets.Dataset.from_dict({k: v.tolist() for k, v in data.items()}).with_format("torch")
    trainer = IPUTrainer(tiny_model("BertForSequenceClassification"), IPUConfig(), args, eval_dataset=dataset)
    run = trainer.evaluate if call == "evaluate" else lambda: trainer.predict(dataset)
    reliability.expect_clear_error(run, ("3 samples", "--dataloader_drop_last"))
    args.dataloader_drop_last = False
    assert "eval_loss" in trainer.evaluate()


def _evaluation(tmp_path, data: dict[str, torch.Tensor], **arg_kwargs):
    args = IPUTrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to=[], **arg_kwargs)
    dataset = datasets.Dataset.from_dict({k: v.tolist() for k, v in data.items()}).with_format("torch")
    model = vision_model("ConvNextForImageClassification")
    return IPUTrainer(model, IPUConfig(), args, eval_dataset=dataset)


@pytest.mark.parametrize("call", ["evaluate", "predict"])
def test_a_nan_evaluation_loss_names_its_first_batch_and_input(tmp_path, call, reliability):
    """`run_vqa.py` with NaN region features reported eval_loss NaN beside an accuracy, exit 0 (issue 42, item 5):
    the loop's loss is an error naming the first batch whose loss was NaN and the input that holds NaN."""
    data = vision_inputs("ConvNextForImageClassification", batch=6)
    data["pixel_values"][3, 0, 1, 1] = float("nan")  # row 3: the second batch of 2
    trainer = _evaluation(tmp_path, data)
    dataset = trainer.eval_dataset
    run = trainer.evaluate if call == "evaluate" else lambda: trainer.predict(dataset)
    prefix = "eval" if call == "evaluate" else "test"
    with pytest.raises(FloatingPointError) as error:
        run()
    message = str(error.value)
    assert f"the {prefix} loss is nan, first at batch 1 of 2 samples, rows 2-3 of the set" in message, message
    assert "batch 1's inputs hold NaN or infinite values" in message and "--stop_on_nan false" in message
    reliability.bad_input("\n" not in message)


def test_a_nan_evaluation_loss_is_reported_with_stop_on_nan_false(tmp_path):
    data = vision_inputs("ConvNextForImageClassification", batch=4)
    data["pixel_values"][0] = float("inf")
    metrics = _evaluation(tmp_path, data, stop_on_nan=False).evaluate()
    assert metrics["eval_loss"] != metrics["eval_loss"]  # NaN, as asked


def test_a_finite_evaluation_is_untouched(tmp_path):
    metrics = _evaluation(tmp_path, vision_inputs("ConvNextForImageClassification", batch=4)).evaluate()
    assert metrics["eval_loss"] == metrics["eval_loss"] and metrics["eval_loss"] > 0
