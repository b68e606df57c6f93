"""Processes of a `torchrun` job and how the device slots of an `IPUConfig` map onto them."""

from __future__ import annotations

import atexit
import datetime
import functools
import hashlib
import os
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from .. import topology
from ..config import IPUConfig


def world_size() -> int:
    """Processes of this job (`WORLD_SIZE`, set by `torchrun`; 1 otherwise)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def group_size(what: str) -> int:
    """The processes of this job's default process group; a `RuntimeError` naming `what` where there is none (a
    script not launched with `torchrun`)."""
    if not dist.is_initialized():
        raise RuntimeError(f"{what} needs torch.distributed: launch with torchrun")
    return dist.get_world_size()


@functools.cache  # register once per process
def release_process_group_at_exit() -> None:
    """Destroy the default process group when the interpreter exits, while Python is still fully alive.

    A process that leaves without `destroy_process_group()` may abort (SIGABRT, "terminate called without an
    active exception"): gloo's worker threads can still hold finished work with tensors, and freeing them during
    interpreter finalization takes the GIL too late (pytorch/pytorch#179291). `transformers.Trainer` never
    destroys the group, so scripts such as `run_qa.py` under `torchrun` exited with code -6 at random after a
    successful run. The handler does nothing if the group is gone already.
    """
    atexit.register(_destroy_process_group)


def init_cpu_process_group(backend: str, timeout_s: int) -> None:
    """Create the default process group of a CPU job (`torchrun`) with a timeout of `timeout_s` seconds.

    `transformers` builds accelerate's state without `ddp_timeout` on CPUs, so gloo would wait 30 minutes on a
    rank that died or stopped; a group that exists already is adopted by accelerate as it is.
    """
    if dist.is_available() and not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    set_default_group_timeout(timeout_s)


def join_process_group(timeout_s: int = 300) -> None:
    """Under `torchrun`, create this job's default process group (gloo on CPUs, NCCL on GPUs) with `timeout_s` for
    its collectives, unless one exists; nothing in one process. What a job that only serves or predicts calls before
    it loads a model stage by stage (training arguments make the group of a training job)."""
    if world_size() > 1 and dist.is_available() and not dist.is_initialized():
        init_cpu_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout_s)


def is_collective_error(err: BaseException) -> bool:
    """Whether `err` is a collective's failure (a peer process gone, or silent past the group's timeout), not the
    error of the computation between collectives."""
    backend_error = getattr(dist, "DistBackendError", None)
    if backend_error is not None and isinstance(err, backend_error):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("gloo" in text or "timed out" in text or "connection closed" in text)


def set_default_group_timeout(timeout_s: int) -> None:
    """Make `timeout_s` the timeout of every process group created from now on without one of its own.

    `new_group` and `init_device_mesh` (the replica x stage mesh of process pipelines) give their groups torch's
    module default (30 minutes on gloo, 10 on NCCL), not the default group's: a stage waiting on a stopped stage
    would ignore `ddp_timeout`. torch reads these module values when a group is made, so setting them is enough.
    """
    from torch.distributed import distributed_c10d

    timeout = datetime.timedelta(seconds=timeout_s)
    distributed_c10d.default_pg_timeout = timeout
    if isinstance(getattr(distributed_c10d, "default_pg_nccl_timeout", None), datetime.timedelta):
        distributed_c10d.default_pg_nccl_timeout = timeout


_HEARTBEAT = "optimum_ipu/heartbeat/"


def start_heartbeat(timeout_s: int) -> None:
    """Every process of the job writes the time into the job's store every `timeout_s / 4` seconds (at most 30),
    from a daemon thread: when a collective times out, `silent_ranks` tells which process stopped (a SIGSTOP, a
    hung host), which the timeout error itself does not say. No effect in a single process or if started already."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    interval = min(30.0, max(1.0, timeout_s / 4))
    _start_heartbeat(dist.distributed_c10d._get_default_store(), dist.get_rank(), interval)


_heartbeat_stop = threading.Event()
_heartbeat_threads: list[threading.Thread] = []


@functools.cache  # one thread per process
def _start_heartbeat(store: object, rank: int, interval: float) -> None:
    def beat() -> bool:
        try:
            store.set(f"{_HEARTBEAT}{rank}", f"{time.time()} {interval}")
            return True
        except Exception:  # the store went away (the job is ending): nothing left to report to
            return False

    # The first beat before returning: a process stopped right after start still has a heartbeat to go stale.
    if not beat():
        return

    def keep_beating() -> None:
        while not _heartbeat_stop.wait(interval) and beat():
            pass

    thread = threading.Thread(target=keep_beating, name="optimum-ipu-heartbeat", daemon=True)
    _heartbeat_threads.append(thread)
    thread.start()
    atexit.register(stop_heartbeat)  # before interpreter teardown destroys the store under it


def stop_heartbeat() -> None:
    """Stop this process's heartbeat thread (before the store it writes to is destroyed: a write racing the
    store's destruction can abort the process)."""
    _heartbeat_stop.set()
    for thread in _heartbeat_threads:
        thread.join(timeout=5)


def silent_ranks() -> list[int]:
    """The ranks whose heartbeat (`start_heartbeat`) is older than 2.5 of its intervals: stopped or gone. Empty
    without a process group or heartbeats; never the rank that asks."""
    if not (dist.is_available() and dist.is_initialized()):
        return []
    store, now, silent = dist.distributed_c10d._get_default_store(), time.time(), []
    for rank in range(dist.get_world_size()):
        key = f"{_HEARTBEAT}{rank}"
        if rank == dist.get_rank():  # the rank asking is alive, whatever its own thread managed
            continue
        try:
            if not store.check([key]):
                continue
            beat, interval = (float(x) for x in store.get(key).decode().split())
        except Exception:  # an unreachable store tells nothing about the ranks
            return silent
        if now - beat > 2.5 * interval + 1:
            silent.append(rank)
    return silent


def silent_ranks_note() -> str:
    """What a failed collective's one line adds (`optimum_ipu.errors.COLLECTIVE_FAILURE_NOTES`): the ranks whose
    heartbeat stopped, if any."""
    silent = silent_ranks()
    if not silent:
        return ""
    return f"; rank(s) {', '.join(map(str, silent))} stopped responding (no heartbeat): check those processes"


def check_ranks_agree(text: str, what: str = "the resolved IPU config and training arguments") -> None:
    """Compare a hash of `text` across the processes of the job: ranks started with different configs would
    otherwise fail later in a collective (a gloo abort), or train different things.

    Raises:
        ValueError: naming the ranks whose hash differs from rank 0's.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    digests: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    differ = [rank for rank, d in enumerate(digests) if d != digests[0]]
    if differ:
        raise ValueError(
            f"ranks {', '.join(map(str, differ))} were started with other {what} than rank 0 (hash "
            f"{digests[differ[0]]} vs {digests[0]}); launch every process with the same arguments and config files"
        )


def _destroy_process_group() -> None:
    stop_heartbeat()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def replicas_per_process(ipu_config: IPUConfig, processes: int | None = None, inference: bool = False) -> int:
    """How many data-parallel replicas this process runs, one after the other (`topology.replicas_per_process`
    with this job's number of processes)."""
    return topology.replicas_per_process(ipu_config, world_size() if processes is None else processes, inference)


def batches_of(src: int, group: Any, batches: list[dict[str, Any]], device: Any) -> list[dict[str, Any]]:
    """Process `src`'s `batches` (their tensors) on every process of `group`, which all call this with theirs.

    The stages of a pipeline replica each load and collate the same examples, but a collator that draws at random
    (a masked language model's masks, `DataCollatorForLanguageModelingWithMaxTokensMasked`'s, Wav2Vec2's masked
    frames) draws from each process's own generator, which dropout consumes differently on each stage: from the
    second step on, stage 0 would embed tokens masked one way and the last stage score labels masked another. One
    process's batches, sent to the others, keep the stages on the same micro-batches whatever the collator does.

    Args:
        src (`int`): the global rank whose batches every process takes (the last stage: its labels are those its
            loss and `Trainer`'s metrics read).
        group (`ProcessGroup`): the processes of one pipeline replica.
        batches (`list[dict]`): this process's micro-batches; only their tensors are sent and replaced.
        device (`torch.device`): where the received tensors go.
    """
    if dist.get_world_size(group) == 1:
        return batches
    mine = dist.get_rank() == src
    tensors = [{k: v for k, v in batch.items() if isinstance(v, torch.Tensor)} for batch in batches]
    header = [[[(k, tuple(v.shape), v.dtype) for k, v in t.items()] for t in tensors] if mine else None]
    dist.broadcast_object_list(header, src=src, group=group)
    if len(header[0]) != len(batches):
        raise RuntimeError(
            f"the stages of a pipeline replica hold {len(header[0])} and {len(batches)} micro-batches for one step"
        )
    shared = []
    for layout, batch, own in zip(header[0], batches, tensors, strict=True):
        received = {}
        for key, shape, dtype in layout:
            tensor = own[key].contiguous() if mine else torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(tensor, src=src, group=group)
            received[key] = tensor
        shared.append({**batch, **received})
    return shared
