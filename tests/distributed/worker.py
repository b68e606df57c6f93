"""A tiny IPUTrainer run, launched by the distributed tests (with torchrun or as one plain process).

    python worker.py OUT_DIR CONFIG_JSON MAX_STEPS [FAIL_RANK]

Rank 0 writes OUT_DIR/result.json (logged losses) and the trained model (stock layout + ipu_config.json).
With FAIL_RANK, that rank raises after its first optimizer step, to test that the job ends. With the
environment variable RESUME_FROM, training resumes from that checkpoint; PIPELINE_SCHEDULE picks the schedule
of pipeline stages on separate processes.
"""

from __future__ import annotations

import json
import os
import sys

import datasets
import torch
import transformers

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from tests.tiny_models import tiny_inputs, tiny_model

CLASS = "BertForSequenceClassification"


class FailAfterFirstStep(transformers.TrainerCallback):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def on_step_end(self, args, state, control, **kwargs):
        if int(os.environ.get("RANK", "0")) == self.rank:
            raise RuntimeError(f"injected failure on rank {self.rank}")


def main() -> None:
    out, config_json, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rows = tiny_inputs(CLASS, batch=64, seed=0)
    train = datasets.Dataset.from_dict({k: v.tolist() for k, v in rows.items()})
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
        save_steps=max_steps,
        disable_tqdm=True,
        ddp_timeout=30,
        pipeline_schedule=os.environ.get("PIPELINE_SCHEDULE", "1F1B"),
    )
    callbacks = [FailAfterFirstStep(int(sys.argv[4]))] if len(sys.argv) > 4 else []
    trainer = IPUTrainer(
        tiny_model(CLASS), IPUConfig.from_dict(json.loads(config_json)), args, train_dataset=train, callbacks=callbacks
    )
    trainer.train(resume_from_checkpoint=os.environ.get("RESUME_FROM") or None)
    trainer.save_model(os.path.join(out, "final"))  # every process calls it, as the example scripts do
    if trainer.args.process_index == 0:
        losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        local = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps this rank's shard there
        state_numel = sum(t.numel() for s in local.state.values() for t in s.values() if torch.is_tensor(t))
        result = {
            "losses": losses,
            "world_size": trainer.args.world_size,
            "step": trainer.state.global_step,
            "optimizer_state_numel": state_numel,
        }
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
