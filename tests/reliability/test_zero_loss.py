"""A run whose training loss is exactly 0 from its first step learns nothing and exits 0: it is said once, in a
warning naming the steps (issue 28, item 5); a run whose loss is not 0 in one of its first steps, or turns 0 only
later, trains without a word."""

from __future__ import annotations

import logging
import random

import pytest

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.trainer.label_check import WATCH_STEPS

from ..helpers import SHORT_RUN, TRAINER_CLASS, classification_dataset
from ..tiny_models import tiny_model

SAID = "the training loss is exactly 0"


class StepLoss:
    """The model's loss, made exactly 0 in the optimizer steps of `zero` (counted by micro-batches)."""

    def __init__(self, zero: set[int], accumulation: int) -> None:
        self.zero, self.accumulation, self.calls = zero, accumulation, 0

    def __call__(self, outputs, labels, num_items_in_batch=None):
        import torch

        step = self.calls // self.accumulation
        self.calls += 1
        loss = torch.nn.functional.cross_entropy(outputs.logits, labels)
        return loss * 0 if step in self.zero else loss


def _train(tmp_path, zero: set[int], steps: int, accumulation: int, caplog) -> list[str]:
    options = {**SHORT_RUN, "per_device_train_batch_size": 2, "max_steps": steps}
    args = IPUTrainingArguments(str(tmp_path), **options)
    config = IPUConfig(gradient_accumulation_steps=accumulation)
    run = IPUTrainer(
        tiny_model(TRAINER_CLASS),
        config,
        args,
        train_dataset=classification_dataset(2 * accumulation * steps),
        compute_loss_func=StepLoss(zero, accumulation),
    )
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        run.train()
    assert run.state.global_step == steps
    return [r.getMessage() for r in caplog.records if SAID in r.getMessage()]


@pytest.mark.parametrize("seed", range(3))
def test_a_loss_of_zero_from_the_start_is_said_once(tmp_path, caplog, reliability, seed):
    rng = random.Random(seed)
    steps, accumulation = rng.randint(1, WATCH_STEPS + 2), rng.randint(1, 2)
    said = _train(tmp_path, set(range(steps)), steps, accumulation, caplog)
    reliability.bad_input(len(said) == 1)
    watched = min(steps, WATCH_STEPS)
    assert len(said) == 1 and f"first {watched} optimizer step" in said[0] and "\n" not in said[0], said


@pytest.mark.parametrize("seed", range(2))
def test_a_loss_not_zero_in_one_of_the_first_steps_is_not_said(tmp_path, caplog, seed):
    rng = random.Random(seed)
    steps = WATCH_STEPS + 1
    nonzero = rng.randrange(WATCH_STEPS)  # one of the watched steps has a loss; the others and later ones are 0
    zero = set(range(steps)) - {nonzero}
    assert _train(tmp_path, zero, steps, rng.randint(1, 2), caplog) == []
