"""A tiny Llama trained by IPUTrainer, launched by tests/distributed/test_fsdp.py (torchrun or one process).

    python fsdp_worker.py OUT_DIR REPLICAS MAX_STEPS [--fsdp] [--stages] [--tp] [--serialized] [--stage-local]
        [--evaluate] [--push] [--best]

Every rank writes OUT_DIR/rank{RANK}.json (its parameter bytes); rank 0 also the logged losses. A checkpoint is
written at step 3 and the model saved whole to OUT_DIR/final (stock layout), gathered from the shards under
--fsdp. `--stages` cuts the model into 2 pipeline stages; `--tp` splits each layer over 2 processes
(`tensor_parallel_size=2`); `--serialized` sets both serialization factors to 2. With the environment variable
RESUME_FROM, training resumes from that checkpoint. `--stage-local` loads the model saved in the folder PRETRAINED
(environment) with `optimum_ipu.AutoModelForCausalLM`, each process reading only its stage; `--evaluate` evaluates
after training (the metrics go to rank{RANK}.json); `--push` pushes every save and the final model to the fake Hub in
the folder FAKE_HUB (environment; `fake_hub.py`); `--best` keeps the best checkpoint (`keep_the_best`).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import datasets
import torch
import transformers
from torch.distributed.fsdp import FSDPModule
from transformers import default_data_collator

from optimum_ipu import AutoModelForCausalLM, IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.runtime.fsdp import local_parameter_bytes
from tests.distributed.collectives import count_reduce_scatters


def tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(config)


def unevenly_padded(rows: int = 64, seq: int = 16, seed: int = 0) -> datasets.Dataset:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, seq + 1, (rows,), generator=generator)
    mask = (torch.arange(seq) < lengths[:, None]).long()
    ids = torch.randint(1, 128, (rows, seq), generator=generator) * mask
    labels = ids.masked_fill(mask == 0, -100)
    return datasets.Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "labels": labels.tolist()}
    )


def collated_other_on_all_but_last_stages(stages: int) -> Any:
    """`--skew`: a collator that gives every process but each replica's last stage other batches than the last stage's
    (ids remapped, labels from them), as a collator drawing at random does once dropout has consumed each process's
    generator its own way: the stages must all take the last stage's."""
    rank, processes = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    other = processes > 1 and rank % stages != stages - 1

    def collate(features: list[dict]) -> dict[str, torch.Tensor]:
        batch = default_data_collator(features)
        if other:
            batch["input_ids"] = (batch["input_ids"] * 7 + 3) % 127 + 1
            batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return batch

    return collate


def track_peak_parameter_bytes(model: torch.nn.Module) -> dict[str, int]:
    """The most parameter bytes this process holds when a layer starts its forward: FSDP has gathered that layer
    (and keeps the embeddings and head gathered) by then, and may be prefetching the next one."""
    peak = {"bytes": 0}

    def measure(module: torch.nn.Module, args: tuple) -> None:
        peak["bytes"] = max(peak["bytes"], local_parameter_bytes(model.parameters()))

    for layer in model.model.layers:
        layer.register_forward_pre_hook(measure)  # after FSDP's own pre-forward hook, which gathers
    return peak


def push_to_fake_hub() -> dict:
    """With `--push`: `push_to_hub` on every save, to the fake Hub in $FAKE_HUB (`fake_hub.py`)."""
    if "--push" not in sys.argv[4:]:
        return {}
    from tests.distributed import fake_hub

    fake_hub.install(os.environ["FAKE_HUB"])
    return {"push_to_hub": True, "hub_model_id": "me/tiny-llama", "hub_token": "hf_fake"}


def keep_the_best() -> dict:
    """With `--best`: evaluate and save every 3 steps, keep one checkpoint besides the best (the lowest evaluation
    loss), and load the best at the end."""
    if "--best" not in sys.argv[4:]:
        return {}
    return {
        "eval_strategy": "steps",
        "eval_steps": 3,
        "save_total_limit": 1,
        "load_best_model_at_end": True,
        "metric_for_best_model": "loss",
    }


def main() -> None:
    out, replicas, max_steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    fsdp = "--fsdp" in sys.argv[4:]
    args = IPUTrainingArguments(
        output_dir=out,
        per_device_train_batch_size=2,
        max_steps=max_steps,
        learning_rate=1e-3,
        logging_steps=1,
        lr_scheduler_type="constant",
        report_to=[],
        seed=7,
        save_strategy="steps",
        save_steps=3,
        disable_tqdm=True,
        ddp_timeout=60,
        fsdp=fsdp,
        **push_to_fake_hub(),
        **keep_the_best(),
    )
    stages = {"layers_per_ipu": [2, 2], "ipus_per_replica": 2} if "--stages" in sys.argv[4:] else {}
    if "--tp" in sys.argv[4:]:  # each replica's layers split over 2 processes
        stages["tensor_parallel_size"] = 2
    if "--serialized" in sys.argv[4:]:  # Optimum Graphcore's chunked embedding and projection
        stages.update(embedding_serialization_factor=2, projection_serialization_factor=2)
    config = IPUConfig(replication_factor=replicas, gradient_accumulation_steps=2, **stages)
    model = tiny_llama()
    whole = local_parameter_bytes(model.parameters())
    if "--stage-local" in sys.argv[4:]:  # the same weights, each process reading its stage only
        model = AutoModelForCausalLM.from_pretrained(os.environ["PRETRAINED"], ipu_config=config).model
    evaluate = "--evaluate" in sys.argv[4:]
    eval_dataset = unevenly_padded(rows=20, seed=1) if evaluate or "--best" in sys.argv[4:] else None
    collator = collated_other_on_all_but_last_stages(2) if "--skew" in sys.argv[4:] else None
    trainer = IPUTrainer(
        model, config, args, train_dataset=unevenly_padded(), eval_dataset=eval_dataset, data_collator=collator
    )
    here = local_parameter_bytes(trainer.model.parameters())
    peak = track_peak_parameter_bytes(trainer.model)
    before = {}
    if evaluate:  # the pretrained model: its metrics and predictions
        before = trainer.evaluate(metric_key_prefix="before")
        logits = trainer.predict(eval_dataset).predictions
        if trainer.args.process_index == 0:
            torch.save(torch.as_tensor(logits), os.path.join(out, "predictions_before.pt"))
    sent = count_reduce_scatters()
    trainer.train(resume_from_checkpoint=os.environ.get("RESUME_FROM") or None)
    trainer.save_model(os.path.join(out, "final"))  # every process calls it: the shards are gathered
    if "--push" in sys.argv[4:]:
        trainer.push_to_hub()  # every process calls it (each writes its stage's shard), the main process uploads
    rank = trainer.args.process_index
    result = {
        "parameter_bytes": here,
        "whole_parameter_bytes": whole,
        "sharded": trainer.layout.sharded,
        "mesh": None
        if trainer.layout.mesh is None
        else [trainer.layout.mesh.mesh_dim_names, trainer.layout.mesh.shape],
        "peak_parameter_bytes": peak["bytes"],
        "fsdp_units": sum(isinstance(m, FSDPModule) for m in trainer.model.modules()),
        "embedding": type(trainer.model.get_input_embeddings()).__name__,
        "embedding_split": hasattr(trainer.model.get_input_embeddings().weight, "placements"),
        "reduce_scatters": sent["calls"],  # of FSDP's gradients, over the whole run (without evaluation)
        "reduce_scattered_bytes": sent["bytes"],
    }
    if evaluate:
        result["eval"], result["eval_before"] = trainer.evaluate(), before
    if rank == 0:
        result["losses"] = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        result["eval_losses"] = {e["step"]: e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e}
        result["best_model_checkpoint"], result["global_step"] = (
            trainer.state.best_model_checkpoint,
            trainer.state.global_step,
        )
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
