"""`ShardedReplicasLayout`: one replica per process, its parameters, gradients and optimizer state sharded over the
replicas with FSDP2 (`--fsdp`, `optimum_ipu.runtime.fsdp`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers.trainer import OPTIMIZER_NAME

from .. import fsdp
from ..fsdp import ShardedModel
from ..step import TrainingStep
from . import checkpoints
from .base import ModelParts, ReplicasLayout, SaveHooks


class ShardedReplicasLayout(ReplicasLayout):
    """Replicas over processes with FSDP2: each layer a unit, so at most one layer is whole at a time. Checkpoints
    are gathered whole and written in the one-process layout, so they load in one process."""

    holds_part_only = True
    sharded = True

    def apply(self, parts: ModelParts, engine: Any, accelerator: Any) -> TrainingStep:
        super().apply(parts, engine, accelerator)
        fsdp.shard_model(parts.model, parts.layer_paths, mesh=self.mesh["dp"])  # over the replicas' dim
        return engine

    def wrap_model(self, model: nn.Module, training: bool, stock: Callable[[], nn.Module]) -> nn.Module:
        if training:  # no DDP around shards
            return model if isinstance(model, ShardedModel) else ShardedModel(model)
        return stock()

    def training_runner(self, wrapped: nn.Module) -> nn.Module:
        return self.parts.runner.train()  # FSDP's hooks are on the model's own modules: the wrapper runs them

    def optimizer_state_shardable(self) -> bool:
        return False  # FSDP shards the optimizer state already

    def save_model(self, folder: str, hooks: SaveHooks) -> None:
        # the whole weights, gathered by every process, written by one: they load in one process
        state_dict = fsdp.full_state_dict(self.parts.model)
        if hooks.should_save:
            hooks.write_state_dict(state_dict)

    def save_optimizer(
        self, optimizer: torch.optim.Optimizer, scheduler: Any, folder: str, should_save: bool, stock: Callable
    ) -> None:
        # the whole state, gathered by every process, written by one, in the one-process layout
        state = fsdp.full_optimizer_state_dict(self.parts.model, getattr(optimizer, "optimizer", optimizer))
        if should_save:
            torch.save(state, os.path.join(folder, OPTIMIZER_NAME))
        checkpoints.save_scheduler(scheduler, folder, should_save)

    def load_model(self, folder: str, stock: Callable[[], None]) -> None:
        checkpoints.load_held_model(self.parts.model, folder)

    def load_best_model(self, folder: str, stock: Callable[[], None]) -> None:
        # Trainer's would load the whole state_dict into this process's model: each process reads what it holds
        checkpoints.load_held_model(self.parts.model, folder)
