"""Full parameter sharding (FSDP2, `--fsdp`) of a tiny Llama over 2 and 4 gloo processes: the losses and weights of
one process, each process holding 1 / replicas of the parameters, and checkpoints that move between a sharded
run and one process both ways."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from ..conftest import PYTHON, REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch

WORKER = str(REPO_ROOT / "tests" / "distributed" / "fsdp_worker.py")


def one_process(out, replicas: int, steps: int, resume_from=None):
    run = launch(
        PYTHON, WORKER, str(out), str(replicas), str(steps), "--fsdp", extra_env={"RESUME_FROM": str(resume_from or "")}
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "nothing to shard over" in run.stderr  # one process runs the replicas in turn: no sharding
    return run


def sharded(out, replicas: int, steps: int, resume_from=None):
    run = launch(
        *TORCHRUN,
        f"--nproc_per_node={replicas}",
        f"--master_port={free_port()}",
        WORKER,
        str(out),
        str(replicas),
        str(steps),
        "--fsdp",
        extra_env={"RESUME_FROM": str(resume_from or "")},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def ranks(out, processes: int) -> list[dict]:
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(processes)]


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)


@pytest.mark.parametrize("replicas", [2, 4])
def test_sharded_parameters_give_one_process_numbers(tmp_path, replicas):
    reference = tmp_path / "one"
    one_process(reference, replicas, steps=4)
    sharded(tmp_path / "fsdp", replicas, steps=4)
    (want,), got = ranks(reference, 1), ranks(tmp_path / "fsdp", replicas)

    assert not want["sharded"] and all(r["sharded"] for r in got)
    # the layout is over the job's mesh: every process a replica (one process: none)
    assert want["mesh"] is None and all(r["mesh"] == [["dp", "pp"], [replicas, 1]] for r in got)
    assert len(want["losses"]) == 4
    torch.testing.assert_close(got[0]["losses"], want["losses"], atol=1e-5, rtol=0)
    # The model and checkpoint saved from the shards are the whole stock model: one process loads them.
    for saved in ("final", "checkpoint-3"):
        assert_same_weights(
            load_file(tmp_path / "fsdp" / saved / "model.safetensors"),
            load_file(reference / saved / "model.safetensors"),
        )

    whole = want["whole_parameter_bytes"]
    assert want["parameter_bytes"] == whole
    assert sum(r["parameter_bytes"] for r in got) == whole  # every parameter held once, over the processes
    assert max(r["parameter_bytes"] for r in got) <= whole / replicas * 1.05  # 1 / replicas each
    # At a layer's forward, that layer and the embeddings and head are gathered whole: more than the shards, still
    # less than the whole model (one process holds all of it all the time).
    assert want["peak_parameter_bytes"] == whole
    assert all(r["parameter_bytes"] < r["peak_parameter_bytes"] < whole for r in got)
    # The 2 micro-batches of a step accumulate unsharded: one reduce-scatter per FSDP unit a step, not a micro-batch.
    assert all(r["fsdp_units"] > 1 and r["reduce_scatters"] == 4 * r["fsdp_units"] for r in got), got

    # Checkpoints (step 3) move both ways with the optimizer state: step 4 equals the uninterrupted run's.
    if replicas == 2:  # sharded checkpoint -> one process
        resumed = tmp_path / "resumed"
        one_process(resumed, replicas, steps=4, resume_from=tmp_path / "fsdp" / "checkpoint-3")
        losses = ranks(resumed, 1)[0]["losses"]
    else:  # one-process checkpoint -> sharded
        resumed = tmp_path / "resumed"
        sharded(resumed, replicas, steps=4, resume_from=reference / "checkpoint-3")
        losses = ranks(resumed, replicas)[0]["losses"]
    torch.testing.assert_close(losses[-1], want["losses"][3], atol=1e-5, rtol=0)
    assert_same_weights(
        load_file(resumed / "final" / "model.safetensors"), load_file(reference / "final" / "model.safetensors")
    )
