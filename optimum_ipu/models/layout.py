"""Which layers sit on which device slot: the stage layout of a model under an `IPUConfig`. No torch.

The config layer checks what needs no model (types, ranges, one entry per device slot); resolving `-1` wildcards
against a model's number of layers, and checking that the layers placed are the model's, happens here.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from ..config import IPUConfig
from ..errors import IncompatibleIPUConfigError, short_repr

logger = logging.getLogger(__name__)


def resolve_layers_per_ipu(layers_per_ipu: list[int], num_layers: int, field: str = "layers_per_ipu") -> list[int]:
    """Resolve `-1` wildcards so that the stages hold exactly `num_layers` layers.

    The layers not placed explicitly are shared evenly between wildcards; the remainder goes one each to the
    last wildcards (stage 0 also holds the embeddings). Optimum Graphcore gave the whole remainder to the last
    wildcard (`optimum_ipu.modeling_utils.get_layer_ipu` keeps its rule). Without wildcards, entries that place
    more layers than the model has are taken in order, as there (said once), as long as every slot that asks for
    layers still gets one.

    Args:
        layers_per_ipu (`list[int]`): layers per device slot, `-1` for a wildcard.
        num_layers (`int`): the model's number of layers.
        field (`str`, *optional*): the field named in errors.

    Raises:
        `IncompatibleIPUConfigError`: the entries place more layers than the model has explicitly beside
        wildcards, or (without wildcards) fewer than it has, or so many that a slot asking for layers gets none.
    """
    fixed = sum(n for n in layers_per_ipu if n != -1)
    wildcards = [i for i, n in enumerate(layers_per_ipu) if n == -1]
    if not wildcards:
        taken = _taken_in_order(layers_per_ipu, num_layers)
        if fixed < num_layers or 0 in [n for n, asked in zip(taken, layers_per_ipu, strict=True) if asked]:
            raise IncompatibleIPUConfigError(
                f"IPUConfig field `{field}`: got {short_repr(layers_per_ipu)}; it places {fixed} layers but the model "
                f"has {num_layers}; make the entries sum to {num_layers} or use -1 wildcards."
            )
        if fixed > num_layers:
            _said_surplus(field, tuple(layers_per_ipu), num_layers, tuple(taken))
        return taken
    left = num_layers - fixed
    if left < 0:
        raise IncompatibleIPUConfigError(
            f"IPUConfig field `{field}`: got {short_repr(layers_per_ipu)}; it places {fixed} layers explicitly but the "
            f"model has only {num_layers}."
        )
    if left < len(wildcards):  # a wildcard asks for layers, as an explicit count does: none would be an empty stage
        raise IncompatibleIPUConfigError(
            f"IPUConfig field `{field}`: got {short_repr(layers_per_ipu)}; its {len(wildcards)} -1 wildcards share the "
            f"{left} layers the other entries leave of the model's {num_layers}, so a wildcard would hold none; use "
            f"at most {left} wildcards, or place fewer layers explicitly"
        )
    base, extra = divmod(left, len(wildcards))
    resolved = list(layers_per_ipu)
    for rank, i in enumerate(wildcards):
        resolved[i] = base + (1 if rank >= len(wildcards) - extra else 0)
    return resolved


def _taken_in_order(layers_per_ipu: list[int], num_layers: int) -> list[int]:
    """Optimum Graphcore's placement (`get_layer_ipu`): the model's layers fill the slots in order, as many as each
    asks for, so a config for a deeper model runs a shallower one (`layers_per_ipu=[40]` on one IPU)."""
    taken, left = [], num_layers
    for asked in layers_per_ipu:
        taken.append(min(asked, left))
        left -= taken[-1]
    return taken


@functools.cache  # once per process and layout
def _said_surplus(field: str, asked: tuple[int, ...], num_layers: int, taken: tuple[int, ...]) -> None:
    logger.warning(
        "IPUConfig field `%s`: %s places %d layers and the model has %d: as in Optimum Graphcore, the slots take "
        "the model's layers in order (%s)",
        field,
        list(asked),
        sum(asked),
        num_layers,
        list(taken),
    )


def layers_per_stage(ipu_config: IPUConfig, num_layers: int, inference: bool | None = None) -> list[int]:
    """`layers_per_ipu` of `ipu_config` with its `-1` wildcards resolved against `num_layers`: of the config's
    current mode, or of the inference (`inference=True`) or training (`inference=False`) layout whatever the mode.

    Example:

    ```python
    >>> layers_per_stage(IPUConfig(layers_per_ipu=[0, -1, 2, -1]), 12)
    [0, 5, 2, 5]
    ```
    """
    inference = ipu_config.mode == "inference" if inference is None else inference
    field = "inference_layers_per_ipu" if inference else "layers_per_ipu"
    layers_per_ipu = ipu_config.value("layers_per_ipu", inference=inference)
    if field in ipu_config.__dict__.get("auto_layers", ()):
        _check_auto_fits(field, len(layers_per_ipu), num_layers)
    return resolve_layers_per_ipu(layers_per_ipu, num_layers, field=field)


def _check_auto_fits(field: str, stages: int, num_layers: int) -> None:
    """`"auto"` asks a layer of every stage, as an explicit count does (`resolve_layers_per_ipu`): more stages than
    layers would leave one empty without a word. (A model without layers is refused where "auto" measures.)"""
    if 0 < num_layers < stages:
        ipus_field = "inference_ipus_per_replica" if field.startswith("inference_") else "ipus_per_replica"
        raise IncompatibleIPUConfigError(
            f'IPUConfig field `{field}`: "auto" over {stages} stages (`{ipus_field}`) but the model has {num_layers} '
            f"layers, so a stage would hold none; set `{ipus_field}` to at most {num_layers}"
        )


def measured_auto_fields(ipu_config: IPUConfig) -> tuple[str, ...]:
    """The layout fields given as `"auto"` that `parallelize()` balances by measuring the model: those of more than
    one stage (one stage holds every layer, nothing to measure)."""
    return tuple(f for f in ipu_config.__dict__.get("auto_layers", ()) if len(ipu_config.__dict__[f]) > 1)


def check_auto_on_stage_processes(ipu_config: IPUConfig, model_name: str) -> None:
    """`"auto"` measures each layer of the whole model in one process (`runtime.stages.balance`); with the stages on
    separate processes no process ever holds the whole model: refused in one line, before anything is built.

    Args:
        ipu_config (`IPUConfig`): the layout.
        model_name (`str`): the model folder or id, named in the `optimum-ipu config balance` command of the fix.
    """
    fields = measured_auto_fields(ipu_config)
    if not fields:
        return
    stages = len(ipu_config.__dict__[fields[0]])
    raise IncompatibleIPUConfigError(
        f'IPUConfig field `{fields[0]}`: "auto" cannot balance the stages when they run on separate processes (it '
        "measures every layer of the whole model in one process, and each process holds only its own stage); give "
        f"the {stages} counts instead: `optimum-ipu config balance {model_name} --n-ipu {stages}` prints balanced ones"
    )


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage of a replica (one device slot).

    Args:
        index (`int`): the stage's position, which is also its device slot in the replica (`ipu{index}`).
        layers (`range`): indices of the layers it runs, counted over the plan's layer lists.
        embeddings (`bool`): it runs the embeddings (stage 0).
        heads (`bool`): it runs the heads and the loss (the last stage).
    """

    index: int
    layers: range
    embeddings: bool
    heads: bool

    def describe(self) -> str:
        parts = ["embeddings"] if self.embeddings else []
        if len(self.layers):
            last = self.layers[-1]
            parts.append(f"layer {last}" if len(self.layers) == 1 else f"layers {self.layers[0]}-{last}")
        if self.heads:
            parts.append("heads")
        return " + ".join(parts) or "(empty: passes activations on)"


def stage_layout(ipu_config: IPUConfig, num_layers: int, inference: bool | None = None) -> list[StageSpec]:
    """Stages of `ipu_config` for a model of `num_layers` layers: of its current mode, or of the inference
    (`inference=True`) or training layout."""
    counts = layers_per_stage(ipu_config, num_layers, inference=inference)
    stages, start = [], 0
    for index, count in enumerate(counts):
        stages.append(
            StageSpec(index, range(start, start + count), embeddings=index == 0, heads=index == len(counts) - 1)
        )
        start += count
    return stages


def format_layout(stages: list[StageSpec]) -> str:
    """A printable table: one line per device slot."""
    return "\n".join(f"  ipu{s.index}: {s.describe()}" for s in stages)
