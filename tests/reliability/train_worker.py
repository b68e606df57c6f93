"""A tiny IPUTrainer run for the crash tests: 24 steps, a checkpoint every 2, about 0.2 s a step.

    python train_worker.py OUT_DIR [--resume] [--kill-in-save N] [--save-total-limit K]

Writes OUT_DIR/final.safetensors (the trained weights) when it finishes. `--kill-in-save N` makes the process
SIGKILL itself in the middle of its N-th checkpoint save of this run: every file of `checkpoint-*` written,
older checkpoints rotated away, the completion marker not yet written (the worst moment to die).
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import datasets
import transformers
from safetensors.torch import save_file

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.trainer.checkpoints import is_complete
from tests.tiny_models import tiny_inputs, tiny_model

CLASS = "BertForSequenceClassification"


class SlowSteps(transformers.TrainerCallback):
    """Gives the test time to kill the run at a random moment, saves included."""

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.2)


class KillInSave(transformers.TrainerCallback):
    """SIGKILL this process during its `nth` save, before the checkpoint is marked complete.

    User callbacks run before the trainer's own `MarkCheckpointComplete` (added last), so at `on_save` the
    folder is fully written but not marked: the process dies exactly between the two.
    """

    def __init__(self, nth: int) -> None:
        self.nth, self.saves = nth, 0

    def on_save(self, args, state, control, **kwargs):
        self.saves += 1
        if self.saves == self.nth:
            checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            print(f"killing myself in the save of {checkpoint} (marked: {is_complete(checkpoint)})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-in-save", type=int)
    parser.add_argument("--save-total-limit", type=int, default=3)
    cli = parser.parse_args()
    rows = tiny_inputs(CLASS, batch=48, seed=0)
    train = datasets.Dataset.from_dict({k: v.tolist() for k, v in rows.items()})
    args = IPUTrainingArguments(
        output_dir=cli.out,
        per_device_train_batch_size=2,
        num_train_epochs=2,
        learning_rate=1e-3,
        seed=5,
        save_strategy="steps",
        save_steps=2,
        save_total_limit=cli.save_total_limit,
        report_to=[],
        disable_tqdm=True,
        logging_steps=1,
    )
    callbacks = [SlowSteps()] + ([KillInSave(cli.kill_in_save)] if cli.kill_in_save else [])
    trainer = IPUTrainer(
        tiny_model(CLASS), IPUConfig(gradient_accumulation_steps=2), args, train_dataset=train, callbacks=callbacks
    )
    trainer.train(resume_from_checkpoint=True if cli.resume else None)
    save_file(
        {k: v.contiguous() for k, v in trainer.model.state_dict().items()}, os.path.join(cli.out, "final.safetensors")
    )


if __name__ == "__main__":
    main()
