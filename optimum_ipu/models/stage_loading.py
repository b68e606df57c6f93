"""Load only this process's pipeline stage of a pretrained `transformers` model.

With pipeline stages on separate processes (`torchrun`, `ipus_per_replica` > 1), each process builds the stock model
on the meta device (no memory; buffers such as position ids and rotary tables are computed as usual), decides what
its stage runs (`runtime.stage_hold.held_parameter_names`), and reads only those tensors from the checkpoint: one
`model.safetensors`, or the shards of `model.safetensors.index.json` that hold them (only those are downloaded from
the Hub). Everything else stays on the meta device. Nothing of `transformers` is patched: the model is built by its
own `from_config` under accelerate's `init_empty_weights`, and parameters missing from the checkpoint (a new head)
are initialized by the model's own `initialize_weights`, as `from_pretrained` does.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import transformers
from accelerate import init_empty_weights
from torch import nn
from transformers.utils.hub import cached_file

from ..config import IPUConfig
from ..runtime.devices import default_device
from ..runtime.distributed import group_size, world_size
from ..runtime.fsdp import stage_mesh
from ..runtime.stage_checkpoint import checkpoint_index, checkpoint_key, open_checkpoint
from ..runtime.stage_cut import stage_ranges
from ..runtime.stage_hold import StageHold, free_parameters, held_parameter_names, register_hold, replace_parameter
from ..topology import check_processes
from .layout import layers_per_stage
from .pipelined import PipelinedModel, to_pipelined

logger = logging.getLogger(__name__)
HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "subfolder", "proxies", "force_download")


def loads_stage_only(ipu_config: IPUConfig) -> bool:
    """Whether a model loaded now would run as one stage of a process pipeline (several processes, several stages)."""
    return world_size() > 1 and ipu_config.value("ipus_per_replica") > 1


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
            source = keys[key]
            if not os.path.isfile(source):  # a shard named by a Hub index: fetched only when a stage needs it
                source = cached_file(name_or_path, source, **hub)
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


def _load_generation_config(model: nn.Module, name_or_path: str, hub: dict[str, Any]) -> None:
    """The folder's `generation_config.json`, as `from_pretrained` reads it (Whisper's suppressed tokens, its decoder
    prompt and length live there); the config's defaults when it has none."""
    if not model.can_generate():
        return
    try:
        model.generation_config = transformers.GenerationConfig.from_pretrained(name_or_path, **hub)
    except OSError:
        logger.info("%s has no generation_config.json: generation uses the model config's defaults", name_or_path)


def load_stage(
    auto_class: str | type, name_or_path: str, ipu_config: IPUConfig, device: torch.device | None = None, **kwargs: Any
) -> PipelinedModel:
    """Build `auto_class` (a `transformers` class or auto-class name) on the meta device and load only the parameters
    of this process's stage of `ipu_config`'s training layout from `name_or_path` (a folder or Hub id).

    Args:
        auto_class (`str` or `type`): e.g. `"AutoModelForCausalLM"`, or a model class.
        name_or_path (`str`): a model folder or Hub id with a safetensors checkpoint (one file or sharded).
        ipu_config (`IPUConfig`): the layout; the job's processes must be its stages x replicas.
        device (`torch.device`, *optional*): this process's device (defaults to its GPU, else the CPU).
        kwargs: `from_pretrained`'s arguments: Hub options (`revision`, `token`, ...), `config`, `dtype`,
            `attn_implementation`, `trust_remote_code`, `ignore_mismatched_sizes`.

    Returns:
        `PipelinedModel`: parallelized; its `model` holds this stage's parameters, the others on the meta device.
    """
    processes = group_size("load_stage")
    # the processes must be the layout's stages x replicas; the micro-batches a training schedule needs are checked
    # where it trains (PipelineEngine): loading to generate or evaluate needs none
    layout = ipu_config.copy()
    layout.gradient_accumulation_steps = max(layout.gradient_accumulation_steps, layout.value("ipus_per_replica"))
    check_processes(layout, processes)
    device = device or default_device()
    hub = {k: kwargs.pop(k) for k in HUB_KWARGS if k in kwargs}
    ignore_mismatched_sizes = kwargs.pop("ignore_mismatched_sizes", False)
    cls = getattr(transformers, auto_class) if isinstance(auto_class, str) else auto_class
    config = kwargs.pop("config", None) or transformers.AutoConfig.from_pretrained(
        name_or_path, trust_remote_code=kwargs.get("trust_remote_code", False), **hub
    )
    dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", "auto"))
    if dtype == "auto":
        dtype = getattr(config, "dtype", None) or torch.float32
    with init_empty_weights(include_buffers=False):  # parameters on the meta device, buffers computed as usual
        builder = cls.from_config if hasattr(cls, "from_config") else cls._from_config
        model = builder(config, dtype=dtype, **kwargs)
    model.tie_weights()
    model.eval()  # as from_pretrained returns it
    _load_generation_config(model, name_or_path, hub)
    pipelined = to_pipelined(model, ipu_config)
    counts = layers_per_stage(ipu_config, pipelined.num_layers, inference=False)
    mesh = stage_mesh(ipu_config.value("replication_factor"), len(counts), device)
    cut = pipelined.stage_cut()
    held = held_parameter_names(model, cut, counts, mesh.get_local_rank("pp"))
    freed = free_parameters(model, held)
    missing = load_held_tensors(model, held, name_or_path, device, ignore_mismatched_sizes, **hub)
    for param in model.parameters():
        if param.is_meta:
            param._is_hf_initialized = True  # another stage's: loaded there
    if missing:
        logger.warning(
            "Some weights of %s (stage %d) were not in the checkpoint %s and are newly initialized: %s",
            type(model).__name__,
            mesh.get_local_rank("pp"),
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
        mesh.get_local_rank("pp"),
        len(counts),
        held_bytes / 2**20,
        type(model).__name__,
        name_or_path,
    )
    return pipelined.parallelize()
