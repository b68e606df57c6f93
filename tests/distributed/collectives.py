"""What the workers count of the collectives they run."""

from __future__ import annotations

import torch.distributed as dist


def count_reduce_scatters() -> dict[str, int]:
    """Counts FSDP's gradient reduce-scatters (calls and bytes sent into them) from now on, in this process."""
    sent = {"calls": 0, "bytes": 0}
    reduce_scatter = dist.reduce_scatter_single

    def counting(*args, **kwargs):
        tensor = kwargs.get("input", args[1] if len(args) > 1 else None)
        sent["calls"] += 1
        sent["bytes"] += tensor.numel() * tensor.element_size()
        return reduce_scatter(*args, **kwargs)

    dist.reduce_scatter_single = counting  # FSDP2 calls it through the module (torch's own, not transformers')
    return sent
