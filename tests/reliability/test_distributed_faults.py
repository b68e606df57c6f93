"""Faults of a distributed launch: a master port already in use, a rank that stops (SIGSTOP) in the middle of a
collective on gloo, ranks started with different configs: each ends the job with one line that says why.

(A dead rank ending the job in bounded time, naming the rank, is tested in tests/distributed/test_data_parallel.py.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time

import psutil

from ..conftest import PYTHON, REPO_ROOT
from ..processes import free_port

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
        run = subprocess.run(
            [*TORCHRUN, "--nproc_per_node=2", f"--master_port={port}", str(script)],
            capture_output=True,
            text=True,
            env=env,
            timeout=BOUND_S,
            cwd=tmp_path,
        )
        elapsed = time.monotonic() - start
    assert run.returncode != 0 and "joined" not in run.stdout, (run.returncode, run.stdout)
    # torch's own report: the last line of the launcher's traceback names the port and the cause
    last = run.stderr.strip().splitlines()[-1]
    assert f"port: {port}" in last and "address already in use" in last, run.stderr[-2000:]
    assert elapsed < BOUND_S
    reliability.fault_survived()


STOPPED_RANK_JOB = """
import os, signal, sys
import torch, torch.distributed as dist
from optimum_ipu import IPUTrainingArguments
from optimum_ipu.errors import run_script

def main():
    args = IPUTrainingArguments(output_dir=sys.argv[1], ddp_timeout=5, report_to=[])
    args.device  # sets up the process group, as IPUTrainer does
    group = None
    if sys.argv[2] == "mesh":  # a group made later, as process pipelines make their replica x stage mesh
        from torch.distributed.device_mesh import init_device_mesh
        group = init_device_mesh("cpu", (2,), mesh_dim_names=("replica",)).get_group("replica")
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped, not dead: nothing tells the launcher
    dist.all_reduce(torch.ones(1), group=group)
    print("reduced", flush=True)

run_script(main)
"""


def start_torchrun(tmp_path, job: str, *args: str) -> subprocess.Popen:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "job.py"
    script.write_text(job)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [*TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}", str(script), *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    # the bound of a hang: the launcher's own SIGTERM grace (30 s) comes on top of ddp_timeout
    stdout, stderr = process.communicate(timeout=BOUND_S * 3)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def torchrun(tmp_path, job: str, *args: str) -> subprocess.CompletedProcess:
    return finish(start_torchrun(tmp_path, job, *args))


def wake_the_stopped_rank_once_alone(process: subprocess.Popen) -> None:
    """Once the waiting rank has ended, SIGCONT the stopped one: a stopped process cannot act on the launcher's
    SIGTERM, so the launcher would wait out its own 30 s grace (torch's, not ours) before ending the job."""
    launcher, deadline = psutil.Process(process.pid), time.monotonic() + BOUND_S
    while process.poll() is None and time.monotonic() < deadline:
        ranks = [p for p in launcher.children(recursive=True) if p.is_running()]
        with contextlib.suppress(psutil.Error):
            if len(ranks) == 1 and ranks[0].status() == psutil.STATUS_STOPPED:
                ranks[0].send_signal(signal.SIGCONT)
                return
        time.sleep(0.2)


def test_a_stopped_rank_ends_the_job_after_ddp_timeout_naming_it(tmp_path, reliability):
    """transformers drops `ddp_timeout` on CPUs, and groups made later (a device mesh) never had it: gloo waited 30
    minutes. Now the waiting rank gives up after the configured 5 s (gloo's message says so) and names the rank whose
    heartbeat stopped. Both kinds of group run at once."""
    groups = ("default", "mesh")
    jobs = {g: start_torchrun(tmp_path / g, STOPPED_RANK_JOB, str(tmp_path / g / "out"), g) for g in groups}
    for group, process in jobs.items():
        reliability.fault_injected()
        wake_the_stopped_rank_once_alone(process)
        run = finish(process)
        assert run.returncode != 0 and "reduced" not in run.stdout, (group, run.returncode, run.stdout)
        lines = [line for line in run.stderr.splitlines() if line.startswith("job.py (rank 0): error:")]
        # one line from the waiting rank, no traceback from it (the launcher's own report follows, naming ranks 0, 1)
        assert len(lines) == 1 and "[rank0]: Traceback" not in run.stderr, (group, run.stderr[-3000:])
        assert "Timed out waiting 5000ms" in lines[0] and "rank(s) 1 stopped responding" in lines[0], lines[0]
        reliability.fault_survived()


RANKS_DISAGREE_JOB = """
import os, sys
import datasets
from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.errors import run_script
from tests.tiny_models import tiny_inputs, tiny_model

CLASS = "BertForSequenceClassification"

def main():
    rank = int(os.environ["RANK"])
    rows = tiny_inputs(CLASS, batch=8, seed=0)
    args = IPUTrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=2, max_steps=1, report_to=[],
                                ddp_timeout=60)
    config = IPUConfig(replication_factor=2, gradient_accumulation_steps=2 + rank)  # rank 1 has another config
    IPUTrainer(tiny_model(CLASS), config, args, train_dataset=datasets.Dataset.from_dict(
        {k: v.tolist() for k, v in rows.items()})).train()
    print("trained", flush=True)

run_script(main)
"""


def test_ranks_started_with_different_configs_are_one_clear_error(tmp_path, reliability):
    """Before: a gloo abort mid-step. Now every rank compares a hash of the resolved config before any step."""
    run = torchrun(tmp_path, RANKS_DISAGREE_JOB, str(tmp_path / "out"))
    # both ranks say it, once each; counted in the text, since the two processes' lines can share one line of
    # the launcher's stderr when they are written at the same moment
    said = run.stderr.count(": error: ranks 1 were started with other")
    clear = run.returncode != 0 and "trained" not in run.stdout and said == 2
    assert reliability.bad_input(clear), run.stderr[-3000:]
    assert "[rank0]: Traceback" not in run.stderr and "[rank1]: Traceback" not in run.stderr
