"""A tiny model trained with pipeline stages on separate processes (PipelineEngine), for the tests.

    torchrun --nproc_per_node 2 pipeline_worker.py OUT_DIR CONFIG_JSON SCHEDULE STEPS [CLASS]

CLASS defaults to BertForQuestionAnswering; any class of tests/tiny_models*.py. `SKEWED_BATCHES=1` feeds every stage
but the last other batches than the last stage's.

Each rank writes OUT_DIR/rank{r}.safetensors with the parameters its stage changed, and OUT_DIR/loss.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.models.layout import layers_per_stage
from optimum_ipu.runtime.stages.engine import PipelineEngine
from optimum_ipu.runtime.step import run_steps
from tests import tiny_models, tiny_models_vision_speech

CLASS = "BertForQuestionAnswering"


def tiny_for(class_name: str):
    """The tiny-models module that builds `class_name`."""
    return tiny_models_vision_speech if class_name in tiny_models_vision_speech.CLASSES else tiny_models


def write_rank_record(out: str, record: dict) -> None:
    """This rank's OUT/rank{r}.json (`record`)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(record, f)


def write_results(out: str, record: dict, state: dict[str, torch.Tensor], losses: list[float]) -> None:
    """Every rank's OUT/rank{r}.json (`record`); rank 0's OUT/model.safetensors (`state`) and OUT/losses.json. Then the
    process group is destroyed."""
    write_rank_record(out, record)
    if dist.get_rank() == 0:
        save_file({k: v.clone() for k, v in state.items()}, os.path.join(out, "model.safetensors"))
        with open(os.path.join(out, "losses.json"), "w") as f:
            json.dump(losses, f)
    dist.destroy_process_group()


def main() -> None:
    out, config_json, schedule, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    class_name = sys.argv[5] if len(sys.argv) > 5 else CLASS
    tiny_model, tiny_inputs = tiny_for(class_name).tiny_model, tiny_for(class_name).tiny_inputs
    dist.init_process_group("gloo")
    config = IPUConfig.from_dict(json.loads(config_json))
    pipelined = to_pipelined(tiny_model(class_name).train(), config, parallelize=True)
    initial = {k: v.clone() for k, v in pipelined.model.state_dict().items()}
    rows = 2 * config.gradient_accumulation_steps * config.device_iterations
    keys = list(tiny_inputs(class_name, batch=rows))
    cut = pipelined.stage_cut()
    engine = PipelineEngine(
        pipelined.model,
        config,
        cut,
        keys,
        counts=layers_per_stage(config, len(cut.layer_paths), inference=False),
        schedule=schedule,
    )
    sgd = torch.optim.SGD([p for p in engine.params if p.requires_grad], lr=0.1)
    micro, iterations = config.gradient_accumulation_steps, config.device_iterations
    # SKEWED_BATCHES=1: every stage but the last collates other batches (as a random collator would after dropout
    # consumed each process's generator differently); the last stage's are the ones every stage must train on
    skewed = os.environ.get("SKEWED_BATCHES") == "1" and dist.get_rank() < dist.get_world_size() - 1
    batches = [tiny_inputs(class_name, batch=rows, seed=step + 100 * skewed) for step in range(steps)]
    losses = [float(run_steps(engine, sgd, batch, micro, iterations)[-1]) for batch in batches]
    changed = {
        k: v.clone()
        for k, v in pipelined.model.state_dict().items()  # clone: tied weights saved apart
        if k in initial and not torch.equal(v, initial[k])
    }
    os.makedirs(out, exist_ok=True)
    save_file(changed, os.path.join(out, f"rank{dist.get_rank()}.safetensors"))
    if dist.get_rank() == 0:
        with open(os.path.join(out, "loss.json"), "w") as f:
            json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
