"""The callbacks `IPUTrainer` adds to `transformers.Trainer`'s loop, and the LR schedule wrapper that skips with the
engine: each a small object with one job."""

from __future__ import annotations

import statistics
import time
from typing import Any

from torch import nn
from transformers import Trainer, TrainerCallback

from ..runtime.step import TrainingStep


class SkipOnOverflow:
    """An LR scheduler that does not advance on optimizer steps skipped for an fp16 overflow."""

    def __init__(self, scheduler: Any, engine: TrainingStep) -> None:
        self.scheduler, self.engine = scheduler, engine

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.engine.last_step_skipped:
            self.scheduler.step(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scheduler, name)


class StepTimer(TrainerCallback):
    """Times optimizer steps, so that compilation (in the first step) is reported apart from throughput."""

    def __init__(self) -> None:
        self.durations: list[float] = []
        self._start = 0.0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.durations.clear()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._start = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.durations.append(time.perf_counter() - self._start)

    def compile_seconds(self) -> float | None:
        """First step minus a typical step: the time spent compiling (None without a second step)."""
        if len(self.durations) < 2:
            return None
        return max(0.0, self.durations[0] - statistics.median(self.durations[1:]))


class CompileOnly(TrainerCallback):
    """`--compile_only`: run the first step's forward and backward (which compiles and fills the cache), drop
    its gradients so the optimizer changes nothing, and stop."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for p in self.model.parameters():
            p.grad = None
        control.should_training_stop = True


class GatherShardedOptimizer(TrainerCallback):
    """A sharded (ZeRO) optimizer's state is gathered on the main process right before `Trainer` saves a
    checkpoint (a collective: every process takes part), so `optimizer.pt` holds the whole state."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def _gather(self, control: Any) -> None:
        if control.should_save:
            optimizer = self.trainer.optimizer
            getattr(optimizer, "optimizer", optimizer).consolidate_state_dict(to=0)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._gather(control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._gather(control)
