"""A run asked to train never ends with exit 0 having trained nothing (issue 42, item 4): no epochs, and LoRA
adapters that cannot move (alpha 0, dropout 1), are refused in one line; a rank no layer has is refused before
anything is allocated (item 9)."""

from __future__ import annotations

import math

import pytest
from example_utils.peft import PeftArguments, maybe_wrap_with_lora
from transformers import HfArgumentParser

from optimum_ipu import IPUTrainingArguments

from ..tiny_models import tiny_model


@pytest.mark.parametrize("epochs", [0, -1, 0.0, math.inf, math.nan])
def test_training_with_no_epochs_is_refused(epochs, tmp_path):
    with pytest.raises(ValueError, match="--num_train_epochs: got") as error:
        IPUTrainingArguments(output_dir=str(tmp_path), do_train=True, num_train_epochs=epochs, report_to=[])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("name", "value"), [("learning_rate", 1e309), ("learning_rate", math.nan), ("weight_decay", -1.0)]
)
def test_optimizer_numbers_must_be_finite(name, value, tmp_path):
    with pytest.raises(ValueError, match=f"--{name}: got"):
        IPUTrainingArguments(output_dir=str(tmp_path), **{name: value}, report_to=[])


def test_max_steps_or_evaluation_alone_need_no_epochs(tmp_path):
    IPUTrainingArguments(output_dir=str(tmp_path), do_train=True, num_train_epochs=0, max_steps=3, report_to=[])
    IPUTrainingArguments(output_dir=str(tmp_path), do_eval=True, num_train_epochs=0, report_to=[])


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--lora_alpha", "0"], "--lora_alpha: got 0"),
        (["--lora_alpha", "-4"], "--lora_alpha: got -4"),
        (["--lora_dropout", "1.0"], "--lora_dropout: got 1.0"),
        (["--lora_dropout", "-0.1"], "--lora_dropout: got -0.1"),
        (["--lora_r", "0"], "--lora_r: got 0"),
    ],
)
def test_adapters_that_cannot_train_are_refused(flags, named):
    with pytest.raises(ValueError, match=named):
        HfArgumentParser(PeftArguments).parse_args_into_dataclasses(["--use_peft", *flags])
    HfArgumentParser(PeftArguments).parse_args_into_dataclasses(flags)  # without --use_peft: not read


def test_a_rank_above_every_layer_is_refused_before_allocating():
    pytest.importorskip("peft")
    model = tiny_model("BertForSequenceClassification")  # hidden 32, intermediate 37: rank 32 at most
    with pytest.raises(ValueError, match=r"--lora_r: got 100000000; .* rank 32 at most"):
        maybe_wrap_with_lora(model, PeftArguments(use_peft=True, lora_r=10**8), task_type="SEQ_CLS")
    wrapped = maybe_wrap_with_lora(model, PeftArguments(use_peft=True, lora_r=32), task_type="SEQ_CLS")
    assert any("lora_A" in name for name, _ in wrapped.named_parameters())
