"""Wav2Vec2ForPreTraining trained with its stages on separate processes (PipelineEngine), for the tests.

    torchrun --nproc_per_node 2 pretraining_stages_worker.py OUT_DIR CONFIG_JSON STEPS [stable]

`stable`: the model of the pretraining recipes (`do_stable_layer_norm`, `feat_extract_norm="layer"`): the encoder's
layer norm then runs after the last layer, on the last stage.

The engine is told the plan's `process_stage_inputs`, as `IPUTrainer` tells it. It is first handed a batch without the
sampled negatives (OUT/refused.txt: the message), then trained as `pipeline_worker.py` trains its models: each rank
writes OUT/rank{r}.safetensors with the parameters its stage changed, rank 0 OUT/loss.json.
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
from tests.tiny_models_vision_speech import tiny_inputs, tiny_model

CLASS = "Wav2Vec2ForPreTraining"


def pretraining_model(stable: bool) -> torch.nn.Module:
    """The tiny Wav2Vec2ForPreTraining, with the recipes' stable layer norm if `stable`, in training mode."""
    model = tiny_model(CLASS)
    if stable:
        config = model.config
        config.do_stable_layer_norm, config.feat_extract_norm = True, "layer"
        torch.manual_seed(0)
        model = type(model)(config)
    return model.train()


def main() -> None:
    out, config_json, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    stable = sys.argv[4:] == ["stable"]
    dist.init_process_group("gloo")
    config = IPUConfig.from_dict(json.loads(config_json))
    pipelined = to_pipelined(pretraining_model(stable), config, parallelize=True)
    initial = {k: v.clone() for k, v in pipelined.model.state_dict().items()}
    micro = config.gradient_accumulation_steps
    rows = 2 * micro
    cut = pipelined.stage_cut()
    engine = PipelineEngine(
        pipelined.model,
        config,
        cut,
        counts=layers_per_stage(config, len(cut.layer_paths), inference=False),
        required_inputs=pipelined.plan.process_stage_inputs,
    )
    os.makedirs(out, exist_ok=True)
    try:
        unmasked = {k: v for k, v in tiny_inputs(CLASS, batch=rows).items() if k != "sampled_negative_indices"}
        run_steps(engine, torch.optim.SGD(engine.params, lr=0.0), unmasked, micro)
    except ValueError as error:
        with open(os.path.join(out, f"refused{dist.get_rank()}.txt"), "w") as f:
            f.write(str(error))
    sgd = torch.optim.SGD([p for p in engine.params if p.requires_grad], lr=0.1)
    batches = [tiny_inputs(CLASS, batch=rows, seed=step) for step in range(steps)]
    losses = [float(run_steps(engine, sgd, batch, micro)[-1]) for batch in batches]
    changed = {
        k: v.clone() for k, v in pipelined.model.state_dict().items() if k in initial and not torch.equal(v, initial[k])
    }
    save_file(changed, os.path.join(out, f"rank{dist.get_rank()}.safetensors"))
    if dist.get_rank() == 0:
        with open(os.path.join(out, "loss.json"), "w") as f:
            json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
