"""Weight-only int8 linear layers: Optimum Graphcore's `use_group_quantized_linears`, realised with `torchao`.

Optimum Graphcore's Whisper (and BART) `parallelize(use_group_quantized_linears=True)` replaced every linear layer of
the encoder and decoder layers (attention projections, `fc1`, `fc2`) by a `GroupQuantLinear`: the weight stored in
int4, one fp16 minimum and scale per group of 16 weights along the input features, decompressed by its own IPU kernel
before each matmul. The convolutions, the embeddings and the output projection (tied to the token embedding) were kept
as they were.

Here the same linear layers are quantized by `torchao` (`quantize_` with `Int8WeightOnlyConfig`, per group): each
weight is stored in int8, one scale per group of `GROUP_SIZE` (128) weights along the input features (symmetric; a
layer whose input width 128 does not divide takes the largest power of two that does, at least `MIN_GROUP_SIZE`);
activations stay in the model's precision (fp32, or fp16 after `.half()`), and the weight is dequantized group by
group before each matmul. Int8, not int4: `torchao` 0.18 has no int4 kernel for CPUs (its int4 packing formats run on
CUDA / XPU, and `IntxWeightOnlyConfig` stores int4 values one per int8 byte, no smaller than int8). Per group, not per
output channel: with one scale per row, `torchao` multiplies the activations by the raw int8 weight and scales the
result after, which overflows fp16 (Whisper after the notebook's `.half()` then decodes `!!!!`).

The model keeps its modules (no class is swapped): only the `weight` parameters become `torchao` tensor subclasses.
The model is registered with `transformers`' own `torchao` integration (`config.quantization_config` and
`hf_quantizer`, as `from_pretrained(quantization_config=TorchAoConfig(...))` leaves them), so `save_pretrained`
writes the int8 weights (`torchao`'s flattened safetensors) and `from_pretrained` reads them back quantized.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from packaging.version import Version
from torch import nn

logger = logging.getLogger(__name__)

GROUP_SIZE = 128  # weights per scale along the input features (torchao's usual int8 / int4 group)
MIN_GROUP_SIZE = 16  # Optimum Graphcore's group; a layer whose width no power of two >= 16 divides is kept as it is
# Int8WeightOnlyConfig(granularity=PerGroup(n), version=2): 0.15 and 0.16 accept it but fail in the matmul
TORCHAO_MIN_VERSION = "0.17.0"
INSTALL_HINT = 'pip install "optimum-ipu[quantization]"'


def torchao_version() -> str | None:
    """The installed `torchao` version, `None` without it."""
    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return None


def require_torchao(what: str = "use_group_quantized_linears=True") -> None:
    """Raise an `ImportError` of one line, naming the fix, unless `torchao` (at least `TORCHAO_MIN_VERSION`) is
    installed.

    Args:
        what (`str`, *optional*): the option that needs it, named in the message.
    """
    found = torchao_version()
    if found is None:
        raise ImportError(f"{what} quantizes with torchao, which is not installed: {INSTALL_HINT}")
    if Version(found) < Version(TORCHAO_MIN_VERSION):
        raise ImportError(f"{what} needs torchao>={TORCHAO_MIN_VERSION}, found {found}: {INSTALL_HINT}")


@contextlib.contextmanager
def _quiet_import() -> Iterator[None]:
    """Importing torchao logs a warning per CUDA extension a CPU build of torch cannot load, and torch one about an
    Enum torchao registers with pytree: noise for a weight-only int8 model, which needs neither."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [one.level for one in loggers]
    for one in loggers:
        one.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for one, level in zip(loggers, levels, strict=True):
            one.setLevel(level)


def _int8_config(group: int) -> Any:
    with _quiet_import():
        from torchao.quantization import Int8WeightOnlyConfig
        from torchao.quantization.granularity import PerGroup

    # set_inductor_config=False: torchao would otherwise change torch._inductor's global settings for the process
    return Int8WeightOnlyConfig(granularity=PerGroup(group), version=2, set_inductor_config=False)


def group_size_for(in_features: int, group_size: int = GROUP_SIZE) -> int | None:
    """The group a linear layer of `in_features` inputs is quantized in: the largest divisor of `in_features` that
    divides `group_size` too (128 for every Whisper size); `None` (kept unquantized) below `MIN_GROUP_SIZE`."""
    group = math.gcd(group_size, in_features)
    return group if group >= MIN_GROUP_SIZE else None


def quantized_group(weight: Any) -> int | None:
    """The group size of a weight quantized here (a `torchao` int8 tensor), `None` for any other tensor."""
    block = getattr(weight, "block_size", None)
    qdata = getattr(weight, "qdata", None)
    if block is None or qdata is None or str(qdata.dtype) != "torch.int8":
        return None
    return int(block[-1])


def _shared_weights(model: nn.Module) -> set[int]:
    """The ids of the parameters that more than one module holds (tied weights)."""
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        seen[id(param)] = seen.get(id(param), 0) + 1
    return {key for key, count in seen.items() if count > 1}


def _targets(model: nn.Module, within: Sequence[str]) -> dict[str, nn.Linear]:
    """The `nn.Linear` modules under the dotted paths `within` whose weight is materialized and not tied elsewhere."""
    shared = _shared_weights(model)
    found = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or not any(name.startswith(f"{prefix}.") for prefix in within):
            continue
        if module.weight.is_meta or id(module.weight) in shared:  # another stage's layer / a tied weight
            continue
        found[name] = module
    return found


def quantize_linear_weights(model: nn.Module, within: Sequence[str], group_size: int = GROUP_SIZE) -> list[str]:
    """Store the weight of each linear layer under the modules `within` in int8, one scale per group of input
    features (`torchao`'s weight-only int8); the activations keep the model's precision. In place; idempotent.

    Layers whose weight is tied to another module's, or not materialized (the meta device: another process's
    stage), are left as they are, as is a layer whose input width no power of two of at least `MIN_GROUP_SIZE`
    divides (said once). A `transformers` model is registered with its `torchao` integration, so that
    `save_pretrained` writes the int8 weights and `from_pretrained` reads them back quantized.

    Args:
        model (`nn.Module`): the model (a `transformers.PreTrainedModel` is registered as quantized).
        within (`Sequence[str]`): dotted paths of the modules whose linear layers are quantized (a pipelined model's
            layers: `PipelinedModel.layer_paths()`).
        group_size (`int`, *optional*, defaults to `GROUP_SIZE`): weights per scale along the input features.

    Returns:
        `list[str]`: the dotted names of the linear layers whose weight is now int8 (quantized before included).

    Raises:
        `ValueError`: when no layer can be quantized (none has a group of `MIN_GROUP_SIZE` inputs or more), or a
            weight is split by tensor parallelism (a `DTensor`).

    Example:

    ```python
    >>> names = quantize_linear_weights(model, ["model.encoder.layers.0", "model.decoder.layers.0"])
    >>> names[0], model.get_submodule(names[0]).weight.qdata.dtype
    ('model.encoder.layers.0.self_attn.k_proj', torch.int8)
    ```
    """
    require_torchao()
    with _quiet_import():
        from torchao.quantization import FqnToConfig, quantize_

    targets = _targets(model, within)
    configs, kept = {}, []
    for name, linear in targets.items():
        if quantized_group(linear.weight) is not None:
            continue
        if type(linear.weight.data) is not torch.Tensor:  # a DTensor (tensor parallelism) or another subclass
            raise ValueError(
                f"use_group_quantized_linears=True: {name}.weight is a {type(linear.weight.data).__name__}, not a "
                "plain tensor; int8 weights are made from whole weights (tensor_parallel_size 1)"
            )
        group = group_size_for(linear.in_features, group_size)
        if group is None:
            kept.append(name)
            continue
        configs[name] = _int8_config(group)
    if configs:
        quantize_(model, FqnToConfig(configs), filter_fn=None)
    if kept and configs:  # said with the quantization that kept them, not again on a later call
        logger.warning(
            "use_group_quantized_linears: %d linear layer(s) kept unquantized, no group of %d or more dividing their "
            "inputs: %s",
            len(kept),
            MIN_GROUP_SIZE,
            ", ".join(kept[:4]) + (", ..." if len(kept) > 4 else ""),
        )
    done = [name for name, linear in targets.items() if quantized_group(linear.weight) is not None]
    if not done and not any(p.is_meta for p in model.parameters()):  # (a process holding one stage may have none)
        raise ValueError(
            f"use_group_quantized_linears=True: {type(model).__name__} has no linear layer in its layers whose inputs "
            f"fall in groups of {MIN_GROUP_SIZE} or more, so nothing would be quantized; leave the option out"
        )
    if configs and hasattr(model, "config") and hasattr(model, "save_pretrained"):
        _register_with_transformers(model)
    return done


def _register_with_transformers(model: nn.Module) -> None:
    """Leave the model as `from_pretrained(quantization_config=TorchAoConfig(...))` does: `config.quantization_config`
    saying which layers are int8 in which groups (one config when the groups agree, else one per layer), the other
    linear layers named in `modules_to_not_convert`, and the `hf_quantizer` that `save_pretrained` asks for the
    flattened tensors and their metadata."""
    from torchao.quantization import FqnToConfig
    from transformers import TorchAoConfig
    from transformers.quantizers import AutoHfQuantizer

    groups, plain = {}, []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            group = quantized_group(module.weight)
            if group is None:
                plain.append(name)
            else:
                groups[name] = group
    sizes = set(groups.values())
    if len(sizes) == 1:
        quant_type = _int8_config(sizes.pop())
    else:
        quant_type = FqnToConfig({name: _int8_config(group) for name, group in groups.items()})
    config = TorchAoConfig(quant_type=quant_type, modules_to_not_convert=plain or None)
    model.config.quantization_config = config
    model.hf_quantizer = AutoHfQuantizer.from_config(config, pre_quantized=True)
