"""What a NaN or infinite loss is blamed on, in training and in evaluation.

A NaN loss whose inputs hold NaN is the data's fault, not the learning rate's: the message names the input. An
evaluation whose loss is NaN would report `eval_loss` NaN beside a plausible accuracy with exit code 0, so it is an
error naming the first batch whose loss was not finite (and that batch's NaN input, if any), unless
`--stop_on_nan false` asks to go on. The evaluation's batches are watched without a host sync per batch: the first
bad batch's index stays a device tensor until the loop ends.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def nonfinite_inputs(inputs: dict[str, Any]) -> str | None:
    """The name of the first floating input of a batch that holds NaN or infinite values; None when none does."""
    for name, value in inputs.items():
        if torch.is_tensor(value) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return name
    return None


def nonfinite_cause(inputs: dict[str, Any]) -> str | None:
    """What in a micro-batch makes its loss NaN whatever the learning rate, in words; None when nothing does."""
    name = nonfinite_inputs(inputs)
    if name is None:
        return None
    return f"the batch's {name!r} holds NaN or infinite values: check the data where it is read"


class EvalLossWatch:
    """The first evaluation batch whose loss is NaN or infinite, and the first whose floating inputs are.

    `start()` at the loop's start, `see(loss, inputs)` per batch (device tensors only, no sync), `check(metrics,
    ...)` at the end: it raises when the reported loss is not finite. The reported loss (gathered, the same on every
    process) decides, so every process raises together; the batch indices are this process's.
    """

    def __init__(self) -> None:
        self.batches = 0
        self.first_bad_loss: torch.Tensor | None = None
        self.first_bad_inputs: torch.Tensor | None = None

    def start(self) -> None:
        self.batches, self.first_bad_loss, self.first_bad_inputs = 0, None, None

    def see(self, loss: torch.Tensor | None, inputs: dict[str, Any]) -> None:
        if loss is not None:
            index = torch.tensor(self.batches, device=loss.device)
            self.first_bad_loss = _first(self.first_bad_loss, ~torch.isfinite(loss.detach()).all(), index)
            floats = [v for v in inputs.values() if torch.is_tensor(v) and v.is_floating_point()]
            if floats:
                bad = torch.stack([~torch.isfinite(v).all() for v in floats]).any().to(loss.device)
                self.first_bad_inputs = _first(self.first_bad_inputs, bad, index)
        self.batches += 1

    def check(self, metrics: dict[str, Any], prefix: str, batch_size: int, one_process: bool) -> None:
        """Raises `FloatingPointError` when `metrics[f"{prefix}_loss"]` is NaN or infinite."""
        loss = metrics.get(f"{prefix}_loss")
        if not isinstance(loss, float) or math.isfinite(loss):
            return
        where = ""
        first = -1 if self.first_bad_loss is None else int(self.first_bad_loss)
        if first >= 0:
            rows = f", rows {first * batch_size}-{(first + 1) * batch_size - 1} of the set" if one_process else ""
            where = f", first at batch {first} of {batch_size} samples{rows}"
        bad_inputs = -1 if self.first_bad_inputs is None else int(self.first_bad_inputs)
        if bad_inputs >= 0:
            fix = f"batch {bad_inputs}'s inputs hold NaN or infinite values: check the data where it is read"
        else:
            fix = "the inputs are finite: the model's weights or the precision (try fp32) give it"
        raise FloatingPointError(
            f"the {prefix} loss is {loss}{where}; {fix}, or pass --stop_on_nan false to report it as it is"
        )


def _first(current: torch.Tensor | None, bad: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`index` where nothing was recorded yet (-1) and `bad` holds, else what was recorded: on the device."""
    if current is None:
        current = torch.full((), -1, dtype=torch.long, device=index.device)
    return torch.where((current < 0) & bad.to(index.device), index, current)
