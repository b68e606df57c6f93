"""Crash-safe checkpoints: a `checkpoint-N/` folder counts only once it is marked complete.

`transformers.Trainer` writes `checkpoint-N/` file by file; a run killed meanwhile leaves a folder that
`get_last_checkpoint` would pick up and fail on (or silently resume from a mix of steps). `IPUTrainer` writes
`checkpoint_complete.json` into the folder once every process has finished writing it (atomically: a
temporary file, then a rename), and resumes only from marked folders.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import rotate_checkpoints

from ..files import write_text_atomic

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "checkpoint_complete.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def is_complete(checkpoint: str) -> bool:
    return os.path.isfile(os.path.join(checkpoint, COMPLETE_MARKER))


def last_complete_checkpoint(folder: str) -> str | None:
    """The `checkpoint-N` folder of `folder` with the highest N that is marked complete (None if there is none).

    Newer unmarked folders (a save cut short) are skipped, with a warning naming them.
    """
    if not os.path.isdir(folder):
        return None
    steps = sorted(
        ((int(m.group(1)), name) for name in os.listdir(folder) if (m := _CHECKPOINT.match(name))), reverse=True
    )
    skipped = []
    for _, name in steps:
        path = os.path.join(folder, name)
        if is_complete(path):
            if skipped:
                logger.warning("skipping incomplete checkpoint(s) %s (a save was cut short)", ", ".join(skipped))
            return path
        skipped.append(name)
    if skipped:
        logger.warning("no complete checkpoint in %s; incomplete: %s", folder, ", ".join(skipped))
    return None


def write_marker(checkpoint: str, global_step: int) -> None:
    marker = {"global_step": global_step, "files": sorted(os.listdir(checkpoint))}
    write_text_atomic(os.path.join(checkpoint, COMPLETE_MARKER), json.dumps(marker))


class MarkCheckpointComplete(TrainerCallback):
    """After `Trainer` saved `checkpoint-N` (on every process), mark it complete from the main process, then
    delete the checkpoints beyond `save_total_limit` (which `IPUTrainer` keeps `Trainer` from doing earlier)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        self.trainer.accelerator.wait_for_everyone()  # every rank has written its part (RNG states, shards)
        if args.should_save and os.path.isdir(checkpoint):
            write_marker(checkpoint, state.global_step)
        # Older checkpoints go only now (save_total_limit): a kill before the marker keeps the previous one.
        rotation, self.trainer.pending_rotation = self.trainer.pending_rotation, None
        if args.should_save and rotation is not None:
            run_dir, limit = rotation
            rotate_checkpoints(run_dir, limit, state.best_model_checkpoint, use_mtime=True)
