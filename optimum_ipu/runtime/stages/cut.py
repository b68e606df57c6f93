"""One pipeline stage of an unmodified `transformers` model, and a driver that runs the stages one after another.

Each stage runs the model's stock `forward`, cut to its own layers: layers of other stages are swapped (during
this stage's forward only) for pass-throughs, the activations received from the previous stage are injected
where the stage's first layer takes its input, and the stage stops (an exception caught here) where its last
layer ends. The embeddings and mask preparation of the stock forward therefore run on every stage (cheap) and
nothing of a model's forward is copied.

What travels between stages is the hidden states; for an encoder-decoder model, once the encoder is done, its
output (after its final norm) travels too, and each decoder stage hands it to the stock forward as
`encoder_outputs` (so the encoder is not run again).

`PipelineEngine` (`stages/engine.py`) runs these stages on separate processes with
`torch.distributed.pipelining`; `run_stages_in_turn` runs them in one process, handing activations and their
gradients from stage to stage exactly as the schedules do, which is what the parity tests compare with the
stock model.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import ModelOutput

from ...errors import IncompatibleIPUConfigError
from ..precision import autocast
from .probe import (
    StageExit,
    exit_at_input,
    exit_at_output,
    first_hidden,
    model_name,
    probe_layers,
)

HIDDEN, ENCODER = "hidden", "encoder"


@dataclass(frozen=True)
class EncoderSplit:
    """Where an encoder-decoder model's encoder ends.

    Args:
        path (`str`): dotted path of the encoder stack (its output travels with the decoder stages).
        num_layers (`int`): how many of the pipeline layers are the encoder's (they come first).
    """

    path: str
    num_layers: int


@dataclass(frozen=True)
class StageCut:
    """What the stage runtime needs of a model's plan (`PipelinedModel.stage_cut()`).

    Args:
        layer_paths (`Sequence[str]`): dotted paths of every layer, in pipeline order.
        encoder (`EncoderSplit`, *optional*): the encoder-decoder split, if any.
        stand_in (`Callable`, *optional*): `(layer) -> nn.Module | None`, the plan's stand-in for a layer of
            another stage where a bare pass-through would change the numbers (`StagePlan.layer_stand_in`).
        strict (`bool`, *optional*, defaults to `False`): a derived plan: refuse layers that hand more than their
            hidden states on (a registered plan is tested, and declares stand-ins where needed).
        embeddings (`Sequence[str]`, *optional*): dotted paths of the modules whose output becomes the first layer's
            hidden states (`StagePlan.embeddings`): a stage that receives the hidden states runs them as `ShapeOnly`.
        shape_only_embeddings (`bool`, *optional*, defaults to `True`): `False` when the model's output carries an
            embedding's output (`StagePlan.embeddings_feed_hidden_states_only`): every stage runs them whole.
    """

    layer_paths: Sequence[str]
    encoder: EncoderSplit | None = None
    stand_in: Callable[[nn.Module], nn.Module | None] | None = None
    strict: bool = False
    embeddings: Sequence[str] = ()
    shape_only_embeddings: bool = True

    def makes_hidden_states(self, layers: range, first: bool) -> bool:
        """Whether a stage with `layers` computes hidden states from the inputs (runs its embeddings for their
        output): the first stage, and an encoder-decoder's stage where the decoder starts."""
        return first or (self.encoder is not None and self.encoder.num_layers in range(layers.start, layers.stop + 1))

    def carried(self, boundary: int) -> tuple[str, ...]:
        """Names of the tensors that travel into the layer at `boundary` (the count of layers before it)."""
        if self.encoder is None or boundary < self.encoder.num_layers:
            return (HIDDEN,)
        return (ENCODER,) if boundary == self.encoder.num_layers else (HIDDEN, ENCODER)


def stage_ranges(counts: Sequence[int]) -> list[range]:
    """The layer indices of each stage, from the number of layers of each."""
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return [range(start, start + count) for start, count in zip(starts, counts, strict=True)]


class _PassThrough(nn.Module):
    """Stands in for a layer of another stage: returns the hidden states it is given, shaped as that layer's
    output (a tensor, or a tuple of that length whose other items are `None`). Other attributes are the layer's
    (base models read a layer's `attention_type` and the like between layers).

    Given a KV cache (generation), it appends a placeholder for its layer's new tokens (`hold_place`): the keys and
    values live in the cache of the process that runs the layer, while this process's cache keeps its lengths."""

    def __init__(self, arity: int = 0, layer: nn.Module | None = None) -> None:
        super().__init__()
        self.arity = arity
        self.__dict__["_layer"] = layer  # a plain reference: its parameters stay registered in the model only
        # the cache index of the layer's attention (its `layer_idx`), if it has one
        indices = (getattr(m, "layer_idx", None) for m in (layer.modules() if layer is not None else ()))
        self.__dict__["_cache_index"] = next((i for i in indices if isinstance(i, int)), None)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            layer = self.__dict__.get("_layer")
            if layer is None:
                raise
            return getattr(layer, name)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        cache = next((v for v in (*args, *kwargs.values()) if isinstance(v, Cache)), None)
        if cache is not None and self.__dict__["_cache_index"] is not None:
            hold_place(cache, self.__dict__["_cache_index"], hidden_states)
        return (hidden_states, *([None] * (self.arity - 1))) if self.arity else hidden_states


def hold_place(cache: Cache, index: int, hidden_states: torch.Tensor) -> None:
    """Append to cache layer `index` one zero per new token and row (keys and values of shape `(batch, 1, tokens,
    1)`), for a layer run by another process: `transformers` reads the cached length (positions, masks) from a
    layer's keys and reorders every layer for beam search, so each layer must follow the tokens; one value each
    (not an empty tensor, which a dynamic cache would count as no tokens) is all the memory it takes."""
    placeholder = hidden_states.new_zeros(hidden_states.shape[0], 1, hidden_states.shape[1], 1)
    if isinstance(cache, EncoderDecoderCache):
        cross = cache.cross_attention_cache
        layer = cross.layers[index] if index < len(cross.layers) else None
        if layer is not None and not layer.is_initialized and getattr(layer, "max_cache_len", None) is None:
            # one value per row for the encoder's keys and values too: Whisper's generate() splits every layer's
            # cross-attention cache by row when it returns the cache
            cross.update(placeholder[:, :, :1], placeholder[:, :, :1], index)
        cache = cache.self_attention_cache
    cache.update(placeholder, placeholder, index)


class _ZerosForMeta(TorchFunctionMode):
    """While the probe runs the whole model, a parameter held by another process (on the meta device) reads as zeros
    on `device`, one operation at a time, so no process ever holds the whole model: the probe learns how layers are
    called and what they return, not values."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "__get__":  # a property: only `.device` must not say "meta"
            held_elsewhere = args and isinstance(args[0], nn.Parameter) and args[0].is_meta
            if held_elsewhere and getattr(func, "__self__", None) is torch.Tensor.device:
                return self.device
            return func(*args, **kwargs)
        return func(*tree_map(self._zeros, args), **tree_map(self._zeros, kwargs))

    def _zeros(self, value: Any) -> Any:
        if isinstance(value, nn.Parameter) and value.is_meta:  # one zero, seen at every index: no memory
            return torch.zeros((), dtype=value.dtype, device=self.device).expand(value.shape)
        return value


class ShapeOnly(nn.Module):
    """Stands in for an embedding module on a stage that receives the hidden states: the stock forward still calls
    it, but the first layer of the stage is given the received hidden states instead of its output. Only its output's
    shape and dtype are read (masks are made from them): computed on the meta device, returned as zeros. Its weights
    are then not needed on this stage."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.__dict__["_module"] = module  # a plain reference: its parameters stay registered in the model only

    def __getattr__(self, name: str) -> Any:  # the base model may read the module's attributes (ViT: a weight's dtype)
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_module"], name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        module = self.__dict__["_module"]
        device = next(t.device for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor))
        state = {n: t.to("meta") for n, t in (*module.named_parameters(), *module.named_buffers())}
        to_meta = lambda v: v.to("meta") if isinstance(v, torch.Tensor) else v  # noqa: E731
        with torch.no_grad():
            output = functional_call(module, state, tree_map(to_meta, args), tree_map(to_meta, kwargs))
        zeros = lambda t: torch.zeros(t.shape, dtype=t.dtype, device=device) if isinstance(t, torch.Tensor) else t  # noqa: E731
        return tree_map(zeros, output)


def _first_row(value: Any) -> Any:
    """The first row of a batch tensor, or of each tensor of a model output (an encoder's output handed to the
    decoder in generation); anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value[:1] if value.dim() else value
    if isinstance(value, ModelOutput):
        return type(value)(**{k: _first_row(v) for k, v in value.items()})
    return value


def default_objective(output: Any) -> torch.Tensor:
    """The model's own loss, shaped `(1,)` (the schedules concatenate micro-batch outputs)."""
    return output.loss.float().reshape(1)


class _OnBackward(torch.autograd.Function):
    """A copy whose backward first calls `hook()`."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, hook: Callable[[], None]) -> torch.Tensor:
        ctx.hook = hook
        return tensor.clone()  # not a view: the schedule may write into what a stage returns

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.hook()
        return grad, None


class StageModule(nn.Module):
    """One pipeline stage of a `transformers` model (see the module docstring).

    The whole model stays in place between forwards (so it can be saved, evaluated and synchronised as the stock
    model); only while this stage runs are the layers of other stages swapped out, and its hooks are on the
    model's layers only then.

    Args:
        model (`nn.Module`): the stock model.
        cut (`StageCut`): the layers and the encoder-decoder split.
        layers (`range`): the layers of this stage.
        index (`int`) / num_stages (`int`): this stage's position and the number of stages.
        keys (`Sequence[str]`): names of the batch tensors, in the order stage 0 receives them.
        precision (`str`, *optional*, defaults to `"fp32"`): `"fp32"` or `"bf16"` (autocast inside the stage).
        objective (`Callable`, *optional*): what the last stage returns of the model's output (the loss, `(1,)`).
        root (`Callable`, *optional*): `(fn, *tensors) -> fn(*tensors)`, run around each forward: the stage's FSDP
            root (`fsdp.StageRoot`) when its parameters are sharded.
    """

    def __init__(
        self,
        model: nn.Module,
        cut: StageCut,
        layers: range,
        index: int,
        num_stages: int,
        keys: Sequence[str],
        precision: str = "fp32",
        objective: Callable[[Any], torch.Tensor] = default_objective,
        root: Callable[..., Any] | None = None,
    ) -> None:
        super().__init__()
        self._root = root.__call__ if root is not None else None  # not registered: it holds the model too
        self.model, self.cut, self.layers, self.index, self.num_stages = model, cut, layers, index, num_stages
        self.keys, self.precision, self.objective = list(keys), precision, objective
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        # An empty stage between two others only passes its input on.
        self.identity = not len(layers) and not self.is_first and not self.is_last
        self.last_output: Any = None  # the model's output at the last stage's latest forward
        # run as the backward of a step's last micro-batch begins here (FSDP: reduce-scatter the gradients then only)
        self.on_last_backward: Callable[[], None] | None = None
        self._micro_batches: deque[dict[str, torch.Tensor]] = deque()
        self._last_batch: dict[str, torch.Tensor] | None = None
        self._ran_last = False
        self._layers = [model.get_submodule(p) for p in cut.layer_paths]
        # A stage that receives the hidden states runs its embeddings for their output's shape only (`ShapeOnly`).
        whole = cut.makes_hidden_states(layers, self.is_first) or not cut.shape_only_embeddings
        embeddings = [] if whole else [model.get_submodule(p) for p in cut.embeddings]
        self._shape_only = [(m, ShapeOnly(m)) for m in embeddings if next(m.parameters(), None) is not None]
        self._shape_only_sites: list[tuple[nn.Module, str, nn.Module, nn.Module]] | None = None
        self._stand_ins: dict[int, nn.Module] | None = None  # built on the first forward (see _learn_layers)
        self._encoder_output: type = BaseModelOutput  # the class the encoder returns (MoE encoders add fields)
        config = getattr(model, "config", None)
        for name in ("layerdrop", "encoder_layerdrop", "decoder_layerdrop"):
            if num_stages > 1 and (getattr(config, name, 0.0) or 0.0) > 0:
                # a dropped layer never runs, so a stage starting there would never receive its input
                raise IncompatibleIPUConfigError(
                    f"{name}={getattr(config, name)}: {model_name(model)} skips layers at random in training, which "
                    f"stages run apart cannot follow; load the model with {name}=0.0, or run one stage"
                )

    # ------------------------------------------------------------------ feeding
    def reset(self, micro_batches: list[dict[str, torch.Tensor]], first_step: bool = False) -> None:
        """The micro-batches of the next schedule step, in order (the schedules run forwards in order).

        On the first step of a process pipeline, the stage's metadata inference runs one extra forward (on empty
        tensors of the received shapes) before the real ones: stages after the first get micro-batch 0 once more.
        """
        extra = micro_batches[:1] if first_step and self.index > 0 else []
        self._micro_batches = deque(extra + micro_batches)
        self._last_batch = micro_batches[-1]

    def _next_micro_batch(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.index == 0:
            # Stage 0 gets its micro-batch's first tensor from the schedule (a view of the host batch): find
            # the micro-batch it belongs to, which also serves the schedule's shape-inference call.
            for batch in self._micro_batches:
                if batch[self.keys[0]].data_ptr() == received.data_ptr():
                    return batch
            raise RuntimeError("stage 0 received a micro-batch it was not fed")
        return self._micro_batches.popleft()

    # --------------------------------------------------------------- stand-ins
    def _learn_layers(self, batch: dict[str, torch.Tensor]) -> dict[int, nn.Module]:
        """Stand-ins for the layers of other stages, each returning what its layer returns (a tensor or a tuple
        of some length): learnt from one forward of the whole model on one row, so no family needs declaring."""
        row = {k: _first_row(v) for k, v in batch.items()}
        if any(isinstance(v, Cache) for v in row.values()):
            # a generation's step: the probe runs every layer, which would write into the KV cache; it runs without
            # it, and without the attention mask, which may be sized to the cache (a static cache's full length)
            row = {k: v for k, v in row.items() if not isinstance(v, Cache) and k != "attention_mask"}
            row["use_cache"] = False
        with _ZerosForMeta(next(v for v in batch.values() if isinstance(v, torch.Tensor)).device):
            encoder_path = self.cut.encoder.path if self.cut.encoder is not None else None
            probe = probe_layers(self.model, self._layers, row, self.cut.strict, encoder_path)
        self._encoder_output = probe.encoder_output
        by_class = {type(self._layers[i]): n for i, n in probe.arity.items()}  # for a layer the probe skipped
        stand_ins: dict[int, nn.Module] = {}
        for i, layer in enumerate(self._layers):
            if i not in self.layers:
                own = self.cut.stand_in(layer) if self.cut.stand_in is not None else None
                arity = probe.arity.get(i, by_class.get(type(layer), 0))
                stand_ins[i] = own if own is not None else _PassThrough(arity, layer)
        return stand_ins

    # ------------------------------------------------------------------ running
    def forward(self, *tensors: torch.Tensor) -> Any:
        output = self._root(self._forward, *tensors) if self._root is not None else self._forward(*tensors)
        if self._ran_last and self.on_last_backward is not None and torch.is_grad_enabled():
            # the backward of this output comes first among the last micro-batch's (the schedules run backwards in
            # micro-batch order): the callback runs before any of its gradients reach a parameter
            hook = self.on_last_backward
            output = (
                tuple(_OnBackward.apply(t, hook) for t in output)
                if isinstance(output, tuple)
                else _OnBackward.apply(output, hook)
            )
        return output

    def _forward(self, *tensors: torch.Tensor) -> Any:
        batch = self._next_micro_batch(tensors[0])
        self._ran_last = batch is self._last_batch
        if self.identity:
            return tensors if len(tensors) > 1 else tensors[0]
        if self._stand_ins is None:
            self._stand_ins = self._learn_layers(batch)
        received = {} if self.is_first else dict(zip(self.cut.carried(self.layers.start), tensors, strict=True))
        extra = {}
        if ENCODER in received:
            extra["encoder_outputs"] = self._encoder_output(last_hidden_state=received[ENCODER])
        handles, encoder_output = self._hook(received), {}
        if not self.is_last and ENCODER in self.cut.carried(self.layers.stop) and ENCODER not in received:
            # this stage runs the encoder's end: keep its output to send on with the decoder's hidden states
            encoder = self.model.get_submodule(self.cut.encoder.path)
            keep = encoder.register_forward_hook(
                lambda m, a, out: encoder_output.__setitem__(ENCODER, first_hidden(out))
            )
            handles.append(keep)
        swaps = self._swaps()
        for parent, name, _, stand_in in swaps:
            parent._modules[name] = stand_in
        try:
            with autocast(tensors[0].device, self.precision):
                output = self.model(**batch, **extra)
        except (RuntimeError, NotImplementedError) as error:
            if "meta" not in str(error):
                raise
            raise IncompatibleIPUConfigError(
                f"stage {self.index} of {model_name(self.model)} ran a module whose weights this process does not hold "
                f"(another stage's): {error}. Its plan must list that module in StagePlan.embeddings (it runs before "
                "the first layer); meanwhile run its stages in one process"
            ) from error
        except StageExit as stage_end:
            carried = self.cut.carried(self.layers.stop)
            sent = (stage_end.value,)
            if carried == (HIDDEN, ENCODER):
                sent += (received[ENCODER] if ENCODER in received else encoder_output[ENCODER],)
            # a tensor sent on unchanged still needs its own autograd node, so its gradient reaches this stage;
            # contiguous, since the receiving buffers copy the strides (Whisper's encoder runs on a transpose)
            sent = tuple((t.view_as(t) if any(t is r for r in received.values()) else t).contiguous() for t in sent)
            return sent if len(sent) > 1 else sent[0]
        finally:
            for parent, name, original, _ in swaps:
                parent._modules[name] = original
            for handle in handles:
                handle.remove()
        self.last_output = output
        return self.objective(output)

    def _swaps(self) -> list[tuple[nn.Module, str, nn.Module, nn.Module]]:
        """(parent, name, module, stand-in) of every module swapped while this stage runs: the layers of other stages,
        and the embeddings of a stage that receives the hidden states (wherever they are registered: T5's decoder
        holds the shared embedding too)."""
        swaps = []
        for i, path in enumerate(self.cut.layer_paths):
            if i not in self.layers:
                parent, _, name = path.rpartition(".")
                swaps.append((self.model.get_submodule(parent), name, self._layers[i], self._stand_ins[i]))
        if self._shape_only_sites is None:
            self._shape_only_sites = [
                (parent, n, module, stand_in)
                for module, stand_in in self._shape_only
                for parent in self.model.modules()
                for n, child in parent._modules.items()
                if child is module
            ]
        return swaps + self._shape_only_sites

    def _hook(self, received: dict[str, torch.Tensor]) -> list[Any]:
        """Hooks that inject the received hidden states and end the stage at its last layer (removed after)."""
        start, stop, total = self.layers.start, self.layers.stop, len(self._layers)
        handles = []
        if HIDDEN in received:
            incoming = received[HIDDEN]
            if start < total:
                handles.append(self._layers[start].register_forward_pre_hook(_injector(incoming), with_kwargs=True))
            else:  # an empty last stage: the heads take what the last layer would have given
                handles.append(self._stand_ins[total - 1].register_forward_hook(_output_injector(incoming)))
        if self.is_last:
            return handles
        if stop == 0:  # a stage of embeddings only: it ends where layer 0 (of another stage) would start
            handles.append(self._stand_ins[0].register_forward_pre_hook(exit_at_input, with_kwargs=True))
        elif self.cut.carried(stop) == (ENCODER,):  # it ends with the encoder: send the encoder's output
            encoder = self.model.get_submodule(self.cut.encoder.path)
            handles.append(encoder.register_forward_hook(exit_at_output))
        else:
            handles.append(self._layers[stop - 1].register_forward_hook(exit_at_output))
        return handles


def _injector(incoming: torch.Tensor) -> Callable[..., tuple[tuple, dict]]:
    def inject(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (incoming, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": incoming}

    return inject


def _output_injector(incoming: torch.Tensor) -> Callable[..., Any]:
    def inject(module: nn.Module, args: tuple, output: Any) -> Any:
        return incoming if isinstance(output, torch.Tensor) else (incoming, *output[1:])

    return inject


def run_stages_in_turn(
    model: nn.Module,
    cut: StageCut,
    counts: Sequence[int],
    batch: dict[str, torch.Tensor],
    objective: Callable[[Any], torch.Tensor] = default_objective,
) -> tuple[Any, torch.Tensor]:
    """Forward and backward of one micro-batch, each stage running only its own modules, in one process.

    Stage i's outputs are handed to stage i+1 as fresh leaves (as a process pipeline receives them); the backward
    then runs stage by stage in reverse, each given the gradients of the activations it sent. Parameters used by
    several stages (tied embeddings, shared position tables) accumulate every stage's gradient.

    Args:
        model (`nn.Module`): the stock model.
        cut (`StageCut`): its layers and encoder-decoder split (`PipelinedModel.stage_cut()`).
        counts (`Sequence[int]`): layers of each stage (`optimum_ipu.models.layout.layers_per_stage`).
        batch (`dict[str, torch.Tensor]`): the model's inputs, labels included.
        objective (`Callable`, *optional*): what is differentiated of the last stage's output (the loss).

    Returns:
        `(output, objective)`: the model's output at the last stage and the objective (backward already done).
    """
    keys = list(batch)
    ranges = stage_ranges(counts)
    stages = [StageModule(model, cut, r, i, len(ranges), keys, objective=objective) for i, r in enumerate(ranges)]
    sent: tuple[torch.Tensor, ...] = (batch[keys[0]],)
    saved = []
    for stage in stages:
        stage.reset([batch])
        inputs = sent if stage.is_first else tuple(t.detach().requires_grad_(t.is_floating_point()) for t in sent)
        out = stage(*inputs)
        saved.append((inputs, out if isinstance(out, tuple) else (out,)))
        sent = saved[-1][1]
    result = sent[0].sum()
    grads: tuple[torch.Tensor | None, ...] = (None,)
    for (inputs, outputs), stage in zip(reversed(saved), reversed(stages), strict=True):
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if o.requires_grad and g is not None]
        if stage.is_last:
            pairs = [(outputs[0].sum(), None)]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        grads = tuple(t.grad if t.requires_grad else None for t in inputs)
    return stages[-1].last_output, result
