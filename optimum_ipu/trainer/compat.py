"""Every override of a private `transformers.Trainer` method that `IPUTrainer` needs, in one place.

`IPUTrainer` subclasses `Trainer` through its public hooks (`training_step`, `prediction_step`, `create_optimizer`,
`get_train_dataloader`, `save_model`, ...) where they exist. What has no public hook is here, so the next
`transformers` release that renames one breaks this module only:

- `_prepare_inputs`: flex-attention packed rows get their `BlockMask` on the device;
- `_wrap_model`: no DDP around sharded (`--fsdp`) models or around stages on separate processes;
- `_clip_grad_norm`: the training engine has clipped already (`finish_step`, with the norm over every stage);
- `__init__`, `_init_training_state`: `self.state` is an `IPUTrainerState` (Optimum Graphcore's name; its
  `start_time` set when training starts);
- `_maybe_log_save_evaluate`: a NaN loss does not poison every later logged loss;
- `_save` (through `save_state_dict`), `_save_checkpoint`, `_save_optimizer_and_scheduler`, `_load_from_checkpoint`,
  `_load_best_model`, `_load_optimizer_and_scheduler`: checkpoints marked complete only once whole, old ones rotated
  after; FSDP state gathered in the one-process layout; a model held stage by stage saves and loads
  its optimizer state per stage (`runtime/stage_optimizer.py`), and any layout resumes from either;
- `_push_from_checkpoint`: each checkpoint's push carries its `ipu_config.json` beside the model's files.

Where `Trainer` reads a value from `self.args` that must differ for one call (the static evaluation batch, the
micro-batches of replicas run in turn, no rotation before a checkpoint is marked), `_scoped_args` gives it a copy of
the arguments for that call: the user's object is never written.

The mixin reads the attributes `IPUTrainer.__init__` sets: `engine`, `training_engine`, `process_pipeline`, `fsdp`,
`pending_rotation`.
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
from safetensors.torch import load_file
from torch import nn
from transformers import Trainer
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME
from transformers.utils import ADAPTER_SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_NAME

from ..config_schema import CONFIG_NAME as IPU_CONFIG_NAME
from ..files import write_text_atomic
from ..packing import PACKED_SEQUENCE_IDS, with_packed_block_mask
from ..runtime import fsdp
from ..runtime.fsdp import ShardedModel
from ..runtime.stage_checkpoint import read_held_state_dict
from ..runtime.stage_hold import stage_hold
from ..runtime.stage_optimizer import (
    has_stage_optimizer,
    load_stage_optimizer,
    save_stage_optimizer,
    stage_optimizer_as_one,
)
from .checkpoints import discard_checkpoint
from .state import IPUTrainerState


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

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list, Any]:
        """`Trainer`'s, with stages on separate processes the replica's last stage's micro-batches on every stage
        (`ProcessPipeline.same_batches`), counted after they are shared."""
        batches, count = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.process_pipeline is None or not batches:
            return batches, count
        batches = self.process_pipeline.same_batches(batches)
        return batches, self._get_num_items_in_batch(batches, device)

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """`Trainer`'s, then packed rows for flex attention get their `BlockMask`, made on the device (its
        `mask_mod` reads the sequence ids there) outside any compiled region."""
        inputs = super()._prepare_inputs(inputs)
        if PACKED_SEQUENCE_IDS in inputs and self.process_pipeline is not None:
            raise ValueError(
                "PackedDataCollator(attention='flex') is not supported with pipeline stages on separate processes; "
                "run one process per replica (its stages run in turn)"
            )
        return with_packed_block_mask(inputs)

    def _wrap_model(self, model: nn.Module, training: bool = True, dataloader: Any = None) -> nn.Module:
        if self.fsdp and training:
            return model if isinstance(model, ShardedModel) else ShardedModel(model)  # no DDP around shards
        if self.process_pipeline is not None and training:
            return self.process_pipeline.wrap(model)  # stages reduce their own gradients: no DDP over all
        if self.process_pipeline is not None and stage_hold(model) is not None:
            return self.process_pipeline.forward_module()  # evaluation: forward through the replica's stages
        return super()._wrap_model(model, training, dataloader)

    def _clip_grad_norm(self, model: nn.Module) -> Any:
        return self.training_engine.last_grad_norm  # clipped by finish_step at the end of training_step

    def _maybe_log_save_evaluate(self, tr_loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        logged = self._globalstep_last_logged
        super()._maybe_log_save_evaluate(tr_loss, *args, **kwargs)
        if self._globalstep_last_logged != logged:
            # Trainer resets its running loss with `tr_loss -= tr_loss`, which leaves a NaN: one NaN loss (with
            # --stop_on_nan false, its fp16 step skipped) would make every later logged loss NaN.
            tr_loss.zero_()

    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        if self.process_pipeline is not None:
            self.process_pipeline.synchronize(self.optimizer)  # the checkpoint of a single-process run
        # Trainer deletes old checkpoints (save_total_limit) before the new one is marked complete: a kill in
        # between would leave none. MarkCheckpointComplete rotates once the marker is written.
        limit = self.args.save_total_limit
        # A folder of this step left by an earlier run is deleted first, its marker first: never rewritten in
        # place under a marker that would still call it complete.
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if self.args.should_save and os.path.isdir(folder):
            discard_checkpoint(folder)
        self.accelerator.wait_for_everyone()
        with self._scoped_args(save_total_limit=None):
            super()._save_checkpoint(model, trial)
        self.pending_rotation = (self._get_output_dir(trial=trial), limit) if limit else None

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
        if stage_hold(model) is None:  # a model that holds one pipeline stage was built on its device
            super()._move_model_to_device(model, device)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate's wrapper keeps the torch one
        if stage_hold(self.model) is not None:
            save_stage_optimizer(self.model, optimizer, output_dir)  # each stage writes its part: nothing gathered
        elif self.fsdp:
            # The whole state, gathered by every process, written by one, in the one-process layout.
            state = fsdp.full_optimizer_state_dict(self.model, optimizer)
            if self.args.should_save:
                torch.save(state, os.path.join(output_dir, OPTIMIZER_NAME))
        else:
            return super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        if not (self.fsdp or stage_hold(self.model) is not None):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        adapters = os.path.join(resume_from_checkpoint, ADAPTER_SAFE_WEIGHTS_NAME)
        if os.path.isfile(adapters):
            # a peft model under --fsdp (on stages or not): its checkpoint holds the adapters only (the base weights
            # are loaded already); each process takes those of the parameters it holds
            fsdp.load_full_state_dict(self.model, _adapters_by_name(self.model, load_file(adapters)), partial=True)
            return
        if stage_hold(self.model) is not None:  # one stage held: read only its entries (one file or the stage shards)
            weights = read_held_state_dict(self.model, resume_from_checkpoint)
        else:
            weights = load_file(os.path.join(resume_from_checkpoint, SAFE_WEIGHTS_NAME))
        fsdp.load_full_state_dict(self.model, weights)  # each process keeps its shards

    def _load_best_model(self) -> None:
        if not (self.fsdp or stage_hold(self.model) is not None):
            return super()._load_best_model()
        # Trainer's would load the whole state_dict into this process's model: each process reads what it holds
        self._load_from_checkpoint(self.state.best_model_checkpoint)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        held = self.fsdp or stage_hold(self.model) is not None
        per_stage = checkpoint is not None and has_stage_optimizer(checkpoint)
        if not per_stage and not (held and checkpoint and os.path.isfile(os.path.join(checkpoint, OPTIMIZER_NAME))):
            return super()._load_optimizer_and_scheduler(checkpoint)
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)
        if per_stage and stage_hold(self.model) is not None:
            load_stage_optimizer(self.model, optimizer, checkpoint)  # only the files that hold this stage's state
        else:
            # one layout or another into a process that holds the whole model (or its FSDP shards)
            load = functools.partial(torch.load, map_location="cpu", weights_only=True)
            whole = (
                stage_optimizer_as_one(self.model, optimizer, checkpoint)
                if per_stage
                else load(os.path.join(checkpoint, OPTIMIZER_NAME))
            )
            if held:
                fsdp.load_full_optimizer_state_dict(self.model, optimizer, whole)
            else:
                optimizer.load_state_dict(whole)
        scheduler = torch.load(os.path.join(checkpoint, SCHEDULER_NAME), map_location="cpu", weights_only=True)
        self.lr_scheduler.load_state_dict(scheduler)

    def save_state_dict(self, output_dir: str | None, state_dict: dict[str, torch.Tensor]) -> None:
        """Write a model `state_dict` as `Trainer` writes the model (`_save`: safetensors, config, processor)."""
        self._save(output_dir, state_dict=state_dict)


def _adapters_by_name(model: nn.Module, saved: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's saved adapter tensors under the model's parameter names: `get_peft_model_state_dict` drops the adapter's
    name (`lora_A.default.weight` -> `lora_A.weight`, `classifier.modules_to_save.default.weight` ->
    `classifier.weight`)."""
    adapter = getattr(model, "active_adapter", "default")
    named = {}
    for name, _ in model.named_parameters():
        key = name.replace(f".modules_to_save.{adapter}", "").replace(f".{adapter}.", ".")
        if key in saved and ("lora_" in name or ".modules_to_save." in name):
            named[name] = saved[key]
    if len(named) != len(saved):
        raise ValueError(f"the adapter checkpoint does not fit the model: {sorted(saved)[:5]}...")
    return named
