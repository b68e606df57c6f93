"""Pipeline stages on separate processes, with `torch.distributed.pipelining` (GPipe or 1F1B).

Each process holds the unmodified `transformers` model and runs its stock `forward`, cut to its own stage:
layers of other stages are replaced (on this process only) by pass-throughs, the activation received from the
previous stage is injected where the stage's first layer takes its input, and the stage stops (an exception
caught here) where its last layer ends. The embeddings and mask preparation of the stock forward therefore
run on every process (cheap) and nothing of a model's forward is copied. Only the activation travels between
stages: every process gets the host batch and takes each micro-batch's own tensors (ids, masks, labels) in
order, so the last stage calls the stock forward with its labels and returns the model's own loss.

Supported: families whose layers take the hidden states first and return them as a tensor (BERT, RoBERTa,
DistilBERT, GPT-2, ViT). T5's blocks return tuples and its decoder needs the encoder's output: not yet.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from ..config import IPUConfig
from ..errors import IncompatibleIPUConfigError
from .engine import split_batch
from .precision import autocast

SCHEDULES = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe}


class _StageExit(Exception):
    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class _PassThrough(nn.Module):
    """Stands in for a layer of another stage: returns the hidden states it is given."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


class StageModule(nn.Module):
    """One pipeline stage of a `transformers` model (see the module docstring).

    The whole model stays in place between steps (so it can be saved, evaluated and synchronised as the stock
    model); only while this stage runs are the layers of other stages swapped for pass-throughs.

    Args:
        model (`nn.Module`): the stock model.
        layer_paths (`Sequence[str]`): dotted paths of every layer, in pipeline order.
        layers (`range`): the layers of this stage.
        index (`int`) / num_stages (`int`): this stage's position and the number of stages.
        keys (`Sequence[str]`): names of the batch tensors, in the order stage 0 receives them.
        precision (`str`): `"fp32"` or `"bf16"` (autocast inside the stage).
    """

    def __init__(
        self, model: nn.Module, layer_paths: Sequence[str], layers: range, index: int, num_stages: int,
        keys: Sequence[str], precision: str = "fp32",
    ) -> None:  # fmt: skip
        super().__init__()
        self.model, self.index, self.num_stages, self.keys = model, index, num_stages, list(keys)
        self.precision = precision
        self._incoming: torch.Tensor | None = None
        self._running = False  # inside this stage's forward (the exit hooks fire only then)
        self._micro_batches: deque[dict[str, torch.Tensor]] = deque()
        modules = [model.get_submodule(p) for p in layer_paths]
        # (layer index, parent module, attribute name, the layer) of each layer of another stage: swapped out
        # for a pass-through during this stage's forward
        self._foreign = [
            (i, model.get_submodule(path.rpartition(".")[0]), path.rpartition(".")[2], modules[i])
            for i, path in enumerate(layer_paths)
            if i not in layers
        ]
        self._pass_through = _PassThrough()
        # Layers of other stages that carry a hook of this stage get their own pass-through (by layer index).
        self._hooked_pass_through: dict[int, nn.Module] = {}
        first, last = layers.start, layers.stop
        is_first, is_last = index == 0, index == num_stages - 1
        # An empty stage between two others only passes its input on.
        self.identity = not len(layers) and not is_first and not is_last
        if not is_first and not self.identity:
            if first < len(modules):
                modules[first].register_forward_pre_hook(self._inject_input, with_kwargs=True)
            else:  # an empty last stage: the heads take what the last layer would have given
                self._hooked_pass_through[len(modules) - 1] = _PassThrough()
                self._hooked_pass_through[len(modules) - 1].register_forward_hook(self._inject_output)
        if not is_last and not self.identity:
            if last > 0:
                modules[last - 1].register_forward_hook(self._exit_output)
            else:  # a stage of embeddings only: it ends where layer 0 (of another stage) would start
                self._hooked_pass_through[0] = _PassThrough()
                self._hooked_pass_through[0].register_forward_pre_hook(self._exit_input, with_kwargs=True)

    def _inject_input(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if self._incoming is None:
            return None  # not running as a stage (evaluation or a plain call of the model)
        if args:
            return (self._incoming, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": self._incoming}

    def _inject_output(self, module: nn.Module, args: tuple, output: Any) -> torch.Tensor:
        return self._incoming

    def _exit_output(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self._running:
            raise _StageExit(output)

    def _exit_input(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._running:
            raise _StageExit(args[0] if args else kwargs["hidden_states"])

    def reset(self, micro_batches: list[dict[str, torch.Tensor]], first_step: bool = False) -> None:
        """The micro-batches of the next schedule step, in order (the schedules run forwards in order).

        On the first step, the stage's metadata inference runs one extra forward (on empty tensors of the
        received shapes) before the real ones: stages after the first get micro-batch 0 once more for it.
        """
        extra = micro_batches[:1] if first_step and self.index > 0 else []
        self._micro_batches = deque(extra + micro_batches)

    def _next_micro_batch(self, received: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.index == 0:
            # Stage 0 gets its micro-batch's first tensor from the schedule (a view of the host batch): find
            # the micro-batch it belongs to, which also serves the schedule's shape-inference call.
            for batch in self._micro_batches:
                if batch[self.keys[0]].data_ptr() == received.data_ptr():
                    return batch
            raise RuntimeError("stage 0 received a micro-batch it was not fed")
        return self._micro_batches.popleft()

    def forward(self, *tensors: torch.Tensor) -> Any:
        batch = self._next_micro_batch(tensors[0])
        if self.identity:
            return tensors[0]
        self._incoming = None if self.index == 0 else tensors[0]
        self._running = True
        for i, parent, name, _ in self._foreign:
            parent._modules[name] = self._hooked_pass_through.get(i, self._pass_through)
        try:
            with autocast(tensors[0].device, self.precision):
                output = self.model(**batch)
        except _StageExit as stage_end:
            return stage_end.value
        finally:
            for _, parent, name, layer in self._foreign:
                parent._modules[name] = layer
            self._incoming, self._running = None, False
        # Last stage: the model's own loss; shape (1,) because the schedule concatenates micro-batch outputs.
        return output.loss.float().reshape(1)


class PipelineEngine:
    """Training steps of a model pipelined over `torch.distributed` processes: one stage per process, and as
    many pipelines as data-parallel replicas (a 2-D mesh, replica x stage; rank = replica x stages + stage).

    Every process of a pipeline is fed the same micro-batches (the replica's); only activations travel between
    stages. `forward_backward(micro_batches)` runs one optimizer step's schedule and leaves this stage's
    gradients averaged over the replicas; `clip_grad_norm_` clips with the norm over the whole model;
    `train_step(batch)` is the whole host call with its own optimizer, with the single-process `Engine`'s meaning.

    Every process keeps the whole model: its own stage's parameters are the ones it updates. `synchronize()`
    copies each parameter (and its optimizer state) from the stage that owns it to all processes, so a save
    or an evaluation sees the stock model with every stage's current weights.

    Args:
        model (`nn.Module`): the stock model, already parallelized (recompute, serialization).
        ipu_config (`IPUConfig`): its `layers_per_ipu`, `replication_factor` and `gradient_accumulation_steps`.
        layer_paths (`Sequence[str]`): dotted paths of every layer, in pipeline order.
        keys (`Sequence[str]`): the batch's tensor names (including labels), in a fixed order.
        make_optimizer (`Callable`, *optional*): builds the optimizer from the parameters (for `train_step`).
        schedule (`str`, *optional*, defaults to `"1F1B"`): `"1F1B"` or `"GPipe"`.
        max_grad_norm (`float`, *optional*): clip to this global norm (over every stage).
        precision (`str`, *optional*, defaults to `"fp32"`): `"fp32"` or `"bf16"`.
        device (`torch.device`, *optional*): this process's device.
    """

    def __init__(
        self, model: nn.Module, ipu_config: IPUConfig, layer_paths: Sequence[str], keys: Sequence[str],
        make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None, *,
        schedule: str = "1F1B", max_grad_norm: float | None = None, precision: str = "fp32",
        device: torch.device | None = None,
    ) -> None:  # fmt: skip
        if not dist.is_initialized():
            raise RuntimeError("PipelineEngine needs torch.distributed: launch with torchrun")
        if schedule not in SCHEDULES:
            raise IncompatibleIPUConfigError(
                f"pipeline_schedule: got {schedule!r}; expected one of {', '.join(SCHEDULES)}"
            )
        if precision not in ("fp32", "bf16"):
            raise IncompatibleIPUConfigError(
                f"precision {precision!r} is not supported with pipeline stages on separate processes; use --bf16 "
                "(or fp32)"
            )
        counts = ipu_config.train().layers_per_stage(len(layer_paths))
        stages, replicas, world = len(counts), ipu_config.value("replication_factor"), dist.get_world_size()
        if stages * replicas != world:
            raise IncompatibleIPUConfigError(
                f"{world} processes but layers_per_ipu {ipu_config.layers_per_ipu} has {stages} stages x "
                f"replication_factor {replicas}; launch torchrun --nproc_per_node {stages * replicas}"
            )
        micro = ipu_config.gradient_accumulation_steps
        if micro < stages:
            raise IncompatibleIPUConfigError(
                f"gradient_accumulation_steps {micro} is below the {stages} pipeline stages: the schedule needs at "
                f"least one micro-batch per stage; set gradient_accumulation_steps >= {stages}"
            )
        self.device = device or torch.device("cpu")
        mesh = init_device_mesh(self.device.type, (replicas, stages), mesh_dim_names=("replica", "stage"))
        self.stage_group, self.replica_group = mesh.get_group("stage"), mesh.get_group("replica")
        self.stage, self.replicas, self.num_stages = mesh.get_local_rank("stage"), replicas, stages
        start = sum(counts[: self.stage])
        self.ipu_config, self.max_grad_norm = ipu_config, max_grad_norm
        self.stage_module = StageModule(model, layer_paths, range(start, start + counts[self.stage]), self.stage,
                                        stages, keys, precision).to(self.device)  # fmt: skip
        self.model, self.keys = model, list(keys)
        self.is_last = self.stage == stages - 1
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.params) if make_optimizer else None
        self._tied = _tied_embedding(model)
        self._owner: list[int] | None = None  # stage that updates each parameter, known after the first step
        stage = PipelineStage(self.stage_module, self.stage, stages, self.device, group=self.stage_group)
        self._steps_run = 0
        self.schedule = SCHEDULES[schedule](stage, micro, loss_fn=lambda output, target: output.sum())

    def _stage_rank(self, stage: int) -> int:
        return dist.get_global_rank(self.stage_group, stage)

    def forward_backward(self, micro_batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """One optimizer step's schedule over `micro_batches`; returns their mean loss (on every process).

        Leaves this stage's gradients summed with the tied embedding's other use and averaged over replicas.
        """
        micro_batches = [{k: b[k].to(self.device) for k in self.keys} for b in micro_batches]
        # Stage 0 is handed views of one tensor by the schedule and finds its micro-batch by their storage.
        first = torch.cat([b[self.keys[0]] for b in micro_batches])
        for batch, view in zip(micro_batches, first.chunk(len(micro_batches)), strict=True):
            batch[self.keys[0]] = view
        self.stage_module.reset(micro_batches, first_step=not self._steps_run)
        self._steps_run += 1
        losses: list[torch.Tensor] = []
        if self.stage == 0:
            # its rows set the micro-batch split; the values come from reset()
            self.schedule.step(first)
        elif self.is_last:
            self.schedule.step(target=torch.zeros(len(micro_batches), device=self.device), losses=losses)
        else:
            self.schedule.step()
        if self._tied is not None and self.num_stages > 1:
            # The input embedding is also the output projection: its two gradients live on two stages.
            grad = self._tied.grad if self._tied.grad is not None else torch.zeros_like(self._tied)
            dist.all_reduce(grad, group=self.stage_group)
            self._tied.grad = grad
        if self._owner is None:
            self._owner = self._find_owners()
        if self.replicas > 1:  # one flat all-reduce over the replicas of this stage
            grads = [p.grad for p in self.params if p.grad is not None]
            flat = _flatten_dense_tensors(grads).div_(self.replicas)
            dist.all_reduce(flat, group=self.replica_group)
            for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                grad.copy_(synced)
        loss = torch.stack(losses).mean() if losses else torch.zeros((), device=self.device)
        dist.broadcast(loss, src=self._stage_rank(self.num_stages - 1), group=self.stage_group)
        return loss

    def clip_grad_norm_(self, max_norm: float | None) -> torch.Tensor:
        """Clip this stage's gradients with the norm over the whole model's; returns that norm."""
        counted = [
            p.grad.detach().float().pow(2).sum()
            for p in self.params
            if p.grad is not None and (p is not self._tied or self.stage == 0)  # a tied weight counts once
        ]
        squares = torch.stack(counted).sum() if counted else torch.zeros((), device=self.device)
        dist.all_reduce(squares, group=self.stage_group)
        norm = squares.sqrt()
        if max_norm and math.isfinite(float(norm)):
            torch.nn.utils.clip_grads_with_norm_([p for p in self.params if p.grad is not None], max_norm, norm)
        return norm

    def _find_owners(self) -> list[int]:
        """The stage that updates each parameter: the first one where it has a gradient (0 if none has)."""
        has_grad = torch.tensor([p.grad is not None for p in self.params], dtype=torch.int32)
        gathered = [torch.zeros_like(has_grad) for _ in range(self.num_stages)]
        dist.all_gather(gathered, has_grad, group=self.stage_group)
        table = torch.stack(gathered)  # (stage, parameter)
        return [int(column.nonzero()[0]) if column.any() else 0 for column in table.T]

    def synchronize(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Give every process of the pipeline the current weights of every stage, and the optimizer state of
        every parameter if `optimizer` is given (a checkpoint then holds the single-process state)."""
        if self._owner is None or self.num_stages == 1:
            return
        with torch.no_grad():
            for param, owner in zip(self.params, self._owner, strict=True):
                dist.broadcast(param.data, src=self._stage_rank(owner), group=self.stage_group)
        if optimizer is None:
            return
        own = {i: optimizer.state[p] for i, p in enumerate(self.params) if self._owner[i] == self.stage}
        own = {i: {k: v.cpu() if torch.is_tensor(v) else v for k, v in state.items()} for i, state in own.items()}
        gathered: list[Any] = [None] * self.num_stages
        dist.all_gather_object(gathered, own, group=self.stage_group)
        for stage, states in enumerate(gathered):
            if stage == self.stage:
                continue
            for i, state in states.items():
                param = self.params[i]
                optimizer.state[param] = {
                    k: v.to(param.device) if torch.is_tensor(v) and v.dim() else v for k, v in state.items()
                }

    def train_step(self, host_batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """One host call (this replica's batch); returns the mean loss of its last optimizer step."""
        if self.optimizer is None:
            raise RuntimeError("train_step needs make_optimizer")
        micro = self.ipu_config.gradient_accumulation_steps
        batch = {k: host_batch[k].to(self.device) for k in self.keys}
        loss = torch.zeros((), device=self.device)
        for step in split_batch(batch, self.ipu_config.device_iterations):
            loss = self.forward_backward(split_batch(step, micro))
            self.clip_grad_norm_(self.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return loss


def _tied_embedding(model: nn.Module) -> nn.Parameter | None:
    """The input embedding's weight when the output projection shares it (GPT-2, masked LMs), else None."""
    get_input, get_output = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if get_input is None or get_output is None:
        return None
    embedding, projection = get_input(), get_output()
    if embedding is None or projection is None:
        return None
    return embedding.weight if projection.weight is embedding.weight else None
