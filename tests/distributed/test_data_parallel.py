"""Data parallelism over processes (gloo on CPU): replicas on 2 processes give the numbers of one process."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from ..conftest import PYTHON, REPO_ROOT
from ..helpers import TORCHRUN, env, free_port, launch

WORKER = str(REPO_ROOT / "tests" / "distributed" / "worker.py")
REPLICAS_2 = json.dumps({"replication_factor": 2, "gradient_accumulation_steps": 2})


def torchrun(nproc: int, out, config: str, steps: int, *extra: str, **kw) -> subprocess.CompletedProcess:
    return launch(
        *TORCHRUN,
        f"--nproc_per_node={nproc}",
        f"--master_port={free_port()}",
        WORKER,
        str(out),
        config,
        str(steps),
        *extra,
        **kw,
    )


def result(out) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((out / "result.json").read_text()), load_file(out / "final" / "model.safetensors")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    run = launch(PYTHON, WORKER, str(out), REPLICAS_2, "3")
    assert run.returncode == 0, run.stderr[-3000:]
    return result(out)


def assert_same_run(got, expected) -> None:
    (got_result, got_weights), (want_result, want_weights) = got, expected
    torch.testing.assert_close(got_result["losses"], want_result["losses"], atol=1e-5, rtol=0)
    assert got_weights.keys() == want_weights.keys()
    for key in want_weights:
        torch.testing.assert_close(got_weights[key], want_weights[key], atol=1e-5, rtol=0, msg=key)


def test_two_replicas_on_two_processes_equal_one_process(tmp_path, one_process):
    run = torchrun(2, tmp_path, REPLICAS_2, 3)
    assert run.returncode == 0, run.stderr[-3000:]
    assert result(tmp_path)[0]["world_size"] == 2 and one_process[0]["world_size"] == 1
    assert_same_run(result(tmp_path), one_process)
    # the checkpoint of the 2-process run is the stock layout: one process resumes from it
    resumed = launch(
        PYTHON,
        WORKER,
        str(tmp_path / "resumed"),
        REPLICAS_2,
        "4",
        extra_env={"RESUME_FROM": str(tmp_path / "checkpoint-3")},
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((tmp_path / "resumed" / "result.json").read_text())["step"] == 4


def test_sharded_optimizer_state_same_numbers_less_state(tmp_path, one_process):
    sharded = json.dumps(
        {"replication_factor": 2, "gradient_accumulation_steps": 2, "replicated_tensor_sharding": True}
    )
    run = torchrun(2, tmp_path, sharded, 3)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_same_run(result(tmp_path), one_process)
    assert 0 < result(tmp_path)[0]["optimizer_state_numel"] < one_process[0]["optimizer_state_numel"]
    # the checkpoint holds the whole optimizer state: one process resumes from it
    resumed = launch(
        PYTHON,
        WORKER,
        str(tmp_path / "resumed"),
        REPLICAS_2,
        "4",
        extra_env={"RESUME_FROM": str(tmp_path / "checkpoint-3")},
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]


def test_two_hosts_on_loopback(tmp_path, one_process):
    port = free_port()
    common = [
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=optimum-ipu-test",
    ]
    hosts = [
        subprocess.Popen(
            [*TORCHRUN, *common, f"--node-rank={rank}", WORKER, str(tmp_path), REPLICAS_2, "3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
            cwd=REPO_ROOT,
        )
        for rank in (0, 1)
    ]
    outputs = [host.communicate(timeout=300) for host in hosts]
    assert all(host.returncode == 0 for host in hosts), [err[-2000:] for _, err in outputs]
    assert_same_run(result(tmp_path), one_process)


def test_process_count_that_does_not_fit_the_config_is_a_clear_error(tmp_path):
    run = torchrun(2, tmp_path, json.dumps({"replication_factor": 1}), 3)
    assert run.returncode != 0
    assert "2 processes, but `ipus_per_replica` (1) x `replication_factor` (1) make 1 device slots" in run.stderr
    assert "--nproc_per_node 1, or set `replication_factor` to 2 (--n_ipu 2)" in run.stderr


def test_a_dead_rank_ends_the_job_in_bounded_time(tmp_path):
    start = time.monotonic()
    run = torchrun(2, tmp_path, REPLICAS_2, 50, "1", real=True)  # torchrun's own report is checked
    elapsed = time.monotonic() - start
    assert run.returncode != 0 and elapsed < 120, elapsed
    assert "injected failure on rank 1" in run.stderr
    assert "rank      : 1" in run.stderr  # torchrun's report names the failed rank


def test_accelerate_launch_runs_the_same_data_parallel_job(tmp_path, one_process):
    """`accelerate launch --multi_gpu` (torchrun underneath; on CPUs accelerate's own multi-CPU mode needs mpirun)
    gives the numbers of one process, as torchrun does."""
    command = (PYTHON, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1")
    command += ("--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()))
    run = launch(*command, WORKER, str(tmp_path), REPLICAS_2, "3")
    assert run.returncode == 0, run.stderr[-3000:]
    assert result(tmp_path)[0]["world_size"] == 2
    assert_same_run(result(tmp_path), one_process)
