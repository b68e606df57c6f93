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

    Args:
        model (`nn.Module`): the stock model; layers of other stages are replaced in it by pass-throughs.
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
        self._micro_batches: deque[dict[str, torch.Tensor]] = deque()
        modules = [model.get_submodule(p) for p in layer_paths]
        for i, path in enumerate(layer_paths):
            if i not in layers:
                parent, _, name = path.rpartition(".")
                model.get_submodule(parent)._modules[name] = _PassThrough()
                modules[i] = model.get_submodule(path)
        first, last = layers.start, layers.stop
        is_first, is_last = index == 0, index == num_stages - 1
        # An empty stage between two others only passes its input on.
        self.identity = not len(layers) and not is_first and not is_last
        if not is_first and not self.identity:
            if first < len(modules):
                modules[first].register_forward_pre_hook(self._inject_input, with_kwargs=True)
            else:  # an empty last stage: the heads take what the last layer would have given
                modules[-1].register_forward_hook(self._inject_output)
        if not is_last and not self.identity:
            if last > 0:
                modules[last - 1].register_forward_hook(self._exit_output)
            else:  # a stage of embeddings only
                modules[0].register_forward_pre_hook(self._exit_input, with_kwargs=True)

    def _inject_input(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (self._incoming, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": self._incoming}

    def _inject_output(self, module: nn.Module, args: tuple, output: Any) -> torch.Tensor:
        return self._incoming

    def _exit_output(self, module: nn.Module, args: tuple, output: Any) -> None:
        raise _StageExit(output)

    def _exit_input(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
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
        try:
            with autocast(tensors[0].device, self.precision):
                output = self.model(**batch)
        except _StageExit as stage_end:
            return stage_end.value
        finally:
            self._incoming = None
        # Last stage: the model's own loss; shape (1,) because the schedule concatenates micro-batch outputs.
        return output.loss.float().reshape(1)


class PipelineEngine:
    """Training host calls of a model pipelined over `torch.distributed` processes, one stage per process.

    `train_step(batch)` has the single-process `Engine`'s meaning: `device_iterations` optimizer steps of
    `gradient_accumulation_steps` micro-batches (the schedule's micro-batches). Every process calls it with
    the same host batch. The returned loss is the same on every process.

    Args:
        model (`nn.Module`): the stock model, already parallelized (recompute, serialization).
        ipu_config (`IPUConfig`): its `layers_per_ipu` and `gradient_accumulation_steps` are used.
        layer_paths (`Sequence[str]`): dotted paths of every layer, in pipeline order.
        keys (`Sequence[str]`): the batch's tensor names (including labels), in a fixed order.
        make_optimizer (`Callable`): builds the optimizer from this stage's parameters.
        schedule (`str`, *optional*, defaults to `"1F1B"`): `"1F1B"` or `"GPipe"`.
        max_grad_norm (`float`, *optional*): clip to this global norm (over every stage).
        precision (`str`, *optional*, defaults to `"fp32"`): `"fp32"` or `"bf16"`.
        device (`torch.device`, *optional*): this process's device.
    """

    def __init__(
        self, model: nn.Module, ipu_config: IPUConfig, layer_paths: Sequence[str], keys: Sequence[str],
        make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer], *, schedule: str = "1F1B",
        max_grad_norm: float | None = None, precision: str = "fp32", device: torch.device | None = None,
    ) -> None:  # fmt: skip
        if not dist.is_initialized():
            raise RuntimeError("PipelineEngine needs torch.distributed: launch with torchrun")
        if schedule not in SCHEDULES:
            raise IncompatibleIPUConfigError(f"schedule: got {schedule!r}; expected one of {', '.join(SCHEDULES)}")
        if precision not in ("fp32", "bf16"):
            raise IncompatibleIPUConfigError(f"precision {precision!r} is not supported in a pipeline yet; use bf16")
        self.rank, stages = dist.get_rank(), dist.get_world_size()
        counts = ipu_config.train().layers_per_stage(len(layer_paths))
        if len(counts) != stages:
            raise IncompatibleIPUConfigError(
                f"{stages} processes but layers_per_ipu {ipu_config.layers_per_ipu} has {len(counts)} stages; "
                f"launch torchrun --nproc_per_node {len(counts)}"
            )
        micro = ipu_config.gradient_accumulation_steps
        if micro < stages:
            raise IncompatibleIPUConfigError(
                f"gradient_accumulation_steps {micro} is below the {stages} pipeline stages: the schedule needs at "
                f"least one micro-batch per stage; set gradient_accumulation_steps >= {stages}"
            )
        start = sum(counts[: self.rank])
        self.device = device or torch.device("cpu")
        self.ipu_config, self.max_grad_norm = ipu_config, max_grad_norm
        self.stage_module = StageModule(model, layer_paths, range(start, start + counts[self.rank]), self.rank,
                                        stages, keys, precision).to(self.device)  # fmt: skip
        self.keys = list(keys)
        self.is_last = self.rank == stages - 1
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.params)
        stage = PipelineStage(self.stage_module, self.rank, stages, self.device)
        self._steps_run = 0
        self.schedule = SCHEDULES[schedule](stage, micro, loss_fn=lambda output, target: output.sum())

    def _global_grad_norm(self) -> torch.Tensor:
        local = [p.grad.detach().float().pow(2).sum() for p in self.params if p.grad is not None]
        squares = torch.stack(local).sum() if local else torch.zeros((), device=self.device)
        dist.all_reduce(squares)
        return squares.sqrt()

    def train_step(self, host_batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """One host call; returns the mean loss of its last optimizer step (on every process)."""
        micro = self.ipu_config.gradient_accumulation_steps
        batch = {k: host_batch[k].to(self.device) for k in self.keys}
        loss = torch.zeros((), device=self.device)
        for step in split_batch(batch, self.ipu_config.device_iterations):
            micro_batches = split_batch(step, micro)
            self.stage_module.reset(micro_batches, first_step=not self._steps_run)
            self._steps_run += 1
            losses: list[torch.Tensor] = []
            if self.rank == 0:
                self.schedule.step(step[self.keys[0]])  # its rows set the micro-batch split; values come by reset()
            elif self.is_last:
                self.schedule.step(target=torch.zeros(micro, device=self.device), losses=losses)
            else:
                self.schedule.step()
            norm = self._global_grad_norm()
            if self.max_grad_norm and math.isfinite(float(norm)):
                torch.nn.utils.clip_grads_with_norm_(self.params, self.max_grad_norm, norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            loss = torch.stack(losses).mean() if losses else torch.zeros((), device=self.device)
        dist.broadcast(loss, src=dist.get_world_size() - 1)
        return loss
