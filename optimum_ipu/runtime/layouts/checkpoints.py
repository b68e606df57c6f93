"""Checkpoint tensors of a model held in parts (FSDP shards, or one pipeline stage per process), for the layouts.

The formats are those of one process, so that any layout resumes from a checkpoint of any other: the weights are stock
safetensors (one file, or shards under one index, each stage writing its own), the optimizer state is `optimizer.pt`
in the one-process layout or one file per stage (`runtime/stages/optimizer.py`), read into whichever layout resumes.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch import nn
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME
from transformers.utils import ADAPTER_SAFE_WEIGHTS_NAME

from .. import fsdp
from ..adapters import unwrap_adapters
from ..stages.checkpoint import read_held_state_dict, read_state_dict
from ..stages.hold import StageHold, stage_hold
from ..stages.optimizer import has_stage_optimizer, load_stage_optimizer, stage_optimizer_as_one


def save_scheduler(scheduler: Any, folder: str, should_save: bool) -> None:
    """The LR scheduler's state, as `Trainer` writes it (the main process only)."""
    if should_save:
        torch.save(scheduler.state_dict(), os.path.join(folder, SCHEDULER_NAME))


def load_held_model(model: nn.Module, folder: str) -> None:
    """Load a checkpoint's weights into a model held in parts: each process keeps what it holds (its shards, its
    stage). A peft model's checkpoint holds the adapters only (the base weights are loaded already)."""
    adapters = os.path.join(folder, ADAPTER_SAFE_WEIGHTS_NAME)
    if os.path.isfile(adapters):
        fsdp.load_full_state_dict(model, adapters_by_name(model, load_file(adapters)), partial=True)
        return
    if stage_hold(model) is not None:  # one stage held: read only its entries (one file or the stage shards)
        weights = read_held_state_dict(model, folder)
    else:  # one file, or a shard per stage of a run whose stages were on processes
        weights = read_state_dict(folder)
    fsdp.load_full_state_dict(model, weights)  # each process keeps its shards


def load_optimizer_state(
    model: nn.Module, optimizer: Any, scheduler: Any, checkpoint: str | None, held: bool, stock: Callable[[], None]
) -> None:
    """Load a checkpoint's optimizer and scheduler states into any layout, whichever layout wrote them: `Trainer`'s
    `optimizer.pt` (`stock` loads it into a whole model), the one-process state into a model held in parts (`held`),
    or per-stage files into a stage (only its own files) or into a whole model (assembled as one)."""
    per_stage = checkpoint is not None and has_stage_optimizer(checkpoint)
    if not per_stage and not (held and checkpoint and os.path.isfile(os.path.join(checkpoint, OPTIMIZER_NAME))):
        return stock()
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper keeps the torch optimizer
    if per_stage and stage_hold(model) is not None:
        load_stage_optimizer(model, optimizer, checkpoint)  # only the files that hold this stage's state
    else:
        # one layout or another into a process that holds the whole model (or its FSDP shards)
        load = functools.partial(torch.load, map_location="cpu", weights_only=True)
        whole = (
            stage_optimizer_as_one(model, optimizer, checkpoint)
            if per_stage
            else load(os.path.join(checkpoint, OPTIMIZER_NAME))
        )
        if held:
            fsdp.load_full_optimizer_state_dict(model, optimizer, whole)
        else:
            optimizer.load_state_dict(whole)
    state = torch.load(os.path.join(checkpoint, SCHEDULER_NAME), map_location="cpu", weights_only=True)
    scheduler.load_state_dict(state)


def has_adapters(model: nn.Module) -> bool:
    """Whether `model` is an adapter wrapper (`peft`'s), whose checkpoint holds the adapters only."""
    return bool(unwrap_adapters(model)[0])


def gather_stage_adapters(model: nn.Module, hold: StageHold) -> dict[str, torch.Tensor]:
    """The trainable tensors (peft's adapters, a new head) of a model whose stages are held apart, gathered whole
    from every stage: they are few, so the main process can write them with the wrapper's own `save_pretrained`, as
    in one process. A collective: every process calls it."""
    fsdp.reshard(model)
    mine = {}
    for name, param in model.named_parameters():
        held = not (param.to_local() if hasattr(param, "to_local") else param).is_meta
        if param.requires_grad and held:
            value = fsdp.whole_on_cpu(param)  # gathered over the stage's replicas: a collective of the stage
            if hold.mesh.get_local_rank("dp") == 0:
                mine[name] = value
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {k: v for part in gathered for k, v in part.items()}


def adapters_by_name(model: nn.Module, saved: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
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
