"""The training step protocol that both engines speak, and which `IPUTrainer` (and the tests) drive.

An optimizer step is some micro-batches, then a finish:

    for inputs, weight in micro_batches:
        loss = engine.micro_batch(inputs, weight)       # forward and backward, or queued for a schedule
    result = engine.finish_step()                      # gradients ready: reduced, unscaled, clipped, checked
    if not engine.last_step_skipped:
        optimizer.step(); lr_scheduler.step()
    optimizer.zero_grad(set_to_none=True)

`Engine` (one process; stages run in turn) runs each micro-batch at once; `PipelineEngine` (stages on separate
processes) queues them and runs the whole schedule in `finish_step`, where micro-batches interleave over the
stages. The step's loss is the sum of what `micro_batch` returned and `StepResult.loss`, for both: one process
reports each micro-batch's share as it runs, a pipeline reports the step's loss at the finish.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

Batch = Mapping[str, Any]
ComputeLoss = Callable[[Batch], torch.Tensor]


@dataclass
class StepResult:
    """What `finish_step` returns.

    Args:
        loss (`torch.Tensor`): the part of the step's loss that `micro_batch` has not returned (0-dim, detached): 0 in
            one process, the whole step's loss from a pipeline schedule.
        grad_norm (`float`): the gradient norm over the whole model, before clipping; `inf` or NaN when the gradients
            overflowed, and the step is then skipped (`last_step_skipped`: the gradients were dropped).
    """

    loss: torch.Tensor
    grad_norm: float


class TrainingStep(Protocol):
    """The step protocol of `Engine` and `PipelineEngine` (see the module docstring)."""

    last_step_skipped: bool
    last_grad_norm: float

    def micro_batch(
        self, inputs: Batch, weight: float | torch.Tensor, compute_loss: ComputeLoss | None = None
    ) -> torch.Tensor:
        """One micro-batch of the current optimizer step; returns its share of the step's loss known so far."""
        ...

    def finish_step(self, step: int | None = None) -> StepResult:
        """Make the step's gradients ready for `optimizer.step()`; `step` numbers it as logs do."""
        ...
