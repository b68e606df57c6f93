"""Optimizers that torch does not ship: LAMB, as Graphcore's trainer offered with `--lamb`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class Lamb(torch.optim.Optimizer):
    r"""LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning"): Adam's update rescaled per
    parameter tensor by the trust ratio `||w|| / ||update||`, which keeps large-batch training stable.

    Args:
        params: parameters or parameter groups.
        lr (`float`, defaults to 1e-3): learning rate.
        betas (`tuple[float, float]`, defaults to `(0.9, 0.999)`): moving-average coefficients.
        eps (`float`, defaults to 1e-6): added to the denominator.
        weight_decay (`float`, defaults to 0.0): decoupled weight decay, part of the update the trust ratio scales.
        bias_correction (`bool`, defaults to `True`): Adam's bias correction of the moments.
        max_trust_ratio (`float`, defaults to 10.0): upper bound of the trust ratio.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
        max_trust_ratio: float = 10.0,
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"Lamb: invalid lr={lr}, betas={betas}, eps={eps} or weight_decay={weight_decay}")
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "bias_correction": bias_correction,
            "max_trust_ratio": max_trust_ratio,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue  # also how an overflowing fp16 step is skipped
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.lerp_(p.grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m, v = exp_avg, exp_avg_sq
                if group["bias_correction"]:
                    m = m / (1 - beta1 ** state["step"])
                    v = v / (1 - beta2 ** state["step"])
                update = m / (v.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update = update + group["weight_decay"] * p
                weight_norm, update_norm = p.norm(), update.norm()
                # A zero norm (a fresh bias, a zero update) leaves the plain Adam step.
                trust = torch.where(
                    (weight_norm > 0) & (update_norm > 0),
                    (weight_norm / update_norm).clamp(max=group["max_trust_ratio"]),
                    torch.ones_like(weight_norm),
                )
                p.add_(update * trust, alpha=-group["lr"])
        return loss
