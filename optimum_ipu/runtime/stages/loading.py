"""Materialize and read only the tensors of this process's pipeline stage of a model built on the meta device: the
runtime's half of `optimum_ipu.models.stage_loading.load_stage` (the process mesh, what the stage holds, the reads).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..fsdp import stage_mesh
from .checkpoint import checkpoint_index, checkpoint_key, open_checkpoint, shard_path
from .cut import StageCut, stage_ranges
from .hold import StageHold, free_parameters, held_parameter_names, register_hold, replace_parameter

logger = logging.getLogger(__name__)


def load_held_tensors(
    model: nn.Module,
    held: set[str],
    name_or_path: str,
    device: torch.device,
    ignore_mismatched_sizes: bool = False,
    **hub: Any,
) -> list[str]:
    """Materialize on `device` the parameters named in `held`, read from the checkpoint; returns the names that the
    checkpoint lacks, or holds with another shape when `ignore_mismatched_sizes` (materialized empty, for
    `initialize_weights`, as `from_pretrained` does); a mismatched shape otherwise raises `ValueError`."""
    keys = checkpoint_index(name_or_path, **hub)
    prefix = getattr(model, "base_model_prefix", "")
    aliases: dict[int, tuple[nn.Parameter, list[str]]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if name in held:
            aliases.setdefault(id(param), (param, []))[1].append(name)
    wanted = {id(p): checkpoint_key(names, keys, prefix) for p, names in aliases.values()}
    files: dict[str, Any] = {}
    missing = []
    for param, names in aliases.values():
        key = wanted[id(param)]
        if key is None:
            tensor = torch.empty_like(param, device=device)
            missing.append(names[0])
        else:
            # the model's own folder, or its Hub repository (a shard fetched only when a stage needs it)
            source = shard_path(name_or_path, keys[key], **hub)
            if source not in files:
                files[source] = open_checkpoint(source)
            tensor = files[source].get_tensor(key).to(device=device, dtype=param.dtype)
            if tensor.shape != param.shape:
                if not ignore_mismatched_sizes:
                    raise ValueError(
                        f"{key} is {tuple(tensor.shape)} in {name_or_path} and {tuple(param.shape)} in the model: "
                        "pass ignore_mismatched_sizes=True to initialize it anew"
                    )
                key, tensor = None, torch.empty_like(param, device=device)
                missing.append(names[0])
        new = nn.Parameter(tensor, requires_grad=param.requires_grad)
        new._is_hf_initialized = key is not None
        replace_parameter(model, param, new)
    return missing


def hold_loaded_stage(
    model: nn.Module,
    cut: StageCut,
    counts: list[int],
    replicas: int,
    device: torch.device,
    name_or_path: str,
    ignore_mismatched_sizes: bool = False,
    **hub: Any,
) -> int:
    """Keep this process's stage of `model` (built on the meta device) and read its tensors from `name_or_path`: the
    (replicas x stages) mesh of this job, the parameters the stage runs materialized from the checkpoint (those it
    lacks initialized by the model's own `initialize_weights`), the buffers moved to `device`, the hold registered
    (`stage_hold`). Returns this process's stage."""
    mesh = stage_mesh(replicas, len(counts), device)
    stage = mesh.get_local_rank("pp")
    held = held_parameter_names(model, cut, counts, stage)
    freed = free_parameters(model, held)
    missing = load_held_tensors(model, held, name_or_path, device, ignore_mismatched_sizes, **hub)
    for param in model.parameters():
        if param.is_meta:
            param._is_hf_initialized = True  # another stage's: loaded there
    if missing:
        logger.warning(
            "Some weights of %s (stage %d) were not in the checkpoint %s and are newly initialized: %s",
            type(model).__name__,
            stage,
            name_or_path,
            ", ".join(missing),
        )
        model.initialize_weights()
    for module in model.modules():  # buffers were computed on the CPU
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.device != device:
                module._buffers[name] = buffer.to(device)
    register_hold(model, StageHold(mesh, list(cut.layer_paths), stage_ranges(counts), freed, cut=cut))
    held_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if not p.is_meta)
    logger.info(
        "stage %d of %d: holds %.1f MB of %s's parameters, read from %s",
        stage,
        len(counts),
        held_bytes / 2**20,
        type(model).__name__,
        name_or_path,
    )
    return stage
