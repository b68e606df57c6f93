"""Pipeline stages on 2 and 4 processes (gloo): losses and weights equal the single-process run's.

First the runtime's `PipelineEngine` alone, then through `IPUTrainer` (pipeline=2; pipeline=2 x replicas=2).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.runtime.engine import Engine
from optimum_ipu.runtime.step import run_steps

from ..conftest import PYTHON, REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch
from .pipeline_worker import tiny_for

WORKER = str(REPO_ROOT / "tests" / "distributed" / "pipeline_worker.py")
TRAINER_WORKER = str(REPO_ROOT / "tests" / "distributed" / "worker.py")
CLASS = "BertForQuestionAnswering"
STEPS = 3


def single_process(config: dict, class_name: str = CLASS) -> tuple[list[float], dict[str, torch.Tensor]]:
    tiny_model, tiny_inputs = tiny_for(class_name).tiny_model, tiny_for(class_name).tiny_inputs
    ipu_config = IPUConfig.from_dict(config)
    pipelined = to_pipelined(tiny_model(class_name).train(), ipu_config, parallelize=True)
    initial = {k: v.clone() for k, v in pipelined.model.state_dict().items()}
    engine, sgd = Engine(pipelined, ipu_config), torch.optim.SGD(pipelined.parameters(), lr=0.1)
    micro, iterations = ipu_config.gradient_accumulation_steps, ipu_config.device_iterations
    batches = [tiny_inputs(class_name, batch=2 * micro * iterations, seed=step) for step in range(STEPS)]
    losses = [float(run_steps(engine, sgd, batch, micro, iterations)[-1]) for batch in batches]
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
    run = launch(
        *TORCHRUN,
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        WORKER,
        str(tmp_path),
        json.dumps(config),
        schedule,
        str(STEPS),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    want_losses, want_weights = single_process(config)
    got_losses = json.loads((tmp_path / "loss.json").read_text())
    assert got_losses == pytest.approx(want_losses, abs=1e-5)
    got = {**load_file(tmp_path / "rank0.safetensors"), **load_file(tmp_path / "rank1.safetensors")}
    assert got.keys() == want_weights.keys()
    for key, value in want_weights.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)


def _assert_processes_equal_one(tmp_path, config, class_name, processes, extra_env=None):
    run = launch(
        *TORCHRUN,
        f"--nproc_per_node={processes}",
        f"--master_port={free_port()}",
        WORKER,
        str(tmp_path),
        json.dumps(config),
        "1F1B",
        str(STEPS),
        class_name,
        extra_env=extra_env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    want_losses, want_weights = single_process(config, class_name)
    assert json.loads((tmp_path / "loss.json").read_text()) == pytest.approx(want_losses, abs=1e-5)
    got = {}
    for rank in range(processes):
        got.update(load_file(tmp_path / f"rank{rank}.safetensors"))
    assert got.keys() == want_weights.keys()
    for key, value in want_weights.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=f"{class_name} {key}")


def test_every_stage_trains_on_the_last_stages_batches(tmp_path):
    """Stages that collate other batches (a collator's random masks, once dropout has consumed each process's generator
    its own way) train on the last stage's: the one-process numbers on those, not embeddings of one batch scored
    against another's labels (which trained a masked LM on mismatched masks, silently)."""
    config = {"layers_per_ipu": [1, 1, 2], "gradient_accumulation_steps": 3}
    _assert_processes_equal_one(tmp_path, config, "BertForMaskedLM", 3, extra_env={"SKEWED_BATCHES": "1"})


# Encoder-decoder models: the encoder's output travels with every decoder stage. 2 processes put the seam
# between the stages; 4 put one stage on each side of it and one inside each stack.
@pytest.mark.parametrize(
    "class_name",
    [
        "T5ForConditionalGeneration",
        "MT5ForConditionalGeneration",
        "BartForConditionalGeneration",
        "WhisperForConditionalGeneration",
    ],
)
@pytest.mark.parametrize("layout", [[2, 2], [1, 1, 1, 1]], ids=["2-processes", "4-processes"])
def test_encoder_decoder_stages_on_processes_equal_one_process(tmp_path, class_name, layout):
    config = {"layers_per_ipu": layout, "gradient_accumulation_steps": 4}
    _assert_processes_equal_one(tmp_path, config, class_name, len(layout))


def test_llama_stages_on_processes_equal_one_process(tmp_path):
    # grouped-query attention, rotary positions computed on every stage, untied output projection
    config = {"layers_per_ipu": [1, 3], "gradient_accumulation_steps": 2}
    _assert_processes_equal_one(tmp_path, config, "LlamaForCausalLM", 2)


def test_too_few_micro_batches_for_the_stages(tmp_path):
    config = {"layers_per_ipu": [1, 3], "gradient_accumulation_steps": 1}
    run = launch(
        *TORCHRUN,
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        WORKER,
        str(tmp_path),
        json.dumps(config),
        "1F1B",
        "1",
    )
    assert run.returncode != 0
    assert "`gradient_accumulation_steps` 1 is below the 2 pipeline stages" in run.stderr


# ---------------------------------------------------------------- through IPUTrainer (tests/distributed/worker.py)
PIPELINE_2 = {"layers_per_ipu": [2, 2], "ipus_per_replica": 2, "gradient_accumulation_steps": 2}


@pytest.fixture(scope="module")
def trainer_one_process(tmp_path_factory):
    """The reference: the pipeline x replica config of the tests below, its stages and replicas in one process."""
    out = tmp_path_factory.mktemp("trainer-one")
    config = json.dumps({**PIPELINE_2, "replication_factor": 2})
    run = launch(PYTHON, TRAINER_WORKER, str(out), config, "3")
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def trainer_result(out) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((out / "result.json").read_text()), load_file(out / "final" / "model.safetensors")


def assert_same_training(got_dir, want_dir) -> None:
    (got, got_weights), (want, want_weights) = trainer_result(got_dir), trainer_result(want_dir)
    assert got["step"] == want["step"]
    assert got["losses"] == pytest.approx(want["losses"], abs=1e-5)
    assert got_weights.keys() == want_weights.keys()  # the stock layout, every stage's weights
    for key, value in want_weights.items():
        torch.testing.assert_close(got_weights[key], value, atol=1e-5, rtol=0, msg=key)


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_trainer_two_stages_on_two_processes_equal_one_process(tmp_path, schedule):
    config = json.dumps(PIPELINE_2)
    reference = tmp_path / "one"
    run = launch(PYTHON, TRAINER_WORKER, str(reference), config, "3")
    assert run.returncode == 0, run.stderr[-3000:]
    two = tmp_path / "two"
    run = launch(
        *TORCHRUN,
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        TRAINER_WORKER,
        str(two),
        config,
        "3",
        extra_env={"PIPELINE_SCHEDULE": schedule},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((two / "result.json").read_text())["world_size"] == 2
    assert_same_training(two, reference)
    if schedule == "1F1B":
        # the 2-process checkpoint is a single-process one: one process resumes it, and the other way round
        resumed = launch(
            PYTHON,
            TRAINER_WORKER,
            str(tmp_path / "resumed-one"),
            config,
            "4",
            extra_env={"RESUME_FROM": str(two / "checkpoint-3")},
        )
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        resumed_two = launch(
            *TORCHRUN,
            "--nproc_per_node=2",
            f"--master_port={free_port()}",
            TRAINER_WORKER,
            str(tmp_path / "resumed-two"),
            config,
            "4",
            extra_env={"RESUME_FROM": str(reference / "checkpoint-3")},
        )
        assert resumed_two.returncode == 0, resumed_two.stderr[-3000:]
        assert_same_training(tmp_path / "resumed-two", tmp_path / "resumed-one")


def test_trainer_two_stages_by_two_replicas_on_four_processes(tmp_path, trainer_one_process):
    config = json.dumps({**PIPELINE_2, "replication_factor": 2})
    run = launch(
        *TORCHRUN, "--nproc_per_node=4", f"--master_port={free_port()}", TRAINER_WORKER, str(tmp_path), config, "3"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((tmp_path / "result.json").read_text())["world_size"] == 4
    assert_same_training(tmp_path, trainer_one_process)
