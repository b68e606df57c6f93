"""Pipeline stages on separate processes with their parameters sharded over each stage's replicas (FSDP2 on a
(replicas x stages) mesh): the losses and weights of one process, about 1 / (stages x replicas) of the parameters
held by each process, and a saved model that `transformers` loads in one process."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.runtime.engine import Engine

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch
from .pipeline_worker import tiny_for

WORKER = str(REPO_ROOT / "tests" / "distributed" / "fsdp_stages_worker.py")
STEPS = 3


def one_process(config: dict, class_name: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same training in one process: its replicas and stages run in turn on the whole host batch."""
    tiny = tiny_for(class_name)
    ipu_config = IPUConfig.from_dict(config)
    pipelined = to_pipelined(tiny.tiny_model(class_name).train(), ipu_config, parallelize=True)
    engine = Engine(pipelined, ipu_config, torch.optim.SGD(pipelined.parameters(), lr=0.1))
    rows = 2 * ipu_config.gradient_accumulation_steps * ipu_config.device_iterations * ipu_config.replication_factor
    losses = [float(engine.train_step(tiny.tiny_inputs(class_name, batch=rows, seed=step))) for step in range(STEPS)]
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
    [("LlamaForCausalLM", [2, 2], 2), ("LlamaForCausalLM", [1, 3], 1), ("GPT2LMHeadModel", [2, 2], 2)],
    ids=["llama-2-stages-x-2-replicas", "llama-2-stages-x-1-replica", "gpt2-tied-2-stages-x-2-replicas"],
)
def test_sharded_stages_equal_one_process(tmp_path, class_name, layout, replicas):
    config = {"layers_per_ipu": layout, "replication_factor": replicas, "gradient_accumulation_steps": 2}
    got_losses, got, ranks = sharded_stages(tmp_path, config, class_name)
    want_losses, want = one_process(config, class_name)
    assert got_losses == pytest.approx(want_losses, abs=1e-5)
    assert got.keys() == want.keys()  # the whole stock model, gathered from every stage and shard
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=key)
    # Each process holds its stage's layers, and the embeddings and heads that every stage runs, sharded over the
    # stage's replicas.
    whole, stage_bytes = bytes_per_stage(config, class_name)
    held = [r["parameter_bytes"] for r in ranks]
    print(f"{class_name} {layout} x {replicas}: held {held} of {whole} bytes")
    assert ranks[0]["whole_parameter_bytes"] == whole
    stages = len(layout)
    for stage, want_bytes in enumerate(stage_bytes):
        shards = held[stage::stages]  # rank = replica x stages + stage
        assert sum(shards) == want_bytes
        assert max(shards) <= want_bytes / replicas * 1.05


def bytes_per_stage(config: dict, class_name: str) -> tuple[int, list[int]]:
    """The whole model's parameter bytes, and those of each stage: its layers, the embeddings and heads."""
    pipelined = to_pipelined(tiny_for(class_name).tiny_model(class_name), IPUConfig.from_dict(config))
    size = lambda module: sum(p.numel() * p.element_size() for p in module.parameters())  # noqa: E731
    layers = [size(pipelined.model.get_submodule(path)) for path in pipelined.layer_paths()]
    rest = size(pipelined.model) - sum(layers)
    starts = [sum(config["layers_per_ipu"][:i]) for i in range(len(config["layers_per_ipu"]))]
    per_stage = [rest + sum(layers[s : s + n]) for s, n in zip(starts, config["layers_per_ipu"], strict=True)]
    return size(pipelined.model), per_stage
