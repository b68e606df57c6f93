"""Full parameter sharding (FSDP2, `--fsdp`) of a tiny Llama over 2 and 4 gloo processes: the losses and weights of
one process, each process holding 1 / replicas of the parameters, and a saved model that loads in one process."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from ..conftest import PYTHON, REPO_ROOT
from .test_data_parallel import TORCHRUN, free_port, launch

WORKER = str(REPO_ROOT / "tests" / "distributed" / "fsdp_worker.py")
STEPS = "3"


def run_result(out, processes: int) -> tuple[list[dict], dict[str, torch.Tensor]]:
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(processes)]
    return ranks, load_file(out / "final" / "model.safetensors")


@pytest.mark.parametrize("replicas", [2, 4])
def test_sharded_parameters_give_one_process_numbers(tmp_path, replicas):
    # One process runs the replicas in turn (its reference numbers); --fsdp there has nothing to shard over.
    one = launch(PYTHON, WORKER, str(tmp_path / "one"), str(replicas), STEPS, "--fsdp")
    assert one.returncode == 0, one.stderr[-3000:]
    assert "nothing to shard over" in one.stderr
    sharded = launch(*TORCHRUN, f"--nproc_per_node={replicas}", f"--master_port={free_port()}", WORKER,
                     str(tmp_path / "fsdp"), str(replicas), STEPS, "--fsdp")  # fmt: skip
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    (reference,), reference_weights = run_result(tmp_path / "one", 1)
    ranks, weights = run_result(tmp_path / "fsdp", replicas)

    assert not reference["sharded"] and all(r["sharded"] for r in ranks)
    torch.testing.assert_close(ranks[0]["losses"], reference["losses"], atol=1e-5, rtol=0)
    assert len(ranks[0]["losses"]) == int(STEPS)
    # The model saved from the shards is the whole stock model: one process loads it.
    assert weights.keys() == reference_weights.keys()
    for key, value in reference_weights.items():
        torch.testing.assert_close(weights[key], value, atol=1e-5, rtol=0, msg=key)

    whole = reference["whole_parameter_bytes"]
    assert reference["parameter_bytes"] == whole
    assert sum(r["parameter_bytes"] for r in ranks) == whole  # every parameter held once, over the processes
    assert max(r["parameter_bytes"] for r in ranks) <= whole / replicas * 1.05  # 1 / replicas each
