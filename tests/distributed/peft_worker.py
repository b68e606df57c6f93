"""LoRA adapters (peft) on a tiny Llama in 2 pipeline stages, for tests/test_peft.py:

    python peft_worker.py OUT_DIR [--fsdp [--stages]] [--tp] [--from MODEL_DIR]

run in one process (the stages in turn) or under `torchrun --nproc_per_node 2` (a stage per process); with `--fsdp`,
2 replicas of the whole model instead of 2 stages, their parameters sharded under torchrun (`--stages`: of each of
2 stages, 4 processes); `--tp`: the whole model split over 2 processes (`tensor_parallel_size=2`), adapters
included. With the environment variable RESUME_FROM, training resumes from that checkpoint. With
`--from MODEL_DIR` (the tiny Llama saved there), each process of stages under torchrun loads only its stage
(`optimum_ipu.AutoModelForCausalLM`) before LoRA wraps it. Rank 0 writes OUT_DIR/losses.json; a checkpoint is
written at step 2 and the model saved to OUT_DIR/final (peft's adapter files).
"""

from __future__ import annotations

import json
import os
import sys

import peft
import torch
from torch.distributed.tensor import DTensor

from optimum_ipu import AutoModelForCausalLM, IPUConfig, IPUTrainer, IPUTrainingArguments
from tests.distributed.fsdp_worker import tiny_llama, unevenly_padded


def main() -> None:
    out = sys.argv[1]
    fsdp = "--fsdp" in sys.argv[2:]
    args = IPUTrainingArguments(
        output_dir=out,
        per_device_train_batch_size=2,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        lr_scheduler_type="constant",
        report_to=[],
        seed=7,
        save_strategy="steps",
        save_steps=2,
        disable_tqdm=True,
        ddp_timeout=60,
        fsdp=fsdp,
    )
    layout = {"replication_factor": 2} if fsdp else {}
    if "--tp" in sys.argv[2:]:  # every layer, its adapters included, split over 2 processes
        layout = {"tensor_parallel_size": 2}
    elif not fsdp or "--stages" in sys.argv[2:]:  # --fsdp --stages: 2 stages x 2 replicas (4 processes)
        layout.update(layers_per_ipu=[2, 2], ipus_per_replica=2)
    config = IPUConfig(gradient_accumulation_steps=2, **layout)
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    if "--from" in sys.argv:  # stage-local under torchrun: the other stages' layers (and adapters) stay on meta
        folder = sys.argv[sys.argv.index("--from") + 1]
        model = AutoModelForCausalLM.from_pretrained(folder, ipu_config=config).model
    else:
        model = tiny_llama()
    torch.manual_seed(3)  # LoRA's A matrices: the same in every process
    model = peft.get_peft_model(model, lora)
    other_stages_on_meta = any(p.is_meta for p in model.parameters())  # the base and adapters of the other stage
    trainer = IPUTrainer(model, config, args, train_dataset=unevenly_padded())
    trainer.train(resume_from_checkpoint=os.environ.get("RESUME_FROM") or None)
    trainer.save_model(os.path.join(out, "final"))
    # --fsdp under torchrun: each process holds shards (DTensors) of the parameters
    sharded = any(isinstance(p, DTensor) for p in trainer.model.parameters())
    with open(os.path.join(out, f"rank{trainer.args.process_index}.json"), "w", encoding="utf-8") as file:
        json.dump({"sharded": sharded, "other_stages_on_meta": other_stages_on_meta}, file)
    if trainer.is_world_process_zero():
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        with open(os.path.join(out, "losses.json"), "w", encoding="utf-8") as file:
            json.dump(losses, file)


if __name__ == "__main__":
    main()
