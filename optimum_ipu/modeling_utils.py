"""The helpers of `optimum.graphcore.modeling_utils` that mean something without an IPU, with its signatures and
results.

Code written for Optimum Graphcore imports them from `optimum.graphcore.modeling_utils`; change that line to
`optimum_ipu.modeling_utils`. They read the mode-managed fields (`ipu_config._layers_per_ipu`, ...), so an
`IPUConfig` in `eval()` mode gives the inference layout, as there.

`get_layer_ipu` keeps Optimum Graphcore's rule for wildcards (the whole remainder on the last wildcard IPU);
the stages that `to_pipelined` builds share a remainder one layer each over the last wildcards instead
(`optimum_ipu.models.layout.layers_per_stage`): the two differ only when a remainder of 2 or more is left.
`PipelineMixin` is the base of the `Pipelined<Class>` classes generated from the stage plan registry, and
`register(transformers_cls)` registers a stage plan for a class (`optimum_ipu.models.pipelined_classes`).
`recomputation_checkpoint` and `outline_attribute` are importable and called as there; they were poptorch graph
annotations, with nothing to mark here (said once). The `nn.Module` replacements of that module
(`SerializedEmbedding`, `SerializedLinear`, `SplitProjection`, `SharedEmbedding`, `OnehotGather`) are one-line
import errors naming what does their job here: `embedding_serialization_factor`, `projection_serialization_factor`
and `recompute_checkpoint_every_layer` of the `IPUConfig`, on unmodified `transformers` models.
"""

from __future__ import annotations

import copy
import functools
import logging
from typing import Any

import torch
from torch import nn

from .config import IPUConfig
from .errors import IncompatibleIPUConfigError
from .models.pipelined import to_pipelined
from .models.pipelined_classes import PipelineMixin, register

__all__ = [
    "PipelineMixin",
    "get_layer_ipu",
    "outline_attribute",
    "recomputation_checkpoint",
    "register",
    "shift_tokens_right",
    "split_encoder_decoder_ipu_config",
    "to_pipelined",
]

logger = logging.getLogger(__name__)

# Optimum Graphcore's poptorch module replacements -> what does their job here
_POPTORCH_MODULES = {
    "SerializedEmbedding": "IPUConfig(embedding_serialization_factor=N) runs the stock model's embedding in chunks",
    "SerializedLinear": "IPUConfig(projection_serialization_factor=N) runs its output projection and loss in chunks",
    "SplitProjection": "IPUConfig(serialized_projection_splits_per_ipu=[...]) (or tensor_parallel_size) splits it",
    "SharedEmbedding": "a tied encoder-decoder embedding is held once by each stage that runs it, with nothing to do",
    "OnehotGather": "torch's own gather runs where poptorch needed a one-hot product",
}


def __getattr__(name: str) -> Any:
    if name in _POPTORCH_MODULES:
        raise ImportError(
            f"{__name__}.{name}: Optimum Graphcore's poptorch replacement of a module, not needed here: "
            f"{_POPTORCH_MODULES[name]}"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache  # once per process and helper
def _said_once(helper: str, why: str) -> None:
    logger.warning("%s: poptorch's graph annotation, nothing to mark here: %s", helper, why)


def recomputation_checkpoint(module: nn.Module) -> torch.utils.hooks.RemovableHandle:
    """Optimum Graphcore's annotation that keeps `module`'s output instead of recomputing it (poptorch's
    `recomputationCheckpoint`). Here activation checkpointing (`recompute_checkpoint_every_layer`) keeps each
    pipeline layer's output already; this registers a forward hook that changes nothing, so code that keeps and
    removes the handle runs as written (said once).

    Returns:
        `torch.utils.hooks.RemovableHandle`: the hook's handle, as there.
    """
    _said_once(
        "recomputation_checkpoint",
        "with recompute_checkpoint_every_layer each pipeline layer is checkpointed by torch.utils.checkpoint, its "
        "output kept",
    )
    return module.register_forward_hook(lambda mod, inputs, outputs: None)


def outline_attribute(module: nn.Module, value: str) -> None:
    """Optimum Graphcore's hint that modules with the same `value` compile to one outlined graph (PopART). No
    compiler outlines here: nothing is done (said once)."""
    _said_once("outline_attribute", "no graph compiler outlines modules here")


def _expand_layers_per_ipu_wildcard(
    ipu_config: IPUConfig, target_number_of_layers: int | list | None = None
) -> list[int]:
    """`layers_per_ipu` of the current mode with its `-1` wildcards expanded, by Optimum Graphcore's rule.

    Without `target_number_of_layers` the list is returned as it is; with one IPU per replica every layer goes
    on IPU 0 whatever `layers_per_ipu` says.
    """
    layers_per_ipu = copy.deepcopy(ipu_config._layers_per_ipu)
    layers_field = ipu_config._get_managed_attr_mode_name("layers_per_ipu")
    ipus_per_replica = ipu_config._ipus_per_replica
    ipus_field = ipu_config._get_managed_attr_mode_name("ipus_per_replica")
    if target_number_of_layers is None:
        return layers_per_ipu
    if not isinstance(target_number_of_layers, int):
        target_number_of_layers = len(target_number_of_layers)
    if ipus_per_replica == 1:
        return [target_number_of_layers]
    if layers_per_ipu in ([-1], [-1] * ipus_per_replica):
        quotient, remainder = divmod(target_number_of_layers, ipus_per_replica)
        layers_per_ipu = [quotient] * ipus_per_replica
        layers_per_ipu[-1] += remainder
    elif -1 in layers_per_ipu and len(layers_per_ipu) == ipus_per_replica:
        wildcards = [i for i, n in enumerate(layers_per_ipu) if n == -1]
        left = target_number_of_layers - sum(n for n in layers_per_ipu if n != -1)
        quotient, remainder = divmod(left, len(wildcards))
        for i in wildcards:
            layers_per_ipu[i] = quotient
        layers_per_ipu[wildcards[-1]] += remainder
    elif len(layers_per_ipu) != ipus_per_replica:
        raise IncompatibleIPUConfigError(
            f"{layers_field} has a non-default value set, but its length does not match {ipus_field}: "
            f"{layers_field}={layers_per_ipu}, {ipus_field}={ipus_per_replica}"
        )
    elif sum(layers_per_ipu) != target_number_of_layers:
        raise IncompatibleIPUConfigError(
            f"{layers_field} does not define the correct number of layers for the current model: it places "
            f"{sum(layers_per_ipu)} layers but there are {target_number_of_layers}. {layers_field}={layers_per_ipu}"
        )
    if min(layers_per_ipu) < 0:  # more layers placed explicitly than the model has
        raise IncompatibleIPUConfigError(
            f"{layers_field} does not define the correct number of layers for the current model: it places more "
            f"than its {target_number_of_layers} layers. {layers_field}={ipu_config._layers_per_ipu}"
        )
    return layers_per_ipu


def get_layer_ipu(ipu_config: IPUConfig, target_number_of_layers: int | list | None = None) -> list[int]:
    """The IPU (device slot) of each layer under `ipu_config`'s layout of the current mode.

    Args:
        ipu_config (`IPUConfig`): the configuration; `eval()` mode reads `inference_layers_per_ipu`.
        target_number_of_layers (`int` or a list of layers, *optional*): the model's layers, to expand
            wildcards and check the count against.

    Returns:
        `list[int]`: one IPU index per layer.

    Example:

    ```python
    >>> get_layer_ipu(IPUConfig(layers_per_ipu=[-1, 2, -1, 2]), 7)
    [0, 1, 1, 2, 2, 3, 3]
    ```
    """
    layers_per_ipu = _expand_layers_per_ipu_wildcard(ipu_config, target_number_of_layers)
    return [ipu for ipu, count in enumerate(layers_per_ipu) for _ in range(count)]


def _split_serialized(
    configs: dict[str, IPUConfig], ipu_config: IPUConfig, kind: str, cut: int, owner: str, message: str
) -> None:
    """Give the per-IPU splits of `kind` to `owner` ("encoder" or "decoder"); splits on the other side raise."""
    attr = f"_serialized_{kind}_splits_per_ipu"
    splits = getattr(ipu_config, attr)
    if splits is None:
        return
    mine, other = (splits[:cut], splits[cut:]) if owner == "encoder" else (splits[cut:], splits[:cut])
    if sum(other):
        field = ipu_config._get_managed_attr_mode_name(f"serialized_{kind}_splits_per_ipu")
        raise IncompatibleIPUConfigError(
            f"{message} must have all splits placed on the {owner}, but {field}={splits} results in {other} "
            f"being placed on the {'decoder' if owner == 'encoder' else 'encoder'}"
        )
    other_side = "decoder" if owner == "encoder" else "encoder"
    setattr(configs[owner], attr, mine)
    setattr(configs[owner], f"_{kind}_serialization_factor", sum(mine))
    setattr(configs[other_side], attr, None)
    setattr(configs[other_side], f"_{kind}_serialization_factor", 1)  # no splits there: not serialized


def split_encoder_decoder_ipu_config(
    ipu_config: IPUConfig, num_encoder_layers: int, num_decoder_layers: int
) -> list[IPUConfig]:
    """Split the configuration of an encoder-decoder model into one for the encoder and one for the decoder.

    `layers_per_ipu` (of the current mode) is cut where the encoder's layers end, at a number of IPUs that is a
    power of 2; `ipus_per_replica`, per-IPU `matmul_proportion` and the per-IPU serialization splits follow.

    Args:
        ipu_config (`IPUConfig`): the configuration of the whole model.
        num_encoder_layers (`int`): the encoder's number of layers.
        num_decoder_layers (`int`): the decoder's number of layers.

    Returns:
        The encoder's and the decoder's configurations (copies).

    Example:

    ```python
    >>> encoder, decoder = split_encoder_decoder_ipu_config(IPUConfig(layers_per_ipu=[12, 12]), 12, 12)
    >>> encoder.layers_per_ipu, decoder.layers_per_ipu
    ([12], [12])
    ```
    """
    layers_field = ipu_config._get_managed_attr_mode_name("layers_per_ipu")
    if ipu_config._ipus_per_replica < 2:
        ipus_field = ipu_config._get_managed_attr_mode_name("ipus_per_replica")
        raise IncompatibleIPUConfigError(
            f"Need {ipus_field} to be at least 2 to split ipu_config into encoder and decoder configs"
        )
    layers_per_ipu = _expand_layers_per_ipu_wildcard(ipu_config, num_encoder_layers + num_decoder_layers)
    ends = [i + 1 for i in range(len(layers_per_ipu)) if sum(layers_per_ipu[: i + 1]) == num_encoder_layers]
    powers_of_two = [n for n in ends if n & (n - 1) == 0]
    if not powers_of_two:
        raise IncompatibleIPUConfigError(
            f"Unable to find a valid split of ipu_config.{layers_field}={ipu_config._layers_per_ipu} for "
            f"num_encoder_layers={num_encoder_layers} and num_decoder_layers={num_decoder_layers}: the encoder and "
            "the decoder cannot share an IPU, and each needs a number of IPUs that is a power of 2"
        )
    cut = max(powers_of_two)
    configs = {"encoder": copy.deepcopy(ipu_config), "decoder": copy.deepcopy(ipu_config)}
    configs["encoder"]._layers_per_ipu = layers_per_ipu[:cut]
    configs["decoder"]._layers_per_ipu = layers_per_ipu[cut:]
    _split_serialized(configs, ipu_config, "embedding", cut, "encoder", "The `SerializedEmbedding`")
    _split_serialized(configs, ipu_config, "projection", cut, "decoder", "The `SplitProjection`")
    for part in configs.values():
        part._ipus_per_replica = len(part._layers_per_ipu)
    matmul_proportion = ipu_config._matmul_proportion
    if isinstance(matmul_proportion, list):
        configs["encoder"]._matmul_proportion = matmul_proportion[:cut]
        configs["decoder"]._matmul_proportion = matmul_proportion[cut:]
    return [configs["encoder"], configs["decoder"]]


def shift_tokens_right(input_ids: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Shift `input_ids` one token to the right, starting with `decoder_start_token_id`; label padding (-100)
    becomes `pad_token_id`. Optimum Graphcore's version (a concatenation, not a slice assignment)."""
    if pad_token_id is None:
        raise ValueError("self.model.config.pad_token_id has to be defined.")
    start = torch.full((input_ids.shape[0], 1), decoder_start_token_id, dtype=input_ids.dtype, device=input_ids.device)
    shifted = torch.cat([start, input_ids[:, :-1]], dim=1)
    return torch.where(shifted == -100, torch.as_tensor(pad_token_id, dtype=shifted.dtype), shifted)
