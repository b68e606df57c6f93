"""Every override of a private `transformers.Trainer` method that `IPUTrainer` needs, in one place.

`IPUTrainer` subclasses `Trainer` through its public hooks (`training_step`, `prediction_step`, `create_optimizer`,
`get_train_dataloader`, `save_model`, ...) where they exist. What has no public hook is here, so the next
`transformers` release that renames one breaks this module only:

- `_prepare_inputs`: flex-attention packed rows get their `BlockMask` on the device;
- `_wrap_model`, `_move_model_to_device`: the layout's (`optimum_ipu.runtime.layouts`): no DDP around shards or
  stages on separate processes, a model that holds one stage left on its device;
- `_clip_grad_norm`: the training engine has clipped already (`finish_step`, with the norm over every stage);
- `__init__`, `_init_training_state`: `self.state` is an `IPUTrainerState` (Optimum Graphcore's name; its
  `start_time` set when training starts);
- `_maybe_log_save_evaluate`: a NaN loss does not poison every later logged loss;
- `_save` (through `save_state_dict`), `_save_checkpoint`, `_save_optimizer_and_scheduler`, `_load_from_checkpoint`,
  `_load_best_model`, `_load_optimizer_and_scheduler`: checkpoints marked complete only once whole, old ones rotated
  after, a full disk said in one line with the size needed (`checkpoints.full_disk_said`); the tensors are the
  layout's to write and read (`runtime/layouts/`: FSDP state gathered in the one-process layout, a model held stage
  by stage saves and loads its optimizer state per stage), and any layout resumes from either;
- `_push_from_checkpoint`: each checkpoint's push carries its `ipu_config.json` beside the model's files.

Where `Trainer` reads a value from `self.args` that must differ for one call (the static evaluation batch, the
micro-batches of replicas run in turn, no rotation before a checkpoint is marked), `_scoped_args` gives it a copy of
the arguments for that call: the user's object is never written.

The mixin reads the attributes `IPUTrainer.__init__` sets: `layout`, `engine`, `pending_rotation`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from transformers import Trainer

from ..config_schema import CONFIG_NAME as IPU_CONFIG_NAME
from ..files import write_text_atomic
from ..packing import PACKED_SEQUENCE_IDS, with_packed_block_mask
from .checkpoints import CHECKPOINT_SPACE_FIX, checkpoint_bytes, discard_checkpoint, full_disk_said
from .state import IPUTrainerState


def _half_inputs_as_weights(inputs: Any, model: nn.Module) -> Any:
    """fp16 / bf16 floating inputs cast to fp32 when the model's weights are fp32. Optimum Graphcore ran its models
    in half precision on the IPU, so code written for it hands over half inputs (its Wav2Vec2 notebook's collator:
    `batch["input_values"].half()`); here the weights stay fp32 and `--fp16` / `--bf16` act through autocast."""
    weight = next(model.parameters(), None)
    if weight is None or weight.dtype != torch.float32 or not hasattr(inputs, "items"):
        return inputs
    for key, value in list(inputs.items()):
        if torch.is_tensor(value) and value.dtype in (torch.float16, torch.bfloat16):
            inputs[key] = value.float()
    return inputs


class TrainerPrivateHooks(Trainer):
    """The private `Trainer` methods `IPUTrainer` overrides (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state = IPUTrainerState.from_state(self.state)

    def _init_training_state(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        started = time.time()
        trained = super()._init_training_state(*args, **kwargs)  # a new TrainerState, or the checkpoint's
        self.state = IPUTrainerState.from_state(self.state, start_time=started)
        return trained

    @contextlib.contextmanager
    def _scoped_args(self, **changes: Any) -> Iterator[None]:
        """For the calls inside it, `self.args` is a copy of the arguments with `changes` applied; the user's
        arguments object is never written, and `self.args` is the user's again afterwards."""
        original = self.args
        if changes:
            self.args = copy.copy(original)
            for name, value in changes.items():
                setattr(self.args, name, value)
        try:
            yield
        finally:
            self.args = original

    @contextlib.contextmanager
    def _scoped_collator(self, collator: Callable[[list[Any]], Any] | None) -> Iterator[None]:
        """For the loader built inside it, `Trainer` (which reads `self.data_collator`) uses `collator`."""
        original = self.data_collator
        if collator is not None:
            self.data_collator = collator
        try:
            yield
        finally:
            self.data_collator = original

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """`Trainer`'s, then packed rows for flex attention get their `BlockMask`, made on the device (its
        `mask_mod` reads the sequence ids there) outside any compiled region."""
        inputs = super()._prepare_inputs(inputs)
        self.layout.check_batch(packed_for_flex=PACKED_SEQUENCE_IDS in inputs)
        return with_packed_block_mask(_half_inputs_as_weights(inputs, self.model))

    def _wrap_model(self, model: nn.Module, training: bool = True, dataloader: Any = None) -> nn.Module:
        return self.layout.wrap_model(
            model, training, functools.partial(super()._wrap_model, model, training, dataloader)
        )

    def _clip_grad_norm(self, model: nn.Module) -> Any:
        return self.engine.last_grad_norm  # clipped by finish_step at the end of training_step

    def _maybe_log_save_evaluate(self, tr_loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        logged = self._globalstep_last_logged
        super()._maybe_log_save_evaluate(tr_loss, *args, **kwargs)
        if self._globalstep_last_logged != logged:
            # Trainer resets its running loss with `tr_loss -= tr_loss`, which leaves a NaN: one NaN loss (with
            # --stop_on_nan false, its fp16 step skipped) would make every later logged loss NaN.
            tr_loss.zero_()

    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        self.layout.before_checkpoint(self.optimizer)  # stages on processes: the checkpoint of a one-process run
        # Trainer deletes old checkpoints (save_total_limit) before the new one is marked complete: a kill in
        # between would leave none. MarkCheckpointComplete rotates once the marker is written.
        limit = self.args.save_total_limit
        # A folder of this step left by an earlier run is deleted first, its marker first: never rewritten in
        # place under a marker that would still call it complete.
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if self.args.should_save and os.path.isdir(folder):
            discard_checkpoint(folder)
        self.accelerator.wait_for_everyone()
        # A full disk: one line with the file, the size needed and the space free; the cut-short folder removed
        run_dir, optimizer = self._get_output_dir(trial=trial), None if self.args.save_only_model else self.optimizer
        needed = functools.partial(checkpoint_bytes, run_dir, self.model, optimizer)
        cleanup = "folder" if self.args.should_save else None
        with full_disk_said(folder, "the checkpoint", needed, CHECKPOINT_SPACE_FIX, cleanup):
            with self._scoped_args(save_total_limit=None):
                super()._save_checkpoint(model, trial)
        self.pending_rotation = (run_dir, limit) if limit else None

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        # Trainer copies the model's files from the checkpoint into output_dir and uploads that folder; without the
        # IPUConfig a pushed revision would load with another layout (or none) than the one it trained with
        # (written atomically: a crash mid-copy leaves output_dir's file whole)
        source = os.path.join(checkpoint_folder, IPU_CONFIG_NAME)
        if self.is_world_process_zero() and os.path.isfile(source):
            with open(source, encoding="utf-8") as f:
                write_text_atomic(os.path.join(self.args.output_dir, IPU_CONFIG_NAME), f.read())
        super()._push_from_checkpoint(checkpoint_folder)

    def take_pending_rotation(self) -> tuple[str, int] | None:
        """The (run folder, `save_total_limit`) of the checkpoint just saved, whose older ones go once it is marked
        complete (`MarkCheckpointComplete`); None when there is nothing to rotate. Taken once."""
        rotation, self.pending_rotation = self.pending_rotation, None
        return rotation

    def _move_model_to_device(self, model: nn.Module, device: Any) -> None:
        self.layout.move_model_to_device(model, functools.partial(super()._move_model_to_device, model, device))

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        stock = functools.partial(super()._save_optimizer_and_scheduler, output_dir)
        self.layout.save_optimizer(self.optimizer, self.lr_scheduler, output_dir, self.args.should_save, stock)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        stock = functools.partial(super()._load_from_checkpoint, resume_from_checkpoint, model)
        self.layout.load_model(resume_from_checkpoint, stock)

    def _load_best_model(self) -> None:
        self.layout.load_best_model(self.state.best_model_checkpoint, super()._load_best_model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        stock = functools.partial(super()._load_optimizer_and_scheduler, checkpoint)
        self.layout.load_optimizer(self.optimizer, self.lr_scheduler, checkpoint, stock)

    def save_state_dict(self, output_dir: str | None, state_dict: dict[str, torch.Tensor]) -> None:
        """Write a model `state_dict` as `Trainer` writes the model (`_save`: safetensors, config, processor)."""
        self._save(output_dir, state_dict=state_dict)
