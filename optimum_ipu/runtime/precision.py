"""Half precision: autocast and loss scaling (static, as `--loss_scaling`, or dynamic, as `auto_loss_scaling`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable

import torch

logger = logging.getLogger(__name__)

PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Autocast to the half type of `precision` on `device`; nothing for fp32."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def set_half_partials(device: torch.device, enabled: bool) -> None:
    """`enable_half_partials`: let CUDA matmuls reduce in half precision (faster, slightly less exact)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = enabled
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = enabled


class LossScaler:
    """Loss scaling for fp16 training.

    The loss is multiplied by `scale` before backward so small gradients survive in fp16; gradients are
    divided by it before the optimizer step. A step whose gradients overflow (inf/NaN) is skipped. With
    `dynamic=True` the scale is halved on overflow and doubled after `growth_interval` good steps; with a
    static scale, overflows are reported (the scale stays as the user chose it).

    Args:
        scale (`float`): the initial (or static) loss scale.
        dynamic (`bool`): adapt the scale to overflows.
        growth_interval (`int`, *optional*, defaults to 2000): good steps before the scale doubles.
        enabled (`bool`, *optional*, defaults to `True`): when `False` every method is a no-op (fp32, bf16).
    """

    def __init__(self, scale: float, dynamic: bool, growth_interval: int = 2000, enabled: bool = True) -> None:
        self.scale = float(scale) if enabled else 1.0
        self.dynamic = dynamic and enabled
        self.enabled = enabled
        self.growth_interval = growth_interval
        self._good_steps = 0
        self.overflows = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale_(self, params: Iterable[torch.nn.Parameter]) -> None:
        if not self.enabled:
            return
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, 1.0 / self.scale)

    def update(self, found_inf: bool, step: int | None = None) -> None:
        """Record whether the step overflowed and adapt the scale."""
        if not self.enabled:
            return
        if found_inf:
            self.overflows += 1
            self._good_steps = 0
            if self.dynamic:
                self.scale = max(self.scale / 2.0, 1.0)
                logger.info("fp16 overflow at step %s: step skipped, loss scale lowered to %g", step, self.scale)
            else:
                logger.warning(
                    "fp16 overflow at step %s with static loss scale %g: step skipped; "
                    "lower --loss_scaling or set auto_loss_scaling",
                    step,
                    self.scale,
                )
            return
        self._good_steps += 1
        if self.dynamic and self._good_steps >= self.growth_interval:
            self.scale *= 2.0
            self._good_steps = 0

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "good_steps": self._good_steps, "overflows": self.overflows}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.scale = float(state["scale"])
        self._good_steps = int(state["good_steps"])
        self.overflows = int(state["overflows"])
