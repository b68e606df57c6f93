"""A tiny BERT trained with pipeline stages on separate processes (PipelineEngine), for the tests.

    torchrun --nproc_per_node 2 pipeline_worker.py OUT_DIR CONFIG_JSON SCHEDULE STEPS

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
from optimum_ipu.runtime.pipeline_parallel import PipelineEngine
from tests.tiny_models import tiny_inputs, tiny_model

CLASS = "BertForQuestionAnswering"


def main() -> None:
    out, config_json, schedule, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    dist.init_process_group("gloo")
    config = IPUConfig.from_dict(json.loads(config_json))
    pipelined = to_pipelined(tiny_model(CLASS).train(), config, parallelize=True)
    initial = {k: v.clone() for k, v in pipelined.model.state_dict().items()}
    rows = 2 * config.gradient_accumulation_steps * config.device_iterations
    keys = list(tiny_inputs(CLASS, batch=rows))
    engine = PipelineEngine(pipelined.model, config, pipelined.layer_paths(), keys,
                            lambda params: torch.optim.SGD(params, lr=0.1), schedule=schedule)  # fmt: skip
    losses = [float(engine.train_step(tiny_inputs(CLASS, batch=rows, seed=step))) for step in range(steps)]
    changed = {k: v.contiguous() for k, v in pipelined.model.state_dict().items()
               if k in initial and not torch.equal(v, initial[k])}  # fmt: skip
    os.makedirs(out, exist_ok=True)
    save_file(changed, os.path.join(out, f"rank{dist.get_rank()}.safetensors"))
    if dist.get_rank() == 0:
        with open(os.path.join(out, "loss.json"), "w") as f:
            json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
