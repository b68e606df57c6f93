"""One training step: `IPUTrainer` runs the engine's micro-batch and optimizer steps, weighted by `num_items_in_batch`
as `transformers.Trainer` weighs a token-level loss under gradient accumulation with uneven padding."""

from __future__ import annotations

from unittest import mock

import datasets
import pytest
import torch
import transformers

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.runtime.engine import Engine

from .helpers import SHORT_RUN
from .tiny_models import VOCAB, tiny_model

CAUSAL = "GPT2LMHeadModel"
COMMON = {**SHORT_RUN, "num_train_epochs": 2, "max_grad_norm": 1.0}


def unevenly_padded(rows: int = 32, seq: int = 12, seed: int = 0) -> datasets.Dataset:
    """Causal LM rows of 2 to `seq` real tokens, right-padded; padding is -100 in the labels."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, seq + 1, (rows,), generator=generator)
    ids = torch.randint(1, VOCAB, (rows, seq), generator=generator)
    mask = (torch.arange(seq) < lengths[:, None]).long()
    ids = ids * mask  # pad id 0
    labels = ids.masked_fill(mask == 0, -100)
    return datasets.Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "labels": labels.tolist()}
    )


def losses(trainer: transformers.Trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def assert_same_training(a: transformers.Trainer, b: transformers.Trainer, steps: int) -> None:
    assert a.state.global_step == b.state.global_step == steps
    torch.testing.assert_close(losses(a), losses(b), atol=1e-5, rtol=0)
    reference = b.model.state_dict()
    for key, value in a.model.state_dict().items():
        torch.testing.assert_close(value, reference[key], atol=1e-5, rtol=0, msg=key)


def causal_lm(loss_type: str | None = None) -> transformers.PreTrainedModel:
    model = tiny_model(CAUSAL)
    # GPT-2's head is not named "...ForCausalLM": transformers leaves its loss_type unset, and then Trainer counts
    # position 0 of every row as an item of `num_items_in_batch`, one the shifted loss never predicts.
    model.loss_type = loss_type
    return model


def ipu_trainer(out, accumulation: int, batch: int, data: datasets.Dataset, loss_type: str | None = None):
    args = IPUTrainingArguments(str(out), per_device_train_batch_size=batch, **COMMON)
    config = IPUConfig(gradient_accumulation_steps=accumulation)
    return IPUTrainer(causal_lm(loss_type), config, args, train_dataset=data)


@pytest.mark.parametrize("loss_type", [None, "ForCausalLM"])
def test_token_loss_under_accumulation_equals_transformers_trainer(tmp_path, loss_type):
    """Trainer's count of items is ours too. With GPT-2's unset loss_type, Trainer alone counts position 0 of every
    row (an item the shifted loss never predicts, scaling the loss by shifted / unshifted tokens); IPUTrainer counts the
    shifted labels, as Trainer does for a loss_type it reads as causal (transformers#46204), and as evaluation through
    stages on processes counts them: the reference is given that count (its own, for GPT-2, checked to be the other)."""
    data = unevenly_padded()
    tokens = (torch.tensor(data["labels"])[:, 1:] != -100).sum(1)
    assert tokens.min() < tokens.max() // 3  # uneven: a mean of micro-batch means would weigh tokens wrongly
    ours = ipu_trainer(tmp_path / "ours", accumulation=4, batch=2, data=data, loss_type=loss_type)
    stock_args = transformers.TrainingArguments(
        str(tmp_path / "stock"), per_device_train_batch_size=2, gradient_accumulation_steps=4, **COMMON
    )
    stock = transformers.Trainer(causal_lm(loss_type), stock_args, train_dataset=data)
    counted_unshifted = not stock._loss_shifts_labels
    stock._loss_shifts_labels = True
    ours.train()
    stock.train()
    assert_same_training(ours, stock, steps=8)
    assert counted_unshifted == (loss_type is None)
    grad_norms = [[e["grad_norm"] for e in t.state.log_history if "grad_norm" in e] for t in (ours, stock)]
    torch.testing.assert_close(grad_norms[0], grad_norms[1], atol=1e-5, rtol=1e-5)


def test_accumulated_token_loss_equals_one_big_batch(tmp_path):
    """The step's loss is its token mean however the step is cut into micro-batches."""
    data = unevenly_padded(seed=1)
    accumulated = ipu_trainer(tmp_path / "a", accumulation=4, batch=2, data=data, loss_type="ForCausalLM")
    big = ipu_trainer(tmp_path / "b", accumulation=1, batch=8, data=data, loss_type="ForCausalLM")
    accumulated.train()
    big.train()
    assert_same_training(accumulated, big, steps=8)


def test_trainer_runs_the_engine_step(tmp_path):
    """`Trainer`'s loop drives the engine's step protocol (micro_batch, finish_step), nothing of its own."""
    trainer = ipu_trainer(tmp_path, accumulation=4, batch=2, data=unevenly_padded(rows=16), loss_type="ForCausalLM")
    with (
        mock.patch.object(Engine, "micro_batch", autospec=True, side_effect=Engine.micro_batch) as micro,
        mock.patch.object(Engine, "finish_step", autospec=True, side_effect=Engine.finish_step) as prep,
        mock.patch.object(transformers.Trainer, "_clip_grad_norm") as stock_clip,
    ):
        trainer.train()
    assert trainer.state.global_step == 4 and micro.call_count == 16 and prep.call_count == 4
    assert stock_clip.call_count == 0
    weights = [call.args[2] for call in micro.call_args_list]
    assert all(isinstance(w, torch.Tensor) for w in weights)  # token shares, not 1 / accumulation
    torch.testing.assert_close(torch.stack(weights).view(4, 4).sum(1), torch.ones(4))


def test_micro_batch_without_labelled_tokens_adds_nothing():
    """0 labelled tokens: the model's mean loss is 0/0 = NaN, yet the micro-batch adds 0, and 0 gradients."""
    model = causal_lm()
    engine = Engine(model, IPUConfig())
    ids = torch.randint(1, VOCAB, (2, 6))
    unlabelled = model(input_ids=ids, labels=torch.full_like(ids, -100)).loss
    assert unlabelled.isnan()
    loss = engine.micro_batch({"input_ids": ids, "labels": torch.full_like(ids, -100)}, torch.tensor(0) / 5)
    assert loss == 0
    assert all(p.grad is None or (p.grad == 0).all() for p in model.parameters())
