"""What one process holds of a model whose pipeline stages run on separate processes.

A stage's process keeps only the parameters its stage runs; every other parameter is a tensor on the meta device
(no memory), so the stock `transformers` model keeps its structure, its names and its `forward`, and the stage runtime
(`stages/cut.py`) runs it cut to the stage. Which parameters a stage runs follows from the model's plan:

- the parameters of its own layers;
- the embeddings (`StagePlan.embeddings`) on a stage that starts the hidden states itself: stage 0, and an
  encoder-decoder's first decoder stage. A stage that receives the hidden states stands its embeddings in with zeros
  of their output's shape (`stages.cut.ShapeOnly`): their output would be replaced by what it receives;
- the encoder's other parts (its final norm) on the stage that runs the encoder's last layer;
- everything else (final norms, pooler, heads) on the last stage;
- what a plan's stand-in for another stage's layer borrows (T5's relative position table);
- a tied parameter (input embedding = output projection) wherever one of its names is held.

Buffers (position ids, rotary tables) are small and kept on every process. `hold_stage` frees what a whole model does
not need here; `models.stage_loading.load_stage` builds the model on the meta device and reads only the held tensors. An
adapter wrapper (`peft`'s `get_peft_model`) put around a model loaded so takes its hold over, under the wrapper's names
(`stage_hold`): the base model is never whole in any process, and the other stages' adapters stay on the meta device.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...errors import IncompatibleIPUConfigError
from ..adapters import unwrap_adapters
from .cut import StageCut, stage_ranges

HELD_ELSEWHERE = (
    "{model} cannot run whole here: with pipeline stages on separate processes each process holds only its stage "
    "(another stage's layers are held by the process of another pipeline stage). Evaluate or predict the saved model "
    "in one process, or load the whole model in every process (transformers' from_pretrained) to evaluate during "
    "training"
)


class StageGate:
    """Runs one stage's forward and says while it runs (a forward of the whole model outside it is refused)."""

    running = False

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.running = True
        try:
            return fn(*args)
        finally:
            self.running = False


@dataclass
class StageHold:
    """What this process holds of a model whose stages run on separate processes.

    Args:
        mesh (`DeviceMesh`): the `("dp", "pp")` mesh (replicas x stages).
        layer_paths (`Sequence[str]`): every layer's dotted path, in pipeline order.
        ranges (`list[range]`): the layers of each stage.
        freed (`frozenset[str]`): names of the parameters held by other stages (on the meta device here).
        gate (`Callable`): runs each stage forward (`StageGate`; the FSDP root `fsdp.StageRoot` when sharded).
        sharded (`bool`): the stage's parameters are sharded over its replicas (FSDP2).
        owners (`dict[str, int]`): for parameters present on several stages (a tied embedding), the stage whose copy is
            saved; set by `PipelineEngine` after its first step (stage 0 before).
        cut (`StageCut`, *optional*): how the model was cut into stages (what a later stage run, e.g. generation, cuts
            it by).
        refusal (`RemovableHandle`, *optional*): the hook that refuses a forward of the whole model outside a stage.
    """

    mesh: Any
    layer_paths: Sequence[str]
    ranges: list[range]
    freed: frozenset[str]
    gate: Callable[..., Any] = field(default_factory=StageGate)
    sharded: bool = False
    owners: dict[str, int] = field(default_factory=dict)
    cut: StageCut | None = None
    refusal: Any = None

    @property
    def stage(self) -> int:
        return self.mesh.get_local_rank("pp")

    def stage_of(self, key: str) -> int | None:
        """The stage whose copy of a `state_dict` entry (or parameter name) is current: a layer's stage, else the
        stage that trains it (None before the first step: any stage that holds it)."""
        for i, path in enumerate(self.layer_paths):
            if key.startswith(path + "."):
                return next(stage for stage, layers in enumerate(self.ranges) if i in layers)
        return self.owners.get(key)


_HOLDS: weakref.WeakKeyDictionary[nn.Module, StageHold] = weakref.WeakKeyDictionary()


def stage_hold(model: nn.Module) -> StageHold | None:
    """What this process holds of `model` (`hold_stage`, `models.stage_loading.load_stage`), if it holds one stage
    only; for an adapter wrapper around a model that holds one stage, the wrapper's hold (`_adopt_wrapped_hold`)."""
    return _HOLDS.get(model) or _adopt_wrapped_hold(model)


def _adopt_wrapped_hold(wrapper: nn.Module) -> StageHold | None:
    """The hold of the model inside an adapter wrapper (`peft`'s `PeftModel.get_base_model()`), moved to the wrapper:
    its paths under the wrapper's names, what the wrapper added there (the other stages' adapters, put on the meta
    device by `peft` beside their base layers) freed alike, and the refusal of whole-model forwards on the wrapper.
    Read through the wrapper's own API: `peft` is never imported here."""
    if not callable(getattr(type(wrapper), "get_base_model", None)):
        return None
    hold = _HOLDS.get(wrapper.get_base_model())
    if hold is None or hold.cut is None or hold.sharded:  # most calls end here: a wrapper of a whole model
        return None
    prefix, inner = unwrap_adapters(wrapper)
    if not prefix:
        return None
    del _HOLDS[inner]
    if hold.refusal is not None:
        hold.refusal.remove()
    cut = hold.cut
    encoder = cut.encoder and dataclasses.replace(cut.encoder, path=f"{prefix}.{cut.encoder.path}")
    cut = dataclasses.replace(
        cut,
        layer_paths=[f"{prefix}.{path}" for path in cut.layer_paths],
        embeddings=[f"{prefix}.{path}" for path in cut.embeddings],
        encoder=encoder,
    )
    adopted = hold_stage(wrapper, cut, [len(layers) for layers in hold.ranges], hold.mesh)
    adopted.owners.update({f"{prefix}.{name}": stage for name, stage in hold.owners.items()})
    return adopted


def _under(name: str, paths: Iterable[str]) -> bool:
    return any(name.startswith(path + ".") for path in paths)


def held_parameter_names(model: nn.Module, cut: StageCut, counts: Sequence[int], stage: int) -> set[str]:
    """The names (tied aliases included) of the parameters stage `stage` runs (see the module docstring).

    Args:
        model (`nn.Module`): the stock model (its parameters may be on the meta device).
        cut (`StageCut`): its layers, embeddings and encoder-decoder split (`PipelinedModel.stage_cut()`).
        counts (`Sequence[int]`): the layers of each stage, wildcards resolved.
        stage (`int`): this process's stage.
    """
    ranges = stage_ranges(counts)
    own, last = ranges[stage], len(counts) - 1
    starts_hidden = cut.makes_hidden_states(own, stage == 0)
    encoder_end = None
    if cut.encoder is not None and cut.encoder.num_layers:
        encoder_end = next(s for s, r in enumerate(ranges) if cut.encoder.num_layers - 1 in r)
    own_paths = [cut.layer_paths[i] for i in own]
    borrowed: set[int] = set()
    for i, path in enumerate(cut.layer_paths):
        stand_in = cut.stand_in(model.get_submodule(path)) if cut.stand_in is not None and i not in own else None
        borrowed.update(id(p) for p in getattr(stand_in, "borrowed_parameters", lambda: ())())
    held: set[int] = set(borrowed)
    for name, param in model.named_parameters(remove_duplicate=False):
        if _under(name, cut.layer_paths):
            keep = _under(name, own_paths)
        elif _under(name, cut.embeddings):
            keep = starts_hidden or not cut.shape_only_embeddings
        elif cut.encoder is not None and _under(name, [cut.encoder.path]):
            keep = stage == encoder_end
        else:
            keep = stage == last
        if keep:
            held.add(id(param))
    return {name for name, param in model.named_parameters(remove_duplicate=False) if id(param) in held}


def replace_parameter(model: nn.Module, old: nn.Parameter, new: nn.Parameter) -> None:
    """Put `new` wherever `old` is registered (every module that shares a tied parameter)."""
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is old:
                module._parameters[name] = new


def free_parameters(model: nn.Module, keep: set[str]) -> frozenset[str]:
    """Move every parameter not named in `keep` to the meta device, frozen (tied names alike); returns their names."""
    freed: set[str] = set()
    done: set[int] = set()
    for name, param in list(model.named_parameters(remove_duplicate=False)):
        if name in keep:
            continue
        freed.add(name)
        if not param.is_meta and id(param) not in done:
            done.add(id(param))
            replace_parameter(model, param, nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=False))
    return frozenset(freed)


def _refuse_outside(hold: StageHold) -> Callable[..., None]:
    def refuse(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not hold.gate.running:
            raise IncompatibleIPUConfigError(HELD_ELSEWHERE.format(model=type(module).__name__))

    return refuse


def register_hold(model: nn.Module, hold: StageHold) -> StageHold:
    """Record what this process holds of `model`; a forward of the whole model outside a stage is refused clearly."""
    hold.refusal = model.register_forward_pre_hook(_refuse_outside(hold), with_kwargs=True)
    _HOLDS[model] = hold
    return hold


def hold_stage(model: nn.Module, cut: StageCut, counts: Sequence[int], mesh: Any) -> StageHold:
    """Free, in place, every parameter of a whole `model` that this process's stage does not run.

    Args:
        model (`nn.Module`): the stock model, whole.
        cut (`StageCut`): its layers, embeddings and encoder-decoder split.
        counts (`Sequence[int]`): the layers of each stage, wildcards resolved.
        mesh (`DeviceMesh`): the `("dp", "pp")` mesh (`fsdp.stage_mesh`).

    Returns:
        `StageHold`: what this process holds (also found later by `stage_hold(model)`).
    """
    existing = stage_hold(model)
    if existing is not None:
        return existing
    stage = mesh.get_local_rank("pp")
    freed = free_parameters(model, held_parameter_names(model, cut, counts, stage))
    return register_hold(model, StageHold(mesh, list(cut.layer_paths), stage_ranges(counts), freed, cut=cut))
