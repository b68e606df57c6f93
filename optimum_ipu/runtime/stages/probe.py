"""What one forward of the whole model shows of its layers, and the exits that end a forward where a stage ends.

`StageModule` (`stages/cut.py`) runs the stock forward cut to one stage's layers: it stops the forward by raising
`StageExit` from a hook where the stage's last layer returns (or where the next stage's first layer is called).
Before its first stage run it probes the whole model once (`probe_layers`), to learn how each layer is called and
what it returns, so that its pass-throughs can stand in for the other stages' layers; the probe refuses, with a clear
error, a stack that a pass-through cannot stand in for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from ...errors import IncompatibleIPUConfigError

REGISTER_HINT = "run it in one stage (layers_per_ipu=[-1]) or register a plan (docs/adding_a_family.md)"


def model_name(model: nn.Module) -> str:
    return type(model).__name__


class StageExit(Exception):
    """Raised by a hook where a stage's forward ends; carries the hidden states the stage hands on."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


def first_hidden(output: Any) -> torch.Tensor:
    """The hidden states of a layer's or a stack's output (a tensor, a tuple or a `ModelOutput`)."""
    return output if isinstance(output, torch.Tensor) else output[0]


def exit_at_output(module: nn.Module, args: tuple, output: Any) -> None:
    """A forward hook: the forward ends where `module` returns."""
    raise StageExit(first_hidden(output))


def exit_at_input(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """A forward pre-hook (with kwargs): the forward ends where `module` is called, with what it was given."""
    raise StageExit(args[0] if args else kwargs["hidden_states"])


@dataclass
class LayerProbe:
    """What one forward of the whole model showed of its layers (`probe_layers`)."""

    arity: dict[int, int] = field(default_factory=dict)  # 0: the layer returns a tensor; n: a tuple of n items
    calls: dict[int, int] = field(default_factory=dict)  # how many times each layer ran
    encoder_output: type = BaseModelOutput  # the class of the encoder's output, rebuilt for the decoder stages


def _tensor_ids(values: Any) -> set[int]:
    """Ids of the tensors among `values` and one level of tuples or lists inside them."""
    found = set()
    for value in values:
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, torch.Tensor):
                found.add(id(item))
    return found


def probe_layers(
    model: nn.Module, layers: Sequence[nn.Module], batch: dict[str, Any], strict: bool, encoder_path: str | None
) -> LayerProbe:
    """Run the whole model once and see how its layers are called and what they return, so that a stand-in can
    return the same shape; refuse what a pass-through cannot stand in for (a clear error, not other numbers).

    The forward ends after the last layer. It runs in the model's own mode (an evaluation forward may change
    weights: RWKV rescales them in place), with the RNG put back and changed buffers restored afterwards (running
    statistics), so it leaves no trace in the training run.

    Args:
        model (`nn.Module`): the whole model; `batch` its inputs (one row is enough).
        layers (`Sequence[nn.Module]`): the stack the stages cut, in order.
        strict (`bool`): a derived plan (`StageCut.strict`): refuse layers that return a dict or hand on other state.
        encoder_path (`str`, *optional*): an encoder-decoder's encoder (`EncoderSplit.path`), whose output class is
            recorded.

    Raises:
        `IncompatibleIPUConfigError`: a layer runs more than once per forward (ALBERT shares one layer between
            positions), or, for a derived plan, a layer returns a dict or hands the next layer a tensor besides
            its hidden states (a position bias, global tokens: state a pass-through would drop).
    """
    probe, inputs, extras, kept = LayerProbe(), {}, {}, []

    def before(i: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            inputs[i] = _tensor_ids([*args, *kwargs.values()])

        return hook

    def after(i: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            probe.calls[i] = probe.calls.get(i, 0) + 1
            if isinstance(output, Mapping) and strict:
                raise IncompatibleIPUConfigError(
                    f"{model_name(model)}: layer {i} returns a {type(output).__name__}; {REGISTER_HINT}"
                )
            probe.arity[i] = 0 if isinstance(output, torch.Tensor) else len(output)
            rest = tuple(output)[1:] if probe.arity[i] else ()
            kept.append(rest)  # alive until the end, so that no id is reused
            extras[i] = _tensor_ids(rest)

        return hook

    handles = [layer.register_forward_pre_hook(before(i), with_kwargs=True) for i, layer in enumerate(layers)]
    handles += [layer.register_forward_hook(after(i)) for i, layer in enumerate(layers)]
    if encoder_path is not None:
        encoder = model.get_submodule(encoder_path)
        handles.append(encoder.register_forward_hook(lambda m, a, out: setattr(probe, "encoder_output", type(out))))
    # the heads after the last layer tell nothing about the layers (and a vocabulary projection held by another
    # process would be read whole): the probe ends there
    handles.append(layers[-1].register_forward_hook(exit_at_output))
    run_leaving_no_trace(model, batch, handles)
    repeated = {i: n for i, n in probe.calls.items() if n > 1}
    if repeated:
        first = min(repeated)
        raise IncompatibleIPUConfigError(
            f"{model_name(model)}: layer {first} ran {repeated[first]} times in one forward; stages can only cut a "
            f"stack whose layers run once each, in order; {REGISTER_HINT}"
        )
    handed = [i for i in extras if extras[i] & inputs.get(i + 1, set())]
    if strict and handed:
        raise IncompatibleIPUConfigError(
            f"{model_name(model)}: layer {handed[0]} hands the next layer a tensor besides its hidden states; a "
            f"derived plan cannot carry it between stages; {REGISTER_HINT}"
        )
    if not issubclass(probe.encoder_output, Mapping):
        probe.encoder_output = BaseModelOutput
    return probe


def run_leaving_no_trace(model: nn.Module, batch: dict[str, Any], handles: list[Any]) -> None:
    """One forward without gradients, the RNG put back and changed buffers restored; removes `handles` after."""
    device = next(v for v in batch.values() if isinstance(v, torch.Tensor)).device
    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type):
        try:
            with torch.no_grad():
                model(**batch)
        except StageExit:
            pass
        finally:
            for handle in handles:
                handle.remove()
            with torch.no_grad():  # only what changed: an in-place copy would stale autograd's saved buffers
                for name, buffer in model.named_buffers():
                    if not buffer.is_meta and not torch.equal(buffer, buffers[name]):
                        buffer.copy_(buffers[name])


__all__ = ["LayerProbe", "StageExit", "exit_at_input", "exit_at_output", "first_hidden", "probe_layers"]
