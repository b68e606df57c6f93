"""`HostCollectives` on 2 gloo processes of one host, for tests/distributed/test_host_collectives.py.

    torchrun --nproc_per_node 2 host_collectives_worker.py OUT_DIR

Each process runs the same sequence of all-reduces and all-gathers through shared memory and through gloo, and
writes OUT_DIR/rank{r}.json: whether the shared memory was used, the mismatches, a digest of its results (the same
bits on every process), and what a wait on a process that stopped calling raised.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from optimum_ipu.runtime.distributed import is_collective_error
from optimum_ipu.runtime.host_collectives import SLOT_BYTES, HostCollectives, registered
from optimum_ipu.runtime.lockstep import LeaderStop


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit on 2 processes (a + b either way) and for integers; past 2, gloo may add in another order."""
    if dist.get_world_size() == 2 or not got.is_floating_point():
        return torch.equal(got, want)
    atol = 4.0 if got.dtype == torch.bfloat16 else 1e-3  # (partial sums of values near 100: bf16's step there is 1-2)
    return torch.allclose(got.float(), want.float(), rtol=1e-2, atol=atol)


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=42))
    rank = dist.get_rank()
    timeout = HostCollectives(dist.group.WORLD).timeout  # the group's (a second segment: each is its own)
    collectives = HostCollectives(dist.group.WORLD, timeout=1.5)
    generator = torch.Generator().manual_seed(rank)
    mismatches, digest = [], hashlib.sha256()
    # the last two past a slot (4 MB): they go through it in pieces
    shapes = [(8, 768), (1,), (3, 5, 7), (8, 1, 768), (SLOT_BYTES // 4 + 1,), (3, SLOT_BYTES // 8 + 5)]
    for call in range(60):  # many calls: each set of slots reused every other call
        shape = shapes[call % len(shapes)]
        dtype = (torch.float32, torch.bfloat16, torch.int64)[call % 3]
        mine = (torch.randn(shape, generator=generator) * 100).to(dtype)
        want = mine.clone()
        dist.all_reduce(want)
        got = collectives.all_reduce(mine.clone())
        if not same(got, want):
            mismatches.append(f"all_reduce {call} {shape} {dtype}")
        gathered = collectives.all_gather(mine, dim=call % len(shape))
        parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, mine)
        if not torch.equal(gathered, torch.cat(parts, dim=call % len(shape))):  # (a copy: exact)
            mismatches.append(f"all_gather {call} {shape} {dtype}")
        digest.update(got.float().numpy().tobytes())
    # a tensor of 2.5 slots: three exchanges through the memory, none through gloo; a strided one, summed in place
    calls = collectives.calls
    whole = 1.5 * dist.get_world_size()
    pieces = collectives.all_reduce(torch.full((SLOT_BYTES // 4 * 5 // 2,), 1.5)).eq(whole).all().item()
    pieces = pieces and collectives.calls == calls + 3
    strided = torch.arange(12.0).view(3, 4).t()  # (not contiguous)
    summed = collectives.all_reduce(strided)
    want = torch.arange(12.0).view(3, 4).t() * dist.get_world_size()
    strided_ok = summed is strided and torch.equal(strided, want)
    # the step's stopping flags of a split model's generation (`LeaderStop`, unbound: every process of the job) go
    # through the group's registered shared memory: the leader's rows end on every process at the same step
    calls = collectives.calls
    stop = LeaderStop(lambda rows: [False, True, False]) if rank == 0 else LeaderStop()
    ended = stop(torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 8)).tolist()
    through_shared_memory = registered(dist.group.WORLD) is collectives and collectives.calls == calls + 1
    raised = None
    if rank == 0:  # process 1 stops calling: the wait must end in an error, not hang
        start = time.monotonic()
        try:
            collectives.all_reduce(torch.ones(4))
        except RuntimeError as error:
            raised = {"message": str(error), "seconds": time.monotonic() - start}
            raised["collective error"] = is_collective_error(error)
    record = {
        "pieces": pieces,
        "strided": strided_ok,
        "ended": ended,
        "through shared memory": through_shared_memory,
        "timeout": timeout,
        "shared": collectives.shared,
        "mismatches": mismatches,
        "digest": digest.hexdigest(),
        "raised": raised,
    }
    dist.barrier()  # (gloo: process 0 is done waiting)
    # a process that exits: the others raise within a second or so, not after the (60 s) timeout
    dying = HostCollectives(dist.group.WORLD, timeout=60)
    if rank == 0:
        start = time.monotonic()
        try:
            dying.all_reduce(torch.ones(4))
        except RuntimeError as error:
            record["exited"] = {"message": str(error), "seconds": time.monotonic() - start}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    os._exit(0)  # (the others exit without waiting for process 0: no teardown of the group)


if __name__ == "__main__":
    main()
