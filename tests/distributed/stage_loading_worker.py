"""A tiny pretrained model trained by `PipelineEngine` with its stages on separate processes, each process holding
its stage only, for tests/distributed/test_stage_loading.py.

    torchrun --nproc_per_node N stage_loading_worker.py OUT_DIR CONFIG_JSON STEPS CLASS MODEL_DIR MODE

MODE `stage`: `load_stage` builds the model on the meta device and reads this stage's tensors only; MODE `whole`:
`from_pretrained` loads the whole model, then `hold_stage` frees what the stage does not run (the path before
stage-local loading). Replica r trains on its rows of each host batch. Rank 0 writes OUT_DIR/model.safetensors (the
weights gathered from the stages) and OUT_DIR/losses.json; every rank writes OUT_DIR/rank{r}.json with the
parameter bytes it holds.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import transformers

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.models.layout import layers_per_stage
from optimum_ipu.models.stage_loading import load_stage
from optimum_ipu.runtime.fsdp import full_state_dict, local_parameter_bytes, stage_mesh
from optimum_ipu.runtime.stages.engine import PipelineEngine
from optimum_ipu.runtime.stages.hold import hold_stage
from optimum_ipu.runtime.step import run_steps
from tests.distributed.pipeline_worker import tiny_for, write_results


def main() -> None:
    out, config_json, steps, class_name, model_dir, mode = sys.argv[1:7]
    dist.init_process_group("gloo")
    config = IPUConfig.from_dict(json.loads(config_json))
    if mode == "stage":
        pipelined = load_stage(class_name, model_dir, config, device=torch.device("cpu"))
    else:
        model = getattr(transformers, class_name).from_pretrained(model_dir)
        pipelined = to_pipelined(model, config, parallelize=True)
        counts = layers_per_stage(config, pipelined.num_layers, inference=False)
        mesh = stage_mesh(config.value("replication_factor"), len(counts), torch.device("cpu"))
        hold_stage(model, pipelined.stage_cut(), counts, mesh)
    model = pipelined.model.train()
    held = local_parameter_bytes(model.parameters())
    rows = 2 * config.gradient_accumulation_steps * config.device_iterations
    replicas = config.value("replication_factor")
    replica = dist.get_rank() // (dist.get_world_size() // replicas)
    tiny_inputs = tiny_for(class_name).tiny_inputs

    def host_batch(seed: int) -> dict[str, torch.Tensor]:
        batch = tiny_inputs(class_name, batch=rows * replicas, seed=seed)
        return {k: v[replica * rows : (replica + 1) * rows] for k, v in batch.items()}

    counts = layers_per_stage(config, pipelined.num_layers, inference=False)
    engine = PipelineEngine(model, config, pipelined.stage_cut(), list(host_batch(0)), counts=counts)
    sgd = torch.optim.SGD([p for p in engine.params if p.requires_grad], lr=0.1)
    losses = []
    for step in range(int(steps)):
        micro, iterations = config.gradient_accumulation_steps, config.device_iterations
        loss = run_steps(engine, sgd, host_batch(step), micro, iterations)[-1]
        dist.all_reduce(loss)
        losses.append(float(loss) / dist.get_world_size())
    state = full_state_dict(model)
    write_results(out, {"parameter_bytes": held}, state, losses)


if __name__ == "__main__":
    main()
