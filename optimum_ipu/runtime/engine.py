"""The single-process engine: runs a `PipelinedModel` on one device.

Training speaks the step protocol of `optimum_ipu.runtime.step`: `micro_batch` (forward and backward of one
micro-batch, autocast and loss scaling) for each of an optimizer step's micro-batches, then `finish_step` (unscale,
clip, overflow check) before `optimizer.step()`. `IPUTrainer` drives it inside `transformers.Trainer`'s loop; stages
on separate processes speak the same protocol (`PipelineEngine`). Stages run in turn on the one device here, so
numbers are those of the stock model. An inference host call (`eval_step`) holds `inference_device_iterations`
batches.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..config import IPUConfig
from .devices import default_device
from .precision import PRECISIONS, LossScaler, autocast
from .process_flags import configure_compile_cache, set_half_partials
from .step import ComputeLoss, StepResult, split_batch
from .tensor_parallel import clip_gradients

logger = logging.getLogger(__name__)

Batch = Mapping[str, torch.Tensor]


class Engine:
    """Runs training steps and inference host calls of a model in one process.

    Args:
        model (`nn.Module`): a parallelized `PipelinedModel` (or any module returning `transformers` outputs);
            its `train()` / `eval()` select the training or inference layout.
        ipu_config (`IPUConfig`): the execution configuration.
        precision (`str`, *optional*, defaults to `"fp32"`): `"fp32"`, `"fp16"` or `"bf16"` (autocast).
        loss_scaling (`float`, *optional*): fp16 loss scale; static unless the config sets
            `auto_loss_scaling` (dynamic, starting there; 2**16 when not given).
        max_grad_norm (`float`, *optional*): clip gradients to this norm (the norm is always computed, to
            detect overflows).
        device (`torch.device`, *optional*): defaults to this process's GPU, else the CPU.
        compile (`bool` or `Mapping[str, Any]`, *optional*, defaults to `False`): run the model's forward through
            `torch.compile` (`True`, or the keyword arguments of `torch.compile`), with graphs cached in the config's
            `executable_cache_dir` (see `compile`).

    The engine is the one place that configures `torch.compile` and its cache (`compile`,
    `cache_compiled_graphs`).
    """

    def __init__(
        self,
        model: nn.Module,
        ipu_config: IPUConfig,
        *,
        precision: str = "fp32",
        loss_scaling: float | None = None,
        max_grad_norm: float | None = None,
        device: torch.device | None = None,
        compile: bool | Mapping[str, Any] = False,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision: got {precision!r}; expected one of {', '.join(PRECISIONS)}")
        self.model = model
        self.ipu_config = ipu_config
        self.precision, self.max_grad_norm = precision, max_grad_norm
        self.device = device or default_device()
        if not any(p.is_meta for p in self.model.parameters()):  # one stage held only: built on its device
            self.model.to(self.device)
        set_half_partials(self.device, self.ipu_config.enable_half_partials)
        dynamic = self.ipu_config.auto_loss_scaling or loss_scaling is None
        self.loss_scaler = LossScaler(loss_scaling or 2.0**16, dynamic=dynamic, enabled=precision == "fp16")
        self.forward: Callable[..., Any] = self.model
        if compile:
            self.compile(**({} if compile is True else compile))
        self.optimizer_steps = 0
        self.last_step_skipped = False
        self.last_grad_norm = math.nan  # of the last optimizer step, before clipping

    def compile(self, **options: Any) -> None:
        """Run the model's forward through `torch.compile` from now on (`micro_batch` without a `compute_loss`, and
        `eval_step`), with its graphs cached in the config's `executable_cache_dir` (`cache_compiled_graphs`).

        Args:
            options: keyword arguments of `torch.compile` (e.g. `dynamic=False`, `mode="reduce-overhead"`).
        """
        self.cache_compiled_graphs()
        self.forward = torch.compile(self.model, **options)

    def cache_compiled_graphs(self) -> None:
        """Keep the graphs `torch.compile` builds in this process in the config's `executable_cache_dir`, so that a
        second run starts warm (a process-wide setting: `process_flags.configure_compile_cache`). `compile` calls
        it; `IPUTrainer` calls it under `--torch_compile`, where `transformers.Trainer` compiles the model it runs
        (through accelerate) and the engine's own forward stays as it is."""
        configure_compile_cache(self.ipu_config.executable_cache_dir)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of this engine's precision (nothing for fp32)."""
        return autocast(self.device, self.precision)

    def _to_device(self, batch: Batch) -> dict[str, Any]:
        return {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    # ------------------------------------------------------------------ training
    def micro_batch(
        self, inputs: Batch, weight: float | torch.Tensor, compute_loss: ComputeLoss | None = None
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch (the step protocol, `optimum_ipu.runtime.step`).

        Args:
            inputs (`Mapping[str, Any]`): the micro-batch (moved to the engine's device).
            weight (`float` or `torch.Tensor`): the micro-batch's share of its optimizer step's loss:
                `1 / micro_batches`, or its labelled items over the step's (token-level losses, uneven padding).
            compute_loss (`Callable`, *optional*): runs the forward on `inputs` and returns the micro-batch's mean
                loss (`IPUTrainer` passes `Trainer.compute_loss`); defaults to the model's own `loss` output.

        Returns:
            `torch.Tensor`: the weighted loss (detached, fp32); a step's micro-batches sum to its loss.
        """
        inputs = self._to_device(inputs)
        with self.autocast():
            loss = (compute_loss or self._model_loss)(inputs).float() * weight
        if isinstance(weight, torch.Tensor):
            # No labelled item: the mean is 0/0 = NaN, but the micro-batch adds nothing, as its token sum would.
            loss = torch.where(weight > 0, loss, torch.zeros_like(loss))
        self.loss_scaler.scale_loss(loss).backward()
        return loss.detach()

    def _model_loss(self, inputs: Batch) -> torch.Tensor:
        return self.forward(**inputs).loss

    def finish_step(self, step: int | None = None) -> StepResult:
        """The engine's part of every optimizer step, before `optimizer.step()`: unscale the accumulated
        gradients, clip them to `max_grad_norm`, and drop them if they overflowed.

        Args:
            step (`int`, *optional*): the number of the optimizer step being finished, as logs count it (a resumed
                run's `global_step + 1`); defaults to one past the last finished step.

        Returns:
            `StepResult`: no loss beyond what `micro_batch` returned, and the gradient norm before clipping (`inf`
            or NaN on an overflow: the step is then skipped, `last_step_skipped`). Dropped gradients (`None`) make
            any torch optimizer's `step()` leave those parameters and their state untouched.
        """
        self.optimizer_steps = self.optimizer_steps + 1 if step is None else step
        params = [p for p in self.model.parameters() if p.grad is not None]
        self.loss_scaler.unscale_(params)
        # One norm for clipping and for overflow detection: a single host sync per step.
        # FSDP's shards and tensor-parallel splits are DTensors: their norm is made whole over every process's parts
        self.last_grad_norm = float(clip_gradients(params, self.max_grad_norm or math.inf))
        self.last_step_skipped = not math.isfinite(self.last_grad_norm)
        self.loss_scaler.update(self.last_step_skipped, step=self.optimizer_steps)
        if self.last_step_skipped:
            for p in params:
                p.grad = None
        return StepResult(torch.zeros((), device=self.device), self.last_grad_norm)

    # ----------------------------------------------------------------- inference
    @torch.no_grad()
    def eval_step(self, host_batch: Batch) -> dict[str, torch.Tensor]:
        """One inference host call: `inference_device_iterations` batches, outputs concatenated along dim 0.

        A `loss` output is averaged over the batches.
        """
        self.model.eval()
        batch = self._to_device(host_batch)
        outputs: dict[str, list[torch.Tensor]] = {}
        for part in split_batch(batch, self.ipu_config.inference_device_iterations):
            with self.autocast():
                out = self.forward(**part)
            for key, value in out.items():
                if isinstance(value, torch.Tensor):
                    outputs.setdefault(key, []).append(value)
        merged = {k: torch.cat(v) if v[0].dim() else torch.stack(v) for k, v in outputs.items()}
        if "loss" in merged:
            merged["loss"] = merged["loss"].float().mean()
        return merged
