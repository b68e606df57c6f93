"""Half precision: autocast and loss scaling (static, as `--loss_scaling`, or dynamic, as `auto_loss_scaling`)."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterable

import torch

from ..errors import SkippedStepsError, short_repr

logger = logging.getLogger(__name__)

PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# The loss scales that can train in fp16: below 1, small gradients underflow to zero (the scale is there to
# lift them); above 2**24, the scaled gradients of any real loss overflow fp16 (max 65504), so every step is
# skipped. A dynamic scale stays in this range too.
MIN_LOSS_SCALE, MAX_LOSS_SCALE = 1.0, float(2**24)


def check_loss_scale(scale: object, source: str = "--loss_scaling") -> float:
    """`scale` as a float if it is a loss scale fp16 can train with, else a `ValueError` naming `source`.

    Args:
        scale: the value given (a number; NaN, infinities, booleans and non-numbers are refused).
        source (`str`): the flag or file the value came from, named in the error.
    """
    number = float(scale) if isinstance(scale, (int, float)) and not isinstance(scale, bool) else math.nan
    if not MIN_LOSS_SCALE <= number <= MAX_LOSS_SCALE:  # also refuses NaN
        raise ValueError(
            f"{source}: got {short_repr(scale)}; expected a finite loss scale in [1, 16777216] (2**24), e.g. 64 or "
            "1024: below 1 fp16 gradients underflow to zero, above 2**24 every step overflows and is skipped"
        )
    return number


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Autocast to the half type of `precision` on `device`; nothing for fp32."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


# Ours, not `torch.amp.GradScaler`: Optimum Graphcore's default is a *static* scale (`--loss_scaling 64` without
# `auto_loss_scaling`), which GradScaler cannot express (it requires growth_factor > 1 and backoff_factor < 1);
# one class serves both, with the bound on consecutive skipped steps and the checkpointed state of a run.
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
        max_consecutive_overflows (`int`, *optional*): stop with `SkippedStepsError` after this many skipped
            steps in a row (`None` or 0: no bound). A run that skips every step changes no weight.

    Raises:
        ValueError: `scale` is not finite or outside [1, 2**24] (`check_loss_scale`).
    """

    def __init__(
        self,
        scale: float,
        dynamic: bool,
        growth_interval: int = 2000,
        enabled: bool = True,
        max_consecutive_overflows: int | None = None,
    ) -> None:
        self.scale = check_loss_scale(scale, "loss scale") if enabled else 1.0
        self.dynamic = dynamic and enabled
        self.enabled = enabled
        self.growth_interval = growth_interval
        self.max_consecutive_overflows = max_consecutive_overflows
        self._good_steps = 0
        self.overflows = 0
        self.steps = 0  # optimizer steps seen (skipped or not)
        self.consecutive_overflows = 0

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
        self.steps += 1
        if found_inf:
            self.overflows += 1
            self.consecutive_overflows += 1
            self._good_steps = 0
            scale = self.scale
            if self.dynamic:
                self.scale = max(self.scale / 2.0, MIN_LOSS_SCALE)
                # a WARNING, not INFO: the example scripts show warnings, and a run of them means no training
                logger.warning("fp16 overflow at step %s: step skipped, loss scale lowered to %g", step, self.scale)
            else:
                logger.warning(
                    "fp16 overflow at step %s with static loss scale %g: step skipped; "
                    "lower --loss_scaling or set auto_loss_scaling",
                    step,
                    self.scale,
                )
            self._check_progress(step, scale)
            return
        self.consecutive_overflows = 0
        self._good_steps += 1
        if self.dynamic and self._good_steps >= self.growth_interval:
            self.scale = min(self.scale * 2.0, MAX_LOSS_SCALE)
            self._good_steps = 0

    def _check_progress(self, step: int | None, scale: float) -> None:
        bound = self.max_consecutive_overflows
        if bound and self.consecutive_overflows >= bound:
            kind = f"dynamic, now {self.scale:g}" if self.dynamic else "static"
            raise SkippedStepsError(
                f"fp16: {self.consecutive_overflows} optimizer steps in a row overflowed and were skipped (the last "
                f"at step {step}, loss scale {scale:g}, {kind}): no weight changed. Lower --loss_scaling, use "
                "--auto_loss_scaling, check the data and learning rate for inf/NaN, or train in bf16/fp32 "
                f"(the bound is --max_consecutive_skipped_steps {bound})"
            )

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "good_steps": self._good_steps, "overflows": self.overflows}

    def load_state_dict(self, state: dict[str, float | int], source: str = "loss scaler state") -> None:
        """Restore a saved state; `source` (the file it came from) is named if the state is unusable.

        Raises:
            ValueError: the saved scale is NaN, infinite or outside [1, 2**24], or a count is not a
                non-negative integer: resuming from it would skip every step.
        """
        if not isinstance(state, dict):
            raise ValueError(f"{source}: expected a JSON object with scale, good_steps and overflows")
        scale = check_loss_scale(state.get("scale"), f"{source}: the saved loss scale")
        counts = [state.get(key) for key in ("good_steps", "overflows")]
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            raise ValueError(f"{source}: good_steps and overflows must be integers >= 0, got {short_repr(counts)}")
        self.scale, (self._good_steps, self.overflows) = scale, counts
