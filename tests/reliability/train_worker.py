"""A tiny IPUTrainer run for the crash tests: 24 steps, a checkpoint every 2, about 0.2 s a step.

    python train_worker.py OUT_DIR [resume]

Writes OUT_DIR/final.safetensors (the trained weights) when it finishes.
"""

from __future__ import annotations

import os
import sys
import time

import datasets
import transformers
from safetensors.torch import save_file

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from tests.tiny_models import tiny_inputs, tiny_model

CLASS = "BertForSequenceClassification"


class SlowSteps(transformers.TrainerCallback):
    """Gives the test time to kill the run at a random moment, saves included."""

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.2)


def main() -> None:
    out, resume = sys.argv[1], len(sys.argv) > 2
    rows = tiny_inputs(CLASS, batch=48, seed=0)
    train = datasets.Dataset.from_dict({k: v.tolist() for k, v in rows.items()})
    args = IPUTrainingArguments(
        output_dir=out, per_device_train_batch_size=2, num_train_epochs=2, learning_rate=1e-3, seed=5,
        save_strategy="steps", save_steps=2, save_total_limit=3, report_to=[], disable_tqdm=True, logging_steps=1,
    )  # fmt: skip
    trainer = IPUTrainer(tiny_model(CLASS), IPUConfig(gradient_accumulation_steps=2), args, train_dataset=train,
                         callbacks=[SlowSteps()])  # fmt: skip
    trainer.train(resume_from_checkpoint=True if resume else None)
    save_file(
        {k: v.contiguous() for k, v in trainer.model.state_dict().items()}, os.path.join(out, "final.safetensors")
    )


if __name__ == "__main__":
    main()
