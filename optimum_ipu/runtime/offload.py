"""`optimizer_state_offchip`: the optimizer state (and fp32 master weights) kept in host memory.

On an IPU the optimizer state can live in streaming memory instead of on the chip; the equivalent here is host
RAM instead of device memory (as DeepSpeed's ZeRO-Offload does): each step copies the gradients to the host,
steps there, and copies the updated weights back. Device memory then holds weights and gradients only; the
price is two copies of the weights over the host link per step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class HostOffloadedOptimizer(torch.optim.Optimizer):
    """An optimizer whose state and fp32 master weights live on the host (see the module docstring).

    `param_groups` (learning rates for the schedulers), `state` and `state_dict()` are those of the inner
    optimizer over the host copies, so schedulers and checkpoints work unchanged.

    Args:
        params (`Iterable`): the device parameters, or parameter groups (dicts with `"params"`).
        optimizer_class (`type[torch.optim.Optimizer]`): the optimizer that runs on the host (e.g. AdamW).
        kwargs: its arguments (`lr`, `betas`, `weight_decay`, ...).
    """

    def __init__(self, params: Iterable[Any], optimizer_class: type[torch.optim.Optimizer], **kwargs: Any) -> None:
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.device_params: list[torch.nn.Parameter] = []
        host_groups = []
        for group in groups:
            device = list(group["params"])
            host = [p.detach().to("cpu", torch.float32, copy=True).requires_grad_(p.requires_grad) for p in device]
            self.device_params += device
            host_groups.append({**group, "params": host})
        self.inner = optimizer_class(host_groups, **kwargs)
        self.host_params = [p for group in self.inner.param_groups for p in group["params"]]
        super().__init__(self.host_params, self.inner.defaults)
        # one set of groups and state: the inner optimizer's (schedulers change its learning rates)
        self.param_groups, self.state = self.inner.param_groups, self.inner.state

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if closure is not None:
            raise ValueError("optimizer_state_offchip: closures are not supported (the loss runs on the device)")
        for device_param, host_param in zip(self.device_params, self.host_params, strict=True):
            # a parameter without a gradient (frozen, or dropped on overflow) is left alone, as torch optimizers do
            host_param.grad = None if device_param.grad is None else device_param.grad.to("cpu", torch.float32)
        self.inner.step()
        for device_param, host_param in zip(self.device_params, self.host_params, strict=True):
            if device_param.grad is not None:
                device_param.copy_(host_param, non_blocking=True)
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.device_params:
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()
        self.inner.zero_grad(set_to_none=True)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)
        self.param_groups, self.state = self.inner.param_groups, self.inner.state
        # the host master weights follow the device weights, which the checkpoint has restored
        with torch.no_grad():
            for device_param, host_param in zip(self.device_params, self.host_params, strict=True):
                host_param.copy_(device_param.detach().to("cpu", torch.float32))
