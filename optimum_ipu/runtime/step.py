"""The training step protocol that both engines speak, and the one loop around it that `IPUTrainer`, the tests and the
benchmarks drive.

An optimizer step is some micro-batches, then a finish (`run_steps` is this loop, `run_micro_batch` one turn of it,
which `IPUTrainer.training_step` calls once per micro-batch inside `transformers.Trainer`'s loop):

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

import contextlib
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
    """The step protocol of `Engine` and `PipelineEngine` (see the module docstring), and the surface both share:
    their precision (`autocast()`), device and fp16 loss scaler (disabled where fp16 is refused)."""

    last_step_skipped: bool
    last_grad_norm: float
    precision: str
    device: torch.device
    loss_scaler: Any

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of the engine's precision."""
        ...

    def micro_batch(
        self, inputs: Batch, weight: float | torch.Tensor, compute_loss: ComputeLoss | None = None
    ) -> torch.Tensor:
        """One micro-batch of the current optimizer step; returns its share of the step's loss known so far."""
        ...

    def finish_step(self, step: int | None = None) -> StepResult:
        """Make the step's gradients ready for `optimizer.step()`; `step` numbers it as logs do."""
        ...


def split_batch(batch: Mapping[str, Any], parts: int) -> list[dict[str, Any]]:
    """Split every tensor of `batch` into `parts` equal chunks along dim 0 (static shapes: it must divide)."""
    sizes = {k: v.shape[0] for k, v in batch.items() if isinstance(v, torch.Tensor)}
    size = next(iter(sizes.values()))
    if any(s != size for s in sizes.values()) or size % parts:
        raise ValueError(f"a host batch of {sizes} rows cannot be split into {parts} equal parts")
    chunks = {k: v.chunk(parts) if isinstance(v, torch.Tensor) else [v] * parts for k, v in batch.items()}
    return [{k: c[i] for k, c in chunks.items()} for i in range(parts)]


def run_micro_batch(
    engine: TrainingStep,
    inputs: Batch,
    weight: float | torch.Tensor,
    *,
    finish: bool,
    compute_loss: ComputeLoss | None = None,
    step: int | None = None,
) -> tuple[torch.Tensor, StepResult | None]:
    """One micro-batch of an optimizer step, and the step's finish after its last one (`finish`).

    Returns:
        `(loss, result)`: the micro-batch's share of the step's loss as `micro_batch` returned it, and the
        `StepResult` of `finish_step` (None before the last micro-batch); the step's loss is `loss + result.loss`.
    """
    loss = engine.micro_batch(inputs, weight, compute_loss)
    return loss, engine.finish_step(step) if finish else None


def run_steps(
    engine: TrainingStep,
    optimizer: torch.optim.Optimizer | None,
    host_batch: Batch,
    micro_batches: int,
    steps: int = 1,
    lr_scheduler: Any = None,
) -> torch.Tensor:
    """`steps` optimizer steps over `host_batch`, each of `micro_batches` equal micro-batches weighted alike, as
    `IPUTrainer` runs them (a skipped step moves neither the optimizer nor the schedule).

    Args:
        engine (`TrainingStep`): `Engine` or `PipelineEngine`.
        optimizer (`torch.optim.Optimizer`, *optional*): stepped (and its gradients zeroed) after each finished step;
            None for the step alone (a benchmark of the schedule): the caller then clears the gradients.
        host_batch (`Mapping[str, Any]`): `steps x micro_batches` equal micro-batches along dim 0.
        micro_batches (`int`): micro-batches per optimizer step.
        steps (`int`, *optional*, defaults to 1): optimizer steps.
        lr_scheduler (*optional*): stepped after each optimizer step.

    Returns:
        `torch.Tensor`: each step's loss (the sum of `micro_batch`'s returns and `finish_step`'s loss).
    """
    losses = []
    for step_batch in split_batch(host_batch, steps):
        parts = split_batch(step_batch, micro_batches)
        loss = torch.zeros(())
        for i, part in enumerate(parts):
            share, result = run_micro_batch(engine, part, 1 / len(parts), finish=i == len(parts) - 1)
            loss = loss.to(share.device) + share
        loss = loss + result.loss
        if optimizer is not None:
            if not engine.last_step_skipped:
                optimizer.step()
                if lr_scheduler is not None:
                    lr_scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        losses.append(loss)
    return torch.stack(losses)
