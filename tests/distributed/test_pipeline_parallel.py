"""Pipeline stages on 2 processes (gloo): losses and weights equal the single-process engine's."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.runtime.engine import Engine

from ..conftest import REPO_ROOT
from ..tiny_models import tiny_inputs, tiny_model
from .test_data_parallel import TORCHRUN, free_port, launch

WORKER = str(REPO_ROOT / "tests" / "distributed" / "pipeline_worker.py")
CLASS = "BertForQuestionAnswering"
STEPS = 3


def single_process(config: dict) -> tuple[list[float], dict[str, torch.Tensor]]:
    ipu_config = IPUConfig.from_dict(config)
    pipelined = to_pipelined(tiny_model(CLASS).train(), ipu_config, parallelize=True)
    initial = {k: v.clone() for k, v in pipelined.model.state_dict().items()}
    engine = Engine(pipelined, ipu_config, torch.optim.SGD(pipelined.parameters(), lr=0.1))
    rows = 2 * ipu_config.gradient_accumulation_steps * ipu_config.device_iterations
    losses = [float(engine.train_step(tiny_inputs(CLASS, batch=rows, seed=step))) for step in range(STEPS)]
    changed = {k: v for k, v in pipelined.model.state_dict().items() if not torch.equal(v, initial[k])}
    return losses, changed


@pytest.mark.parametrize(
    ("config", "schedule"),
    [
        ({"layers_per_ipu": [1, 3], "gradient_accumulation_steps": 4}, "1F1B"),
        ({"layers_per_ipu": [1, 3], "gradient_accumulation_steps": 4}, "GPipe"),
        ({"layers_per_ipu": [0, 4], "gradient_accumulation_steps": 2, "device_iterations": 2}, "1F1B"),
    ],
    ids=["1F1B", "GPipe", "embeddings-stage-device-iterations"],
)
def test_two_stages_on_two_processes_equal_one_process(tmp_path, config, schedule):
    run = launch(*TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}", WORKER, str(tmp_path),
                 json.dumps(config), schedule, str(STEPS))  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    want_losses, want_weights = single_process(config)
    got_losses = json.loads((tmp_path / "loss.json").read_text())
    assert got_losses == pytest.approx(want_losses, abs=1e-5)
    got = {**load_file(tmp_path / "rank0.safetensors"), **load_file(tmp_path / "rank1.safetensors")}
    assert got.keys() == want_weights.keys()
    for key, value in want_weights.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)


def test_too_few_micro_batches_for_the_stages(tmp_path):
    config = {"layers_per_ipu": [1, 3], "gradient_accumulation_steps": 1}
    run = launch(*TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}", WORKER, str(tmp_path),
                 json.dumps(config), "1F1B", "1")  # fmt: skip
    assert run.returncode != 0
    assert "gradient_accumulation_steps 1 is below the 2 pipeline stages" in run.stderr
