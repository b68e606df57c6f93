"""Stages that balance themselves: each layer's cost measured on the device at hand, and the contiguous split of the
layers over the stages that makes the slowest stage as fast as it can be within each device's memory.

`measure_layer_costs` runs the stock model forward and backward a few times and times it at the layers' boundaries
(forward hooks on each layer of the plan; in the backward, an identity autograd node on each layer's input and output
whose backward notes the time). Each unit gets the time from the previous boundary to its own end, so the work
between layers (masks, a decoder's embeddings) counts with the layer that follows it, the embeddings are the time
before the first layer and the heads (with the loss) the time after the last. Memory per unit is its parameters
(x4 in training: weights, gradients and Adam's two moments) and the activations autograd saved while it ran (counted
by `torch.autograd.graph.saved_tensors_hooks`, parameters left out).

`balanced_split` is the linear partition problem solved exactly by dynamic programming over the measured costs; the
predicted step time of GPipe or 1F1B with `m` micro-batches over stages of times `t_s` is
`sum(t_s) + (m - 1) x max(t_s)` (one fill and drain, then the slowest stage sets the pace).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ...errors import IncompatibleIPUConfigError
from .cut import StageCut, StageModule, stage_ranges

TRAINING_STATE_FACTOR = 4  # weights, gradients, Adam's exp_avg and exp_avg_sq: 4 copies of each parameter


@dataclass
class UnitCost:
    """The measured cost of one unit of the model (the embeddings, one layer, or the heads).

    Args:
        name (`str`): `"embeddings"`, `"layer i"` or `"heads"`.
        forward_s (`float`) / backward_s (`float`): median seconds of its forward / backward, one micro-batch.
        param_bytes (`int`): bytes of the parameters it holds.
        activation_bytes (`int`): bytes of the activations autograd keeps for its backward, one micro-batch.
    """

    name: str
    forward_s: float = 0.0
    backward_s: float = 0.0
    param_bytes: int = 0
    activation_bytes: int = 0

    @property
    def seconds(self) -> float:
        return self.forward_s + self.backward_s

    def memory(self, in_flight: int) -> int:
        """Training memory with `in_flight` micro-batches' activations held at once."""
        return TRAINING_STATE_FACTOR * self.param_bytes + in_flight * self.activation_bytes


@dataclass
class LayerCosts:
    """Every unit's cost, in pipeline order: `embeddings`, then `layers`, then `heads`."""

    embeddings: UnitCost
    layers: list[UnitCost]
    heads: UnitCost
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)

    def stage_cost(self, counts: Sequence[int]) -> list[UnitCost]:
        """The cost of each stage of a split (`counts` layers each): embeddings with stage 0, heads with the last."""
        stages, start = [], 0
        for index, count in enumerate(counts):
            units = self.layers[start : start + count]
            if index == 0:
                units = [self.embeddings, *units]
            if index == len(counts) - 1:
                units = [*units, self.heads]
            stages.append(
                UnitCost(
                    f"stage {index}",
                    sum(u.forward_s for u in units),
                    sum(u.backward_s for u in units),
                    sum(u.param_bytes for u in units),
                    sum(u.activation_bytes for u in units),
                )
            )
            start += count
        return stages


def in_flight(stage: int, stages: int, micro_batches: int, schedule: str = "1F1B") -> int:
    """Micro-batches whose activations a stage holds at once: all of them with GPipe, `stages - stage` with 1F1B."""
    return micro_batches if schedule == "GPipe" else min(micro_batches, stages - stage)


def predicted_step_seconds(stage_seconds: Sequence[float], micro_batches: int) -> float:
    """GPipe's or 1F1B's step time over stages of these times: one fill and drain, then the slowest stage's pace."""
    return sum(stage_seconds) + (micro_batches - 1) * max(stage_seconds)


def balanced_split(
    layer_seconds: Sequence[float],
    stages: int,
    first_seconds: float = 0.0,
    last_seconds: float = 0.0,
    memory: Callable[[int, int, int], float] | None = None,
    memory_limit: float | None = None,
) -> list[int]:
    """The contiguous split of the layers over `stages` stages whose slowest stage is the fastest.

    Exact dynamic programming over (stage, layers placed so far), O(stages x layers^2). A stage may hold no layer (an
    empty last stage runs the heads alone). Among the splits with the same slowest stage, the most even one (a second
    pass minimizes the sum of squared stage times under that bound).

    Args:
        layer_seconds (`Sequence[float]`): each layer's time.
        stages (`int`): the number of stages.
        first_seconds (`float`, *optional*) / last_seconds (`float`, *optional*): what stage 0 (embeddings) and the
            last stage (heads) run besides their layers.
        memory (`Callable`, *optional*): `(stage, first_layer, stop_layer) -> bytes` of a stage holding those layers.
        memory_limit (`float`, *optional*): bytes one device holds; a split that needs more on a stage is not chosen.

    Returns:
        `list[int]`: layers per stage (a `layers_per_ipu`).

    Raises:
        `IncompatibleIPUConfigError`: no split fits the memory.

    Example:

    ```python
    >>> balanced_split([1, 1, 1, 1, 1, 1], 3, last_seconds=2)
    [3, 2, 1]
    ```
    """
    layers = len(layer_seconds)
    prefix = [0.0]
    for seconds in layer_seconds:
        prefix.append(prefix[-1] + seconds)
    inf = float("inf")

    def cost(stage: int, start: int, stop: int) -> float:
        if memory is not None and memory_limit is not None and memory(stage, start, stop) > memory_limit:
            return inf
        extra = (first_seconds if stage == 0 else 0.0) + (last_seconds if stage == stages - 1 else 0.0)
        return prefix[stop] - prefix[start] + extra

    bottleneck = _partition(layers, stages, cost, max)[0]
    if bottleneck == inf:
        raise IncompatibleIPUConfigError(
            f"layers_per_ipu: no split of {layers} layers over {stages} stages fits the memory of a device "
            f"({(memory_limit or 0) / 2**30:.1f} GiB); use more stages, a smaller micro-batch, or "
            "recompute_checkpoint_every_layer"
        )
    # among the splits with that slowest stage, the most even one (the least sum of squared stage times)
    within = lambda s, i, j: c**2 if (c := cost(s, i, j)) <= bottleneck * (1 + 1e-9) else inf  # noqa: E731
    return _partition(layers, stages, within, lambda a, b: a + b)[1]


def _partition(
    layers: int, stages: int, cost: Callable[[int, int, int], float], combine: Callable[[float, float], float]
) -> tuple[float, list[int]]:
    """The split of `layers` over `stages` minimizing `combine` over stage costs (`max` or `+`), and its value."""
    inf = float("inf")
    # best[s][j]: the best value of stages 0..s-1 holding layers 0..j-1; cut[s][j]: where stage s-1 starts
    best = [[inf] * (layers + 1) for _ in range(stages + 1)]
    cut = [[0] * (layers + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(layers + 1):
            for i in range(j + 1):
                value = combine(best[s - 1][i], cost(s - 1, i, j))
                if value < best[s][j]:
                    best[s][j], cut[s][j] = value, i
    counts, j = [], layers
    for s in range(stages, 0, -1):
        i = cut[s][j]
        counts.append(j - i)
        j = i
    return best[stages][layers], counts[::-1]


def split_for(
    costs: LayerCosts,
    stages: int,
    micro_batches: int,
    memory_limit: float | None = None,
    schedule: str = "1F1B",
) -> list[int]:
    """`balanced_split` over measured costs: time forward + backward, memory with the schedule's in-flight
    micro-batches."""
    units = costs.layers

    def memory(stage: int, start: int, stop: int) -> float:
        held = [*units[start:stop]]
        held += [costs.embeddings] if stage == 0 else []
        held += [costs.heads] if stage == stages - 1 else []
        return sum(u.memory(in_flight(stage, stages, micro_batches, schedule)) for u in held)

    return balanced_split(
        [u.seconds for u in units],
        stages,
        first_seconds=costs.embeddings.seconds,
        last_seconds=costs.heads.seconds,
        memory=memory,
        memory_limit=memory_limit,
    )


def device_memory_bytes(device: torch.device, stages: int) -> float:
    """What one stage may use: the accelerator's memory, or on a CPU (where every stage shares the host) the
    memory available now divided by the stages."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    import psutil  # accelerate's dependency

    return psutil.virtual_memory().available / stages


def agree(counts: list[int]) -> list[int]:
    """Under `torch.distributed`, rank 0's split on every process (timings differ from process to process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return counts
    shared = [counts]
    dist.broadcast_object_list(shared, src=0)
    return list(shared[0])


# ------------------------------------------------------------------------------------------- measuring
class _Mark(torch.autograd.Function):
    """A copy whose backward first calls `note()` (when the gradient reaches this point)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, note: Callable[[], None]) -> torch.Tensor:
        ctx.note = note
        return tensor.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.note()
        return grad, None


def _mark(value: Any, note: Callable[[], None]) -> Any:
    """`value` (a tensor, a tuple or a `ModelOutput` whose first item is the hidden states) with its hidden states
    marked; unchanged when they do not carry a gradient."""
    first = value if isinstance(value, torch.Tensor) else value[0]
    if not isinstance(first, torch.Tensor) or not first.requires_grad:
        return value
    marked = _Mark.apply(first, note)
    if isinstance(value, torch.Tensor):
        return marked
    if isinstance(value, tuple):
        return (marked, *value[1:])
    value[next(iter(value.keys()))] = marked
    return value


class _Recorder:
    """Timestamps at the layers' boundaries and the bytes autograd saves while each unit runs, for one pass."""

    def __init__(self, device: torch.device, layers: int, param_storages: set[int]) -> None:
        self.device, self.layers, self.params = device, layers, param_storages
        self.forward: dict[Any, float] = {}
        self.backward: dict[Any, float] = {}
        self.saved: list[int] = [0] * (layers + 2)  # embeddings, layers, heads
        self.unit = 0  # 0: embeddings, i + 1: layer i, layers + 1: heads
        self._seen: set[tuple[int, int]] = set()

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def pre_hook(self, index: int) -> Callable[..., Any]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> Any:
            self.forward.setdefault(("in", index), self.now())
            self.unit = index + 1
            note = lambda: self.backward.setdefault(("in", index), self.now())  # noqa: E731
            if args:
                return (_mark(args[0], note), *args[1:]), kwargs
            if "hidden_states" in kwargs:
                return args, {**kwargs, "hidden_states": _mark(kwargs["hidden_states"], note)}
            return None

        return hook

    def post_hook(self, index: int) -> Callable[..., Any]:
        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            self.forward[("out", index)] = self.now()
            self.unit = index + 2 if index == self.layers - 1 else index + 1
            return _mark(output, lambda: self.backward.setdefault(("out", index), self.now()))

        return hook

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key[0] not in self.params and key not in self._seen:
            self._seen.add(key)
            self.saved[self.unit] += storage.nbytes()
        return tensor


def _param_bytes(model: nn.Module, cut: StageCut, layers: list[nn.Module]) -> tuple[int, list[int], int]:
    """Bytes of the embeddings' parameters, of each layer's, and of the rest (heads, final norms: the last stage);
    a weight tied to the embeddings (an output projection) counts on both."""
    in_layers = [{id(p) for p in layer.parameters()} for layer in layers]
    counted = set().union(*in_layers) if in_layers else set()
    embeddings = {id(p) for path in cut.embeddings for p in model.get_submodule(path).parameters()}
    output = getattr(model, "get_output_embeddings", lambda: None)()
    tied = {id(p) for p in output.parameters()} if output is not None else set()
    params = {id(p): p.numel() * p.element_size() for p in model.parameters()}
    layer_bytes = [sum(params[i] for i in ids) for ids in in_layers]
    heads = sum(n for i, n in params.items() if (i not in counted and i not in embeddings) or i in tied)
    return sum(params[i] for i in embeddings), layer_bytes, heads


def _one_pass(
    model: nn.Module, layers: list[nn.Module], batch: Mapping[str, Any], objective: Callable[[Any], torch.Tensor]
) -> _Recorder:
    device = next(model.parameters()).device
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    recorder = _Recorder(device, len(layers), params)
    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(recorder.pre_hook(i), with_kwargs=True))
        handles.append(layer.register_forward_hook(recorder.post_hook(i)))
    try:
        model.zero_grad(set_to_none=True)
        recorder.forward["start"] = recorder.now()
        with torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t):
            loss = objective(model(**batch))
        recorder.forward["end"] = recorder.now()
        recorder.backward["start"] = recorder.now()
        loss.backward()
        recorder.backward["end"] = recorder.now()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    return recorder


def _unit_seconds(r: _Recorder) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of embeddings, each layer and heads, from one pass's timestamps."""
    f, b, n = r.forward, r.backward, r.layers
    forward = [f[("in", 0)] - f["start"]]
    forward += [f[("out", i)] - (f[("out", i - 1)] if i else f[("in", 0)]) for i in range(n)]
    forward.append(f["end"] - f[("out", n - 1)])
    # the backward runs the other way: heads first, then each layer from its output's gradient to the next one's
    # (layer 0: to its input's), then the embeddings. A layer whose output carries no gradient counts nothing.
    ends = [b.get(("out", i - 1)) if i else b.get(("in", 0)) for i in range(n)]
    backward = [b["end"] - b.get(("in", 0), b["end"])]
    for i in range(n):
        start, end = b.get(("out", i)), ends[i]
        backward.append(max(0.0, end - start) if start is not None and end is not None else 0.0)
    backward.append(b.get(("out", n - 1), b["end"]) - b["start"])
    return forward, backward


def loss_or_sum(output: Any) -> torch.Tensor:
    """The model's loss when it computed one, else the sum of its floating outputs (a backward without labels)."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    values = output.values() if hasattr(output, "values") else output
    return torch.stack([v.float().sum() for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]).sum()


def measure_layer_costs(
    model: nn.Module,
    cut: StageCut,
    batch: Mapping[str, Any],
    repeats: int = 3,
    warmup: int = 1,
    objective: Callable[[Any], torch.Tensor] = loss_or_sum,
) -> LayerCosts:
    """Time and memory of the embeddings, every layer and the heads of `model`, forward and backward, on its device.

    Args:
        model (`nn.Module`): the stock model, in training mode, on the device to measure.
        cut (`StageCut`): its layers and embeddings (`PipelinedModel.stage_cut()`).
        batch (`Mapping[str, Any]`): one micro-batch of its inputs (labels included to time the loss).
        repeats (`int`, *optional*, defaults to 3): timed passes; each unit gets its median.
        warmup (`int`, *optional*, defaults to 1): passes run first and not timed.
        objective (`Callable`, *optional*): what the backward starts from (the loss, or the outputs' sum).

    Returns:
        `LayerCosts`: every unit's cost.
    """
    layers = [model.get_submodule(p) for p in cut.layer_paths]
    if not layers:
        raise IncompatibleIPUConfigError("layers_per_ipu: 'auto' needs a model with pipeline layers; it has none")
    device = next(model.parameters()).device
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    passes = [_one_pass(model, layers, batch, objective) for _ in range(warmup + repeats)][warmup:]
    timed = [_unit_seconds(r) for r in passes]
    names = ["embeddings", *(f"layer {i}" for i in range(len(layers))), "heads"]
    emb_bytes, layer_bytes, head_bytes = _param_bytes(model, cut, layers)
    param_bytes = [emb_bytes, *layer_bytes, head_bytes]
    units = [
        UnitCost(
            name,
            statistics.median(t[0][i] for t in timed),
            statistics.median(t[1][i] for t in timed),
            param_bytes[i],
            passes[-1].saved[i],
        )
        for i, name in enumerate(names)
    ]
    return LayerCosts(units[0], units[1:-1], units[-1], device=str(device))


def _stage_pass(stages: list[StageModule], batch: dict[str, Any], now: Callable[[], float]) -> list[float]:
    """One forward and backward of `batch` through `stages` run apart, as `stages.cut.run_stages_in_turn` runs them;
    returns each stage's seconds (its forward plus its backward)."""
    seconds = [0.0] * len(stages)
    sent: tuple[torch.Tensor, ...] = (batch[stages[0].keys[0]],)
    saved = []
    for i, stage in enumerate(stages):
        stage.reset([batch])
        inputs = sent if stage.is_first else tuple(t.detach().requires_grad_(t.is_floating_point()) for t in sent)
        start = now()
        out = stage(*inputs)
        seconds[i] += now() - start
        saved.append((inputs, out if isinstance(out, tuple) else (out,)))
        sent = saved[-1][1]
    grads: tuple[torch.Tensor | None, ...] = (None,)
    for i in range(len(stages) - 1, -1, -1):
        inputs, outputs = saved[i]
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if o.requires_grad and g is not None]
        pairs = [(outputs[0].sum(), None)] if stages[i].is_last else pairs
        start = now()
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        seconds[i] += now() - start
        grads = tuple(t.grad if t.requires_grad else None for t in inputs)
    return seconds


def measure_stage_seconds(
    model: nn.Module, cut: StageCut, counts: Sequence[int], batch: Mapping[str, Any], repeats: int = 3, warmup: int = 1
) -> list[float]:
    """Each stage's measured seconds (forward + backward of one micro-batch, the median of `repeats` passes), with the
    stages of a `counts` split run apart as pipeline stages run them (`StageModule`: the stock forward cut to the
    stage), in one process: what `measure_layer_costs`' prediction is checked against.

    Args:
        model (`nn.Module`): the stock model, in training mode.
        cut (`StageCut`): its layers (`PipelinedModel.stage_cut()`).
        counts (`Sequence[int]`): layers per stage.
        batch (`Mapping[str, Any]`): one micro-batch, labels included.
        repeats (`int`, *optional*, defaults to 3) / warmup (`int`, *optional*, defaults to 1): timed / untimed passes.
    """
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    keys, ranges = list(batch), stage_ranges(counts)
    stages = [StageModule(model, cut, r, i, len(ranges), keys) for i, r in enumerate(ranges)]
    recorder = _Recorder(device, 0, set())
    passes = []
    for _ in range(warmup + repeats):
        model.zero_grad(set_to_none=True)
        passes.append(_stage_pass(stages, batch, recorder.now))
    model.zero_grad(set_to_none=True)
    return [statistics.median(p[i] for p in passes[warmup:]) for i in range(len(stages))]


def token_batch(model: nn.Module, seq_len: int = 128, rows: int = 1) -> dict[str, torch.Tensor]:
    """A micro-batch of random token ids (and decoder ids for an encoder-decoder) at most `seq_len` long."""
    config = model.config
    longest = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or seq_len
    ids = torch.randint(0, config.vocab_size, (rows, min(seq_len, longest)), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if getattr(config, "is_encoder_decoder", False):
        batch["decoder_input_ids"] = ids
    return batch


def auto_layers_per_ipu(
    model: nn.Module, cut: StageCut, fields: Sequence[str], stage_counts: Mapping[str, int], micro_batches: int
) -> dict[str, list[int]]:
    """`layers_per_ipu: "auto"` resolved: each field's balanced split, training on forward + backward time, inference
    on forward time, from one measurement of a token micro-batch (128 tokens, one row) with the outputs' sum as the
    loss; under `torch.distributed`, rank 0's split on every process.

    Args:
        model (`nn.Module`): the stock model, on its device.
        cut (`StageCut`): its layers.
        fields (`Sequence[str]`): `"layers_per_ipu"` and/or `"inference_layers_per_ipu"`.
        stage_counts (`Mapping[str, int]`): the number of stages of each field.
        micro_batches (`int`): training micro-batches a step (activations held, 1F1B).
    """
    training = model.training
    model.train()
    try:
        costs = measure_layer_costs(model, cut, token_batch(model), repeats=3, warmup=2)
    finally:
        model.train(training)
    device = torch.device(costs.device)
    resolved = {}
    for name in fields:
        stages = stage_counts[name]
        limit = device_memory_bytes(device, stages)
        if name.startswith("inference_"):
            forward = [u.forward_s for u in costs.layers]
            resolved[name] = balanced_split(forward, stages, costs.embeddings.forward_s, costs.heads.forward_s)
        else:
            resolved[name] = split_for(costs, stages, micro_batches, memory_limit=limit)
        resolved[name] = agree(resolved[name])
    return resolved
