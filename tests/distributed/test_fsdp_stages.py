"""Pipeline stages on separate processes with their parameters sharded over each stage's replicas (FSDP2 on a
(replicas x stages) mesh): the losses and weights of one process, about 1 / (stages x replicas) of the parameters
held by each process, and a saved model that `transformers` loads in one process."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.runtime.engine import Engine
from optimum_ipu.runtime.stages.hold import held_parameter_names
from optimum_ipu.runtime.step import run_steps

from ..conftest import PYTHON, REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch, saved_weights
from .pipeline_worker import tiny_for

WORKER = str(REPO_ROOT / "tests" / "distributed" / "fsdp_stages_worker.py")
STEPS = 3


def one_process(config: dict, class_name: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same training in one process: its replicas and stages run in turn on the whole host batch."""
    tiny = tiny_for(class_name)
    ipu_config = IPUConfig.from_dict(config)
    pipelined = to_pipelined(tiny.tiny_model(class_name).train(), ipu_config, parallelize=True)
    engine, sgd = Engine(pipelined, ipu_config), torch.optim.SGD(pipelined.parameters(), lr=0.1)
    micro = ipu_config.gradient_accumulation_steps * ipu_config.replication_factor  # the replicas run in turn
    iterations = ipu_config.device_iterations
    batches = [tiny.tiny_inputs(class_name, batch=2 * micro * iterations, seed=step) for step in range(STEPS)]
    losses = [float(run_steps(engine, sgd, batch, micro, iterations)[-1]) for batch in batches]
    return losses, pipelined.model.state_dict()


def sharded_stages(out, config: dict, class_name: str) -> tuple[list[float], dict[str, torch.Tensor], list[dict]]:
    processes = len(config["layers_per_ipu"]) * config.get("replication_factor", 1)
    run = launch(
        *TORCHRUN,
        f"--nproc_per_node={processes}",
        f"--master_port={free_port()}",
        WORKER,
        str(out),
        json.dumps(config),
        str(STEPS),
        class_name,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(processes)]
    return json.loads((out / "losses.json").read_text()), load_file(out / "model.safetensors"), ranks


@pytest.mark.parametrize(
    ("class_name", "layout", "replicas"),
    [
        ("LlamaForCausalLM", [2, 2], 2),
        ("LlamaForCausalLM", [1, 3], 1),
        ("GPT2LMHeadModel", [2, 2], 2),  # the output projection is the input embedding: two stages train it
        ("T5ForConditionalGeneration", [2, 2], 2),  # the encoder's output travels with the decoder stage
    ],
    ids=["llama-2-stages-x-2-replicas", "llama-2-stages-x-1-replica", "gpt2-tied-2x2", "t5-encoder-decoder-2x2"],
)
def test_sharded_stages_equal_one_process(tmp_path, class_name, layout, replicas):
    config = {"layers_per_ipu": layout, "replication_factor": replicas, "gradient_accumulation_steps": 2}
    got_losses, got, ranks = sharded_stages(tmp_path, config, class_name)
    want_losses, want = one_process(config, class_name)
    assert got_losses == pytest.approx(want_losses, abs=1e-5)
    assert got.keys() == want.keys()  # the whole stock model, gathered from every stage and shard
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)
    # Each process holds its stage's layers, and the embeddings or heads that its stage runs, sharded over the
    # stage's replicas.
    whole, stage_bytes = bytes_per_stage(config, class_name)
    held = [r["parameter_bytes"] for r in ranks]
    print(f"{class_name} {layout} x {replicas}: held {held} of {whole} bytes")
    assert ranks[0]["whole_parameter_bytes"] == whole
    stages = len(layout)
    assert all("held by the process of another pipeline stage" in r["whole_forward"] for r in ranks)
    for stage, want_bytes in enumerate(stage_bytes):
        shards = held[stage::stages]  # rank = replica x stages + stage
        assert sum(shards) == want_bytes
        assert max(shards) <= want_bytes / replicas * 1.05
    # Gradients are reduce-scattered once per optimizer step (its 2 micro-batches accumulate unsharded first): one
    # reduce-scatter per FSDP unit a step, each sending the unit's unsharded gradients.
    print({r["reduce_scatters_per_step"]: r["reduce_scattered_bytes_per_step"] for r in ranks})
    for rank in ranks:
        assert replicas == 1 or rank["reduce_scatters_per_step"] == rank["fsdp_units"], rank


def bytes_per_stage(config: dict, class_name: str) -> tuple[int, list[int]]:
    """The whole model's parameter bytes, and those each stage holds: its layers, and the embeddings, norms and heads
    that it runs (`held_parameter_names`)."""
    pipelined = to_pipelined(tiny_for(class_name).tiny_model(class_name), IPUConfig.from_dict(config))
    model, counts = pipelined.model, config["layers_per_ipu"]
    params = dict(model.named_parameters())  # tied names once
    size = lambda names: sum(params[n].numel() * params[n].element_size() for n in names if n in params)  # noqa: E731
    stages = [held_parameter_names(model, pipelined.stage_cut(), counts, s) for s in range(len(counts))]
    return size(params), [size(names) for names in stages]


# ---------------------------------------------------------------- through IPUTrainer (tests/distributed/fsdp_worker.py)
# `--fsdp` with 2 stages x 2 replicas on 4 processes against the same job without it, whose stages keep the whole model
# and whose checkpoints are single-process ones (tests/distributed/test_pipeline_parallel.py): same losses, weights
# and checkpoint (model and optimizer state, in the one-process layout), about a quarter of the parameters each.
TRAINER_WORKER = str(REPO_ROOT / "tests" / "distributed" / "fsdp_worker.py")


def trainer_run(out, *flags: str, resume_from=None, processes: int = 4, stages: bool = True) -> list[dict]:
    """The worker's 4 steps (2 replicas, 2 micro-batches a step, a checkpoint at step 3) on `processes` processes (one:
    a plain `python`, the replicas and stages in turn), its model cut into 2 stages or not."""
    job = [*TORCHRUN, f"--nproc_per_node={processes}", f"--master_port={free_port()}"] if processes > 1 else [PYTHON]
    flags = ("--stages", *flags) if stages else flags
    run = launch(*job, TRAINER_WORKER, str(out), "2", "4", *flags, extra_env={"RESUME_FROM": str(resume_from or "")})
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(processes)]


@pytest.fixture(scope="module")
def whole_stages(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole-stages")
    return out, trainer_run(out)


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)


@pytest.fixture(scope="module")
def sharded_trainer_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded-stages")
    return out, trainer_run(out, "--fsdp")


def test_trainer_sharded_stages_equal_whole_stages(sharded_trainer_run, whole_stages):
    (want_dir, want), (got_dir, got) = whole_stages, sharded_trainer_run
    assert all(r["sharded"] for r in got) and not want[0]["sharded"]
    assert all(r["mesh"] == [["dp", "pp"], [2, 2]] for r in got + want)  # 2 replicas x 2 stages, both layouts
    assert got[0]["losses"] == pytest.approx(want[0]["losses"], abs=1e-5)
    for saved in ("final", "checkpoint-3"):
        assert_same_weights(saved_weights(got_dir / saved), load_file(want_dir / saved / "model.safetensors"))
    # The optimizer state is written by each stage, never gathered: one file a stage, an index, in the marker.
    checkpoint = got_dir / "checkpoint-3"
    parts = ["optimizer-00001-of-00002.safetensors", "optimizer-00002-of-00002.safetensors", "optimizer.index.json"]
    assert all((checkpoint / part).is_file() for part in parts) and not (checkpoint / "optimizer.pt").exists()
    marked = json.loads((checkpoint / "checkpoint_complete.json").read_text())["files"]
    assert set(parts) <= set(marked)
    # transformers loads the saved model in one process.
    model = transformers.AutoModelForCausalLM.from_pretrained(got_dir / "final")
    assert_same_weights(dict(model.state_dict()), load_file(want_dir / "final" / "model.safetensors"))

    whole = want[0]["whole_parameter_bytes"]
    held = [r["parameter_bytes"] for r in got]
    print(f"IPUTrainer --fsdp, 2 stages x 2 replicas: held {held} of {whole} bytes")
    assert all(r["parameter_bytes"] == whole for r in want)
    # half the layers, halved again by the shards; the embeddings with stage 0, the head with stage 1 (untied)
    assert max(held) < whole * 0.3
    # while a layer runs: its shards gathered, and (first step) one layer of another stage zero-filled for the probe
    assert max(r["peak_parameter_bytes"] for r in got) < whole * 0.6


@pytest.mark.parametrize(
    ("flags", "checkpoint_of"),
    [(["--fsdp"], "whole"), (["--fsdp"], "sharded"), ([], "sharded")],
    ids=["sharded-from-whole", "sharded-from-own", "whole-from-sharded"],
)
def test_trainer_resumes_from_either_layout(tmp_path, whole_stages, sharded_trainer_run, flags, checkpoint_of):
    """A checkpoint of stages that hold the whole model (one optimizer.pt) and one of sharded stages (an optimizer
    file per stage) resume in either layout: the last step equals the uninterrupted run's."""
    want_dir, want = whole_stages
    source = (want_dir if checkpoint_of == "whole" else sharded_trainer_run[0]) / "checkpoint-3"
    got = trainer_run(tmp_path, *flags, resume_from=source)
    assert got[0]["losses"][-1] == pytest.approx(want[0]["losses"][-1], abs=1e-5)
    assert_same_weights(saved_weights(tmp_path / "final"), load_file(want_dir / "final" / "model.safetensors"))


# ------------------------------------------------------------------------------------- resume in another layout
# The same run (2 replicas, 2 micro-batches a step) laid out four ways; a checkpoint of one resumes in another and its
# last step equals the uninterrupted run of the layout it resumes in. Each crossing changes one thing: stages on
# processes to one process and back (the one process runs both stages and both replicas in turn), the stage count on
# processes (2 stages sharded -> FSDP replicas, the optimizer state from a file a stage into FSDP shards), FSDP off,
# and a checkpoint written stage by stage (weight shards, an optimizer file a stage) into one process.
# The three crossings above (`test_trainer_resumes_from_either_layout`) are the rest of the matrix.
LAYOUTS = {
    "one-process": {"processes": 1, "stages": True},
    "fsdp-replicas": {"processes": 2, "stages": False, "flags": ("--fsdp",)},
}


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory, whole_stages, sharded_trainer_run):
    """Each layout's uninterrupted run (its folder and rank reports), made once when first asked for."""
    runs = {"stages": whole_stages, "fsdp-stages": sharded_trainer_run}

    def run(layout: str):
        if layout not in runs:
            out, spec = tmp_path_factory.mktemp(layout), LAYOUTS[layout]
            runs[layout] = (
                out,
                trainer_run(out, *spec.get("flags", ()), processes=spec["processes"], stages=spec["stages"]),
            )
        return runs[layout]

    return run


def resumed_in(tmp_path, layout: str, checkpoint) -> list[dict]:
    spec = {"stages": {}, "fsdp-stages": {"flags": ("--fsdp",)}, **LAYOUTS}[layout]
    kwargs = {k: v for k, v in spec.items() if k != "flags"}
    return trainer_run(tmp_path, *spec.get("flags", ()), resume_from=checkpoint, **kwargs)


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("stages", "one-process"),
        ("one-process", "stages"),
        ("fsdp-stages", "fsdp-replicas"),
        ("fsdp-replicas", "one-process"),
        ("fsdp-stages", "one-process"),
    ],
)
def test_a_checkpoint_resumes_in_another_layout_as_that_layout_runs_on(tmp_path, layout_runs, source, target):
    source_dir, _ = layout_runs(source)
    want_dir, want = layout_runs(target)
    got = resumed_in(tmp_path, target, source_dir / "checkpoint-3")
    # the checkpoint's 3 logged steps (its history), then step 4 run in the new layout
    assert got[0]["losses"] == pytest.approx(want[0]["losses"], abs=1e-5) and len(want[0]["losses"]) == 4
    assert_same_weights(saved_weights(tmp_path / "final"), saved_weights(want_dir / "final"))
