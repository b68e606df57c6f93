"""`replicated_tensor_sharding`: the optimizer state sharded over data-parallel replicas (ZeRO-1)."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer


class ShardedOptimizer(ZeroRedundancyOptimizer):
    """`torch.distributed.optim.ZeroRedundancyOptimizer`: each replica keeps and updates the optimizer state of
    its share of the parameters, then the updated parameters are broadcast; same numbers, less memory each.

    `state_dict()` needs `consolidate_state_dict(to=0)` on every process first (a collective), except before
    the first step, when the state is empty: `accelerate` reads it then, as it wraps the optimizer.
    """

    def state_dict(self) -> dict[str, Any]:
        if not any(self.optim.state.values()) and not self._all_state_dicts:
            return torch.optim.Optimizer.state_dict(self)
        return super().state_dict()
