"""Faults of a distributed launch: a master port already in use is a clear error within a bounded time.

(A dead rank ending the job in bounded time, naming the rank, is tested in tests/distributed/test_data_parallel.py.)
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

from ..conftest import PYTHON, REPO_ROOT

TORCHRUN = [PYTHON, "-m", "torch.distributed.run"]  # the venv's `torchrun`, whatever PATH says
BOUND_S = 120  # the launcher gives up at once; the bound leaves room for a slow, busy machine
TINY_JOB = """
import torch.distributed as dist
dist.init_process_group("gloo")
print("joined", dist.get_rank(), flush=True)
dist.destroy_process_group()
"""


def test_master_port_already_in_use_is_a_clear_error_in_bounded_time(tmp_path, reliability):
    script = tmp_path / "tiny_job.py"
    script.write_text(TINY_JOB)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", 0))  # every local address, as the launcher's store would bind
        held.listen()
        port = held.getsockname()[1]
        reliability.fault_injected()
        start = time.monotonic()
        run = subprocess.run([*TORCHRUN, "--nproc_per_node=2", f"--master_port={port}", str(script)],
                             capture_output=True, text=True, env=env, timeout=BOUND_S, cwd=tmp_path)  # fmt: skip
        elapsed = time.monotonic() - start
    assert run.returncode != 0 and "joined" not in run.stdout, (run.returncode, run.stdout)
    # torch's own report: the last line of the launcher's traceback names the port and the cause
    last = run.stderr.strip().splitlines()[-1]
    assert f"port: {port}" in last and "address already in use" in last, run.stderr[-2000:]
    assert elapsed < BOUND_S
    reliability.fault_survived()
