"""A tiny model trained by `PipelineEngine` with its stages on separate processes, sharded over the replicas of each
stage (`fsdp=True`), for tests/distributed/test_fsdp_stages.py.

    torchrun --nproc_per_node N fsdp_stages_worker.py OUT_DIR CONFIG_JSON STEPS CLASS

Replica r trains on rows [r x R, (r + 1) x R) of each host batch of `tiny_inputs` (R = 2 x accumulation x device
iterations), so the job sees the batch one process sees. Rank 0 writes OUT_DIR/model.safetensors (the whole model,
gathered from the stages and shards) and OUT_DIR/losses.json (mean over replicas); every rank writes
OUT_DIR/rank{r}.json with the parameter bytes it holds and the error a forward of the whole model gets.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.errors import IncompatibleIPUConfigError
from optimum_ipu.runtime.fsdp import full_state_dict, local_parameter_bytes
from optimum_ipu.runtime.stages.engine import PipelineEngine
from optimum_ipu.runtime.step import run_steps
from tests.distributed.collectives import count_reduce_scatters
from tests.distributed.pipeline_worker import tiny_for, write_results


def main() -> None:
    out, config_json, steps, class_name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    tiny_model, tiny_inputs = tiny_for(class_name).tiny_model, tiny_for(class_name).tiny_inputs
    dist.init_process_group("gloo")
    config = IPUConfig.from_dict(json.loads(config_json))
    pipelined = to_pipelined(tiny_model(class_name).train(), config, parallelize=True)
    model = pipelined.model
    whole = local_parameter_bytes(model.parameters())
    rows = 2 * config.gradient_accumulation_steps * config.device_iterations
    replicas = config.value("replication_factor")
    replica = dist.get_rank() // (dist.get_world_size() // replicas)  # rank = replica x stages + stage

    def host_batch(seed: int) -> dict[str, torch.Tensor]:
        batch = tiny_inputs(class_name, batch=rows * replicas, seed=seed)
        return {k: v[replica * rows : (replica + 1) * rows] for k, v in batch.items()}

    counts = [len(stage.layers) for stage in pipelined.stage_layout(inference=False)]
    engine = PipelineEngine(model, config, pipelined.stage_cut(), list(host_batch(0)), counts=counts, fsdp=True)
    sgd = torch.optim.SGD([p for p in engine.params if p.requires_grad], lr=0.1)
    held = local_parameter_bytes(model.parameters())
    losses = []
    sent = count_reduce_scatters()
    for step in range(steps):
        micro, iterations = config.gradient_accumulation_steps, config.device_iterations
        loss = run_steps(engine, sgd, host_batch(step), micro, iterations)[-1]
        dist.all_reduce(loss)  # every stage of a replica has its loss: the mean over the processes is the replicas'
        losses.append(float(loss.detach()) / dist.get_world_size())
    state = full_state_dict(model)
    try:  # the whole model cannot run here: other stages' layers are not held
        model(**host_batch(0))
        refusal = None
    except IncompatibleIPUConfigError as error:
        refusal = str(error)
    record = {"whole_parameter_bytes": whole, "parameter_bytes": held, "whole_forward": refusal}
    record |= {
        "reduce_scatters_per_step": sent["calls"] / steps,
        "reduce_scattered_bytes_per_step": sent["bytes"] / steps,
    }
    record["fsdp_units"] = sum(isinstance(m, FSDPModule) and any(True for _ in m.parameters()) for m in model.modules())
    record["fsdp_units"] += 1  # the stage's root (fsdp.StageRoot: whatever the stage holds besides its layers)
    write_results(out, record, state, losses)


if __name__ == "__main__":
    main()
