"""Load only this process's pipeline stage of a pretrained `transformers` model.

With pipeline stages on separate processes (`torchrun`, `ipus_per_replica` > 1), each process builds the stock model
on the meta device (no memory; buffers such as position ids and rotary tables are computed as usual), decides what
its stage runs (`runtime.stages.hold.held_parameter_names`), and reads only those tensors from the checkpoint
(`runtime.stages.loading`, where the stage's process group is made): one
`model.safetensors`, or the shards of `model.safetensors.index.json` that hold them (only those are downloaded from
the Hub). Everything else stays on the meta device. Nothing of `transformers` is patched: the model is built by its
own `from_config` under accelerate's `init_empty_weights`, and parameters missing from the checkpoint (a new head)
are initialized by the model's own `initialize_weights`, as `from_pretrained` does.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import transformers
from accelerate import init_empty_weights
from torch import nn

from ..config import IPUConfig
from ..runtime.devices import default_device
from ..runtime.distributed import group_size, world_size
from ..runtime.stages.loading import hold_loaded_stage
from ..topology import check_processes
from .layout import check_auto_on_stage_processes, layers_per_stage
from .pipelined import PipelinedModel, to_pipelined

logger = logging.getLogger(__name__)
HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "subfolder", "proxies", "force_download")


def loads_stage_only(ipu_config: IPUConfig) -> bool:
    """Whether a model loaded now would run as one stage of a process pipeline (several processes, several stages)."""
    return world_size() > 1 and ipu_config.value("ipus_per_replica") > 1


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
    check_auto_on_stage_processes(ipu_config, name_or_path)  # before the process mesh or any model is built
    processes = group_size("load_stage")
    # the processes must be the layout's stages x replicas; the micro-batches a training schedule needs are checked
    # where it trains (PipelineEngine): loading to generate or evaluate needs none
    check_processes(ipu_config, processes, micro_batches=False)
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
    replicas = ipu_config.value("replication_factor")
    hold_loaded_stage(
        model, pipelined.stage_cut(), counts, replicas, device, name_or_path, ignore_mismatched_sizes, **hub
    )
    return pipelined.parallelize()
