"""Interleaved schedules with several pipeline stages per process (issue 26, item 5): `Interleaved1F1B` and
`ZeroBubble` (torch's `ScheduleInterleavedZeroBubble`) over 4 stages on 2 gloo processes (process 0 runs stages 0
and 2, process 1 stages 1 and 3) give the losses and weights of the 4 stages run in turn in one process; a schedule
that runs one stage per process is refused, naming the flag."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from optimum_ipu import IPUConfig
from optimum_ipu.errors import IncompatibleIPUConfigError
from optimum_ipu.topology import check_processes, stages_per_process

from ..conftest import PYTHON
from ..helpers import TORCHRUN, free_port, launch
from .test_pipeline_parallel import STEPS, TRAINER_WORKER, WORKER, assert_same_training, single_process


@pytest.mark.parametrize(
    ("schedule", "class_name", "layout"),
    [
        ("Interleaved1F1B", "BertForQuestionAnswering", [1, 1, 1, 1]),
        ("ZeroBubble", "BertForQuestionAnswering", [1, 1, 1, 1]),
        # tied input and output embeddings: their gradients live on stage 0 (process 0) and stage 3 (process 1)
        ("ZeroBubble", "GPT2LMHeadModel", [1, 1, 1, 1]),
    ],
    ids=["Interleaved1F1B", "ZeroBubble", "ZeroBubble-tied-gpt2"],
)
def test_interleaved_schedules_on_two_processes_equal_one_process(tmp_path, schedule, class_name, layout):
    config = {"layers_per_ipu": layout, "gradient_accumulation_steps": 4}
    run = launch(
        *TORCHRUN,
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        WORKER,
        str(tmp_path),
        json.dumps(config),
        schedule,
        str(STEPS),
        class_name,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    want_losses, want_weights = single_process(config, class_name)
    assert json.loads((tmp_path / "loss.json").read_text()) == pytest.approx(want_losses, abs=1e-5)
    got = {**load_file(tmp_path / "rank0.safetensors"), **load_file(tmp_path / "rank1.safetensors")}
    assert got.keys() == want_weights.keys()
    for key, value in want_weights.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=f"{schedule} {key}")


def test_stages_per_process():
    config = IPUConfig(layers_per_ipu=[1, 1, 1, 1], gradient_accumulation_steps=4)
    assert stages_per_process(config, 2, "Interleaved1F1B") == 2
    assert stages_per_process(config, 4, "1F1B") == 1  # one stage each
    check_processes(config, 2, stages_per_process=2)
    with pytest.raises(IncompatibleIPUConfigError, match=r"^--pipeline_schedule GPipe runs one pipeline stage per"):
        stages_per_process(config, 2, "GPipe")
    few = IPUConfig(layers_per_ipu=[1, 1, 1, 1], gradient_accumulation_steps=1)
    with pytest.raises(IncompatibleIPUConfigError, match="`gradient_accumulation_steps` 1 is below the 2"):
        check_processes(few, 2, stages_per_process=2)


def test_trainer_four_stages_on_two_processes_equal_one_process(tmp_path):
    """Through `IPUTrainer` (--pipeline_schedule ZeroBubble): 4 stages on 2 processes train as 4 in turn in one."""
    config = json.dumps({"layers_per_ipu": [1, 1, 1, 1], "gradient_accumulation_steps": 4})
    reference = tmp_path / "one"
    run = launch(PYTHON, TRAINER_WORKER, str(reference), config, "3")
    assert run.returncode == 0, run.stderr[-3000:]
    two = tmp_path / "two"
    env = {"PIPELINE_SCHEDULE": "ZeroBubble"}
    run = launch(
        *TORCHRUN,
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        TRAINER_WORKER,
        str(two),
        config,
        "3",
        extra_env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((two / "result.json").read_text())["world_size"] == 2
    assert_same_training(two, reference)


def test_auto_layers_agree_over_processes(tmp_path):
    """`layers_per_ipu: "auto"` on 2 processes: each measures, rank 0's split is taken by both (a different split on
    each would hang the schedule), and training gives one process's numbers (any split does)."""
    config = {"layers_per_ipu": "auto", "ipus_per_replica": 2, "gradient_accumulation_steps": 2}
    run = launch(
        *TORCHRUN,
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        WORKER,
        str(tmp_path),
        json.dumps(config),
        "1F1B",
        str(STEPS),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert 'layers_per_ipu "auto": [' in run.stderr
    want_losses, want_weights = single_process(config)
    assert json.loads((tmp_path / "loss.json").read_text()) == pytest.approx(want_losses, abs=1e-5)
    got = {**load_file(tmp_path / "rank0.safetensors"), **load_file(tmp_path / "rank1.safetensors")}
    for key, value in want_weights.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)
