"""Checkpoints of a model whose stages run on separate processes, each holding its stage only: written and read
without gathering the model into one process (`stage_hold`). The files are the stock sharded safetensors layout
(`model-0000s-of-0000n.safetensors` + `model.safetensors.index.json`), so `from_pretrained` loads them as one model,
and a process of any other layout reads what it holds from them."""

from __future__ import annotations

import json
import os
from typing import Any

import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME
from transformers.utils.hub import cached_file

from ..fsdp import reshard, whole_on_cpu
from .hold import StageHold


def save_stage_shards(model: nn.Module, hold: StageHold, folder: str) -> None:
    """Write the model as a stock sharded safetensors checkpoint without gathering it: each stage writes the entries
    it owns as one shard (replica 0's process, after gathering the stage's FSDP shards over its replicas), and global
    rank 0 writes `model.safetensors.index.json`. Tied aliases are written once, under their first name, as
    `transformers` saves them. A collective: every process calls it.

    An entry several stages hold (a tied embedding, a buffer) is written by the stage that trains it, else the first
    stage that holds it.
    """
    reshard(model)  # an evaluation may have left the FSDP root's parameters gathered
    first_name = {id(p): n for n, p in model.named_parameters()}
    aliases = {n for n, p in model.named_parameters(remove_duplicate=False) if first_name[id(p)] != n}
    entries = {k: v for k, v in model.state_dict().items() if k not in aliases}
    local = lambda v: v.to_local() if hasattr(v, "to_local") else v  # noqa: E731
    stage, group = hold.stage, hold.mesh.get_group("pp")
    candidates = [k for k, v in entries.items() if not local(v).is_meta and hold.stage_of(k) in (None, stage)]
    gathered: list[Any] = [None] * hold.mesh["pp"].size()
    dist.all_gather_object(gathered, candidates, group=group)
    writer = {}
    for s, keys in enumerate(gathered):
        for key in keys:
            writer.setdefault(key, s)
    mine = {k: v for k, v in entries.items() if writer.get(k) == stage}
    mine = {k: whole_on_cpu(v).contiguous() for k, v in mine.items()}  # gathered over the stage's replicas (FSDP)
    writing = [s for s in range(len(gathered)) if any(w == s for w in writer.values())]
    name = lambda s: f"model-{writing.index(s) + 1:05d}-of-{len(writing):05d}.safetensors"  # noqa: E731
    if hold.mesh.get_local_rank("dp") == 0 and mine:
        os.makedirs(folder, exist_ok=True)
        save_file(mine, os.path.join(folder, name(stage)), metadata={"format": "pt"})
    sizes: list[Any] = [None] * len(gathered)
    dist.all_gather_object(sizes, sum(v.numel() * v.element_size() for v in mine.values()), group=group)
    if dist.get_rank() == 0:
        index = {"metadata": {"total_size": sum(sizes)}, "weight_map": {k: name(s) for k, s in sorted(writer.items())}}
        with open(os.path.join(folder, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2)
    dist.barrier()


def checkpoint_index(name_or_path: str, **hub: Any) -> dict[str, str]:
    """Every tensor name of a model's safetensors checkpoint -> the file (or Hub file name) that holds it.

    Reads `model.safetensors`'s header, or `model.safetensors.index.json` (no shard is opened or downloaded here).

    Raises:
        OSError: the model has no safetensors checkpoint.
    """
    single = cached_file(name_or_path, SAFE_WEIGHTS_NAME, _raise_exceptions_for_missing_entries=False, **hub)
    if single is not None:
        with safe_open(single, framework="pt") as f:
            return dict.fromkeys(f.keys(), os.path.abspath(single))
    index = cached_file(name_or_path, SAFE_WEIGHTS_INDEX_NAME, _raise_exceptions_for_missing_entries=False, **hub)
    if index is None:
        raise OSError(
            f"{name_or_path}: no {SAFE_WEIGHTS_NAME} or {SAFE_WEIGHTS_INDEX_NAME}; loading one pipeline stage needs a "
            "safetensors checkpoint (re-save the model with save_pretrained)"
        )
    with open(index, encoding="utf-8") as f:
        weight_map = dict(json.load(f)["weight_map"])
    for shard in set(weight_map.values()):
        _check_shard_name(index, shard)
    return weight_map


def _check_shard_name(index: str, shard: Any) -> None:
    """A shard an index names is a file of the checkpoint's own folder: never an absolute path, or one that climbs
    out of the folder (`../outside.safetensors`), whose tensors would come from elsewhere without a word."""
    parts = str(shard).replace("\\", "/").split("/")
    if not isinstance(shard, str) or not shard or os.path.isabs(shard) or ".." in parts:
        raise ValueError(
            f"{index}: the weight_map entry {shard!r} is not a file of the checkpoint's folder; an index names its "
            "shards by file name (re-save the model with save_pretrained)"
        )


def shard_path(name_or_path: str, shard: str, **hub: Any) -> str:
    """The file of a shard named by `checkpoint_index`: inside the model's folder (never the current directory),
    or fetched from its Hub repository (only when a stage needs it)."""
    if os.path.isabs(shard):  # the one `model.safetensors`, found already
        return shard
    if os.path.isdir(name_or_path):
        return os.path.join(name_or_path, shard)
    return cached_file(name_or_path, shard, **hub)


def checkpoint_key(names: list[str], keys: dict[str, str], prefix: str) -> str | None:
    """The checkpoint's name of a parameter known here by `names` (tied aliases); a checkpoint of the base model has
    no `prefix.` (`bert.`), one of a model with a head has it where the base model has none, as transformers maps."""
    for name in names:
        for key in (name, name.removeprefix(prefix + ".") if prefix else name, f"{prefix}.{name}" if prefix else name):
            if key in keys:
                return key
    return None


def open_checkpoint(path: str) -> Any:
    try:  # read into the tensors' own memory: a mapped file's pages would count twice in the process's peak
        return safe_open(path, framework="pt", device="cpu", backend="pread")  # safetensors >= 0.8
    except TypeError:
        return safe_open(path, framework="pt", device="cpu")


def read_held_state_dict(model: nn.Module, folder: str) -> dict[str, Any]:
    """The entries of a checkpoint folder (one file or sharded) that this process holds of `model` (whose other
    parameters are on the meta device), under the model's names; only the shards that hold them are opened.

    Raises:
        ValueError: the checkpoint lacks an entry this process holds.
    """
    keys = checkpoint_index(folder)
    prefix = getattr(model, "base_model_prefix", "")
    local = lambda v: v.to_local() if isinstance(v, DTensor) else v  # noqa: E731
    entries = model.state_dict()
    held = {name: checkpoint_key([name], keys, prefix) for name, v in entries.items() if not local(v).is_meta}
    missing = [name for name, key in held.items() if key is None]
    if missing:
        raise ValueError(f"{folder}: the checkpoint lacks {', '.join(missing[:5])} of this process's stage")
    files: dict[str, Any] = {}
    state = {}
    for name, key in held.items():
        path = shard_path(folder, keys[key])
        files.setdefault(path, open_checkpoint(path))
        state[name] = files[path].get_tensor(key)
    return state


def read_state_dict(folder: str) -> dict[str, Any]:
    """Every entry of a checkpoint folder, whether one `model.safetensors` or shards under an index (a model whose
    stages ran on separate processes saves a shard per stage): what a layout that holds the whole model's names (FSDP
    shards) reads to resume from a checkpoint of any other."""
    files: dict[str, Any] = {}
    state = {}
    for key, file in checkpoint_index(folder).items():
        path = shard_path(folder, file)
        files.setdefault(path, open_checkpoint(path))
        state[key] = files[path].get_tensor(key)
    return state
