"""`HostCollectives`: the shared-memory all-reduce and all-gather that inference tensor parallelism exchanges
activations through give gloo's results, the same bits on every process, over many calls (the slots reused), carry
a tensor past a slot's size in pieces, and end a wait on a process that stopped in an error naming it (one the server
takes for a collective's failure), after the group's own timeout by default, and at once on one that exited; a split
model's stopping flags (`LeaderStop`) go through it."""

from __future__ import annotations

import errno
import json
import logging
import os

import pytest

from optimum_ipu.runtime import host_collectives

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch

WORKER = str(REPO_ROOT / "tests" / "distributed" / "host_collectives_worker.py")


@pytest.mark.parametrize("processes", [2, 3])
def test_shared_memory_collectives_give_gloos_results_and_never_hang(tmp_path, processes):
    run = launch(*TORCHRUN, f"--nproc_per_node={processes}", f"--master_port={free_port()}", WORKER, str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(processes)]
    assert all(r["shared"] for r in records)
    assert [r["timeout"] for r in records] == [
        42.0
    ] * processes  # the group's  # one host, x86-64: through shared memory
    assert [r["mismatches"] for r in records] == [[]] * processes
    assert all(r["pieces"] and r["strided"] for r in records)  # past a slot, in pieces; a strided tensor in place
    assert len({r["digest"] for r in records}) == 1  # the same bits on every process
    assert [r["ended"] for r in records] == [[False, True, False]] * processes  # the leader's flags, on every one
    assert all(r["through shared memory"] for r in records)
    raised = records[0]["raised"]
    assert (
        raised is not None and f"process 1 of {processes} timed out: it did not reach collective" in raised["message"]
    )
    assert "within 1.5 s (it has exited or stalled)" in raised["message"] and raised["collective error"]
    assert 1.5 <= raised["seconds"] < 30
    exited = records[0]["exited"]
    assert "process 1 of" in exited["message"] and "has exited: collective 1 cannot complete" in exited["message"]
    assert exited["seconds"] < 10  # (the timeout was 60 s)
    assert not [name for name in os.listdir("/dev/shm") if name.startswith("optimum-ipu-tp-")]


def test_shared_memory_that_cannot_be_had_falls_back_in_one_line(monkeypatch, caplog, tmp_path):
    def full(descriptor: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(host_collectives.os, "posix_fallocate", full)  # a container's small /dev/shm, full
    monkeypatch.setattr(host_collectives, "SHM", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger=host_collectives.__name__):
        assert host_collectives._allocate(16 << 20) is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "16 MB of shared memory cannot be had" in said[0] and "--shm-size" in said[0]
    assert list(tmp_path.iterdir()) == []  # the file it tried is gone
