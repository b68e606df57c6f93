"""The training loop of the step protocol (`optimum_ipu.runtime.step`), as `IPUTrainer` drives it, for tests and
the distributed workers (light: no `datasets` import, which every worker process would pay for)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from optimum_ipu.runtime.engine import split_batch
from optimum_ipu.runtime.step import TrainingStep


def run_steps(
    engine: TrainingStep,
    optimizer: torch.optim.Optimizer,
    host_batch: Mapping[str, torch.Tensor],
    micro_batches: int,
    steps: int = 1,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> torch.Tensor:
    """`steps` optimizer steps over `host_batch`, each of `micro_batches` equal micro-batches weighted alike;
    returns each step's loss (the sum of `micro_batch`'s returns and `finish_step`'s loss)."""
    losses = []
    for step_batch in split_batch(host_batch, steps):
        parts = split_batch(step_batch, micro_batches)
        loss = sum(engine.micro_batch(part, 1 / len(parts)) for part in parts)
        loss = loss + engine.finish_step().loss
        if not engine.last_step_skipped:
            optimizer.step()
            if lr_scheduler is not None:
                lr_scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss)
    return torch.stack(losses)
