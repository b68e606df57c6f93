"""All-reduce and all-gather between the processes of one host through shared memory, for decoding split over
processes (inference tensor parallelism): a step of GPT-2 124M runs 25 all-reduces of a few rows, and each through
`gloo` costs 1.5-1.8 ms on the 2-core VMs this project is measured on (a loopback round trip is 180 µs there; the
all-reduce takes several), more than the matrix work it splits. Here each process writes its tensor into its slot of
a shared segment, publishes a sequence number after it, and waits (spinning, then yielding the core) until every
process has published the same number; each then sums the slots in rank order, so every process holds the same
bits. Two sets of slots are used in turn: a process writing call k's slot knows every other one has begun call k-1,
so has finished reading call k-2's slots, the ones it reuses.

Only where it is safe: a gloo group (NCCL keeps its own transport), every process of it on this host, CPU tensors
(past a slot's 4 MB, in pieces), and an x86-64 CPU (its stores become visible to other cores in program order, which
the sequence number relies on; elsewhere the group's own collective runs). A process that exits makes the others
raise within a second; one that stops answering, after `timeout` seconds: never a hang.
"""

from __future__ import annotations

import logging
import mmap
import os
import platform
import socket
import tempfile
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

SLOT_BYTES = 4 << 20  # a decoding step's rows (the logits' share of 64 rows x 16,000 words in fp32); more: in pieces
HEADER_BYTES = 64  # a process's int64 sequence number, on its own cache line
SPINS_BEFORE_YIELD = 2000
SHM = "/dev/shm"


_BY_RANKS: dict[tuple[int, ...], HostCollectives] = {}  # by the group's processes (global ranks)


def registered(group: dist.ProcessGroup) -> HostCollectives | None:
    """The `HostCollectives` made for the processes of `group` (through shared memory), if any: what the small
    exchanges of every decoding step (`lockstep.LeaderStop`) take instead of the group's own collective. Every process
    of `group` must run the same calls on it in the same order, as the model's exchanges are run."""
    if not dist.is_initialized():
        return None
    return _BY_RANKS.get(tuple(dist.get_process_group_ranks(group)))


def group_timeout(group: dist.ProcessGroup) -> float:
    """The seconds `group`'s own collectives wait (300 where the backend does not say)."""
    try:
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return 300.0


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "unknown"


def _alive(pid: int) -> bool:
    """Whether process `pid` runs: it exists and has not exited unreaped (a zombie, until its parent waits)."""
    try:
        os.kill(pid, 0)  # (no signal sent: whether the process exists)
    except ProcessLookupError:
        return False
    except PermissionError:  # (exists, another user's)
        pass
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"  # (the state follows the command's parenthesis)
    except (OSError, IndexError):
        return True


def _allocate(size: int) -> str | None:
    """A file of `size` bytes in memory (`/dev/shm`), its pages reserved now: a write past a full tmpfs would kill the
    process (SIGBUS) rather than fail. None (said once) where it cannot be had: the group's collectives run instead."""
    descriptor, path = tempfile.mkstemp(prefix="optimum-ipu-tp-", dir=SHM if os.path.isdir(SHM) else None)
    try:
        os.posix_fallocate(descriptor, 0, size)
        return path
    except OSError as error:
        os.unlink(path)
        logger.warning(
            "tensor parallel collectives: %d MB of shared memory cannot be had in %s (%s); they go through the process "
            "group instead (slower for decoding's few rows; give the container more, e.g. docker --shm-size=1g)",
            size >> 20,
            os.path.dirname(path),
            error.strerror,
        )
        return None
    finally:
        os.close(descriptor)


class HostCollectives:
    """Shared-memory all-reduce (sum) and all-gather for the processes of `group`, all on this host.

    Args:
        group (`ProcessGroup`): the processes (created with `torch.distributed`); its collectives exchange the
            segment's name once, and run whatever this class cannot (another host, a GPU tensor).
        timeout (`float`, *optional*): seconds to wait for the slowest process before raising; by default the
            group's own timeout (`optimum-ipu serve --stage-timeout`, `ddp_timeout`), as its collectives would.
    """

    def __init__(self, group: dist.ProcessGroup, timeout: float | None = None) -> None:
        self.group, self.timeout = group, timeout or group_timeout(group)
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.calls = 0
        self.fence = threading.Lock()
        self.memory: mmap.mmap | None = None
        self.pids: list[int] | None = None
        if self._one_host():
            self._attach()
        if self.shared:
            _BY_RANKS[tuple(dist.get_process_group_ranks(group))] = self

    @property
    def shared(self) -> bool:
        """Whether the exchanges go through shared memory (else through the group's own collectives)."""
        return self.memory is not None

    def _one_host(self) -> bool:
        """Whether shared memory may carry this group's exchanges: a gloo group (NCCL: GPU tensors, its own
        transport) of several processes, all on this host, on an x86-64 CPU."""
        if self.size < 2 or dist.get_backend(self.group) != "gloo":
            return False
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return False
        hosts: list[str | None] = [None] * self.size
        dist.all_gather_object(hosts, socket.gethostname(), group=self.group)
        return len(set(hosts)) == 1

    def _attach(self) -> None:
        size = HEADER_BYTES * self.size + 2 * self.size * SLOT_BYTES
        path: list[str | None] = [None]
        if self.rank == 0:  # a file in memory (/dev/shm), mapped by every process, its name gone once all have it
            path[0] = _allocate(size)
        dist.broadcast_object_list(path, src=dist.get_global_rank(self.group, 0), group=self.group)
        if path[0] is None:
            return
        try:  # (a process in another container of the same host name sees another /dev/shm)
            with open(str(path[0]), "r+b") as file:
                self.memory = mmap.mmap(file.fileno(), size)
        except OSError:
            self.memory = None
        seen: list[Any] = [None] * self.size  # whether each process mapped it, and its process id and namespace
        dist.all_gather_object(seen, (self.memory is not None, os.getpid(), _pid_namespace()), group=self.group)
        if self.rank == 0:
            os.unlink(str(path[0]))
        if not all(mapped for mapped, _, _ in seen):
            logger.warning("tensor parallel collectives: %s is not shared by every process; gloo runs them", path[0])
            self.memory = None
            return
        # a process that exits is seen at once where the ids mean the same to every process (one PID namespace)
        self.pids = [pid for _, pid, _ in seen] if len({space for _, _, space in seen}) == 1 else None
        self.sequence = memoryview(self.memory)[: HEADER_BYTES * self.size].cast("q")  # rank r's: [r * 8]
        self.bytes = torch.frombuffer(self.memory, dtype=torch.uint8)
        logger.info("tensor parallel collectives through shared memory (%d processes on this host)", self.size)

    def _usable(self, tensor: torch.Tensor) -> bool:
        return self.shared and tensor.device.type == "cpu"

    def _pieces(self, tensor: torch.Tensor) -> list[slice]:
        """`tensor` (flattened) in pieces of at most a slot: a larger one goes through the slots piece by piece."""
        step = SLOT_BYTES // tensor.element_size()
        return [slice(start, start + step) for start in range(0, tensor.numel(), step)]

    def _slot(self, calls: int, rank: int, like: torch.Tensor) -> torch.Tensor:
        start = HEADER_BYTES * self.size + ((calls % 2) * self.size + rank) * SLOT_BYTES
        size = like.numel() * like.element_size()
        return self.bytes[start : start + size].view(like.dtype).view(like.shape)

    def _exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Publish `tensor`, wait for every process's of the same call; their slots, in rank order."""
        self.calls += 1
        calls = self.calls
        self._slot(calls, self.rank, tensor).copy_(tensor)
        with self.fence:  # a locked instruction: a large copy's streaming stores drain before the number is seen
            self.sequence[self.rank * 8] = calls  # after the data: x86 keeps ordinary stores in order
        for rank in range(self.size):
            self._wait(rank, calls)
        return [self._slot(calls, rank, tensor) for rank in range(self.size)]

    def _wait(self, rank: int, calls: int) -> None:
        """Until process `rank` has published call `calls`: spinning, then yielding the core (a process beside it may
        need it: more processes than cores). An error, as a gloo collective raises it (the server takes it for a
        collective's failure), once that process has exited (looked at every half second) or after the timeout."""
        spins, start, looked = 0, 0.0, 0.0
        while self.sequence[rank * 8] < calls:
            spins += 1
            if spins <= SPINS_BEFORE_YIELD:
                continue
            os.sched_yield()
            now = time.monotonic()
            start = start or now
            if self.pids is not None and now - looked > 0.5:
                looked = now
                if not _alive(self.pids[rank]):
                    raise dist.DistBackendError(
                        f"tensor parallel process {rank} of {self.size} (pid {self.pids[rank]}) has exited: "
                        f"collective {calls} cannot complete"
                    )
            if now - start > self.timeout:
                raise dist.DistBackendError(
                    f"tensor parallel process {rank} of {self.size} timed out: it did not reach collective {calls} "
                    f"within {self.timeout:g} s (it has exited or stalled)"
                )

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the processes, in place (the same bits on every one), and return it."""
        if not self._usable(tensor):
            dist.all_reduce(tensor, group=self.group)
            return tensor
        flat = tensor.contiguous().view(-1)  # (`tensor` itself where contiguous: summed in place)
        for piece in self._pieces(flat):
            slots = self._exchange(flat[piece])  # (copied out before the sum overwrites it)
            if len(slots) == 2:
                torch.add(*slots, out=flat[piece])
            else:
                torch.sum(torch.stack(slots), dim=0, out=flat[piece])
        if flat.data_ptr() != tensor.data_ptr():
            tensor.copy_(flat.view(tensor.shape))
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The processes' `tensor`s (the same shape on each), concatenated along `dim` in rank order."""
        if not self._usable(tensor):
            parts = [torch.empty_like(tensor) for _ in range(self.size)]
            dist.all_gather(parts, tensor.contiguous(), group=self.group)
            return torch.cat(parts, dim=dim)
        flat = tensor.contiguous().view(-1)
        pieces = self._pieces(flat)
        if len(pieces) == 1:
            return torch.cat(self._exchange(flat.view(tensor.shape)), dim=dim)
        parts = [torch.empty_like(flat) for _ in range(self.size)]
        for piece in pieces:
            for part, slot in zip(parts, self._exchange(flat[piece]), strict=True):
                part[piece] = slot
        return torch.cat([part.view(tensor.shape) for part in parts], dim=dim)

    def close(self) -> None:
        """Stop using the shared memory (it is unmapped once nothing views it)."""
        if self.memory is not None:
            for ranks in [r for r, held in _BY_RANKS.items() if held is self]:
                del _BY_RANKS[ranks]
            self.sequence.release()
            self.memory = self.bytes = None
