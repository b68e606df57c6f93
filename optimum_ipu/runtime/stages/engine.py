"""Pipeline stages on separate processes, with `torch.distributed.pipelining` (GPipe, 1F1B, or with several stages
per process the interleaved schedules: Interleaved1F1B and ZeroBubble, torch's `ScheduleInterleavedZeroBubble`).

Each process holds the unmodified `transformers` model and runs its stock `forward`, cut to its own stage by a
`StageModule` (`stages/cut.py`: other stages' layers stood in, the received activations injected, the stage
ended at its last layer). Only activations travel between stages (the hidden states, and an encoder-decoder's
encoder output with every decoder stage): every process gets the host batch and takes each micro-batch's own
tensors (ids, masks, labels) in order, so the last stage calls the stock forward with its labels and returns
the model's own loss. A parameter that gets gradients on several stages (a tied embedding, a position table
every stage computes) has them summed over the stages.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)
from torch.distributed.tensor import DTensor

from ...config import IPUConfig
from ...errors import IncompatibleIPUConfigError
from ...topology import MULTI_STAGE_SCHEDULES, check_micro_batches, check_processes, check_schedule, stages_per_process
from ..distributed import batches_of
from ..fsdp import shard_stages, stage_mesh
from ..precision import LossScaler, autocast
from ..step import ComputeLoss, StepResult
from ..tensor_parallel import gradient_norm
from .cut import StageCut, StageModule, stage_ranges
from .hold import StageHold, stage_hold

SCHEDULES = {
    "1F1B": Schedule1F1B,
    "GPipe": ScheduleGPipe,
    "Interleaved1F1B": ScheduleInterleaved1F1B,
    "ZeroBubble": ScheduleInterleavedZeroBubble,  # interleaved, each backward split into input and weight parts
}


class PipelineEngine:
    """Training steps of a model pipelined over `torch.distributed` processes: one stage per process, and as
    many pipelines as data-parallel replicas (a 2-D mesh, replica x stage; rank = replica x stages + stage).

    It speaks the step protocol of `optimum_ipu.runtime.step`, as the single-process `Engine` does: `micro_batch`
    queues an optimizer step's micro-batches (every process of a pipeline is fed the same ones, the replica's), and
    `finish_step` runs the schedule over them (only activations travel between stages), sums the gradients of
    parameters that several stages use, averages them over the replicas, clips them with the norm over the whole
    model, and drops them if that norm is not finite (the step is skipped, as `Engine` skips it).

    Given a whole model, every process keeps it: its own stage's parameters are the ones it updates.
    `synchronize()` copies each parameter (and its optimizer state) from the stage that owns it to all processes,
    so a save or an evaluation sees the stock model with every stage's current weights.

    Given a model that holds its stage only (`models.stage_loading.load_stage`: built on the meta device, only the
    stage's tensors read), nothing else is ever materialized, and a save gathers what each stage holds
    (`fsdp.full_state_dict`). With `fsdp=True` (or a model sharded by `fsdp.shard_pipeline`), the mesh's two dims
    compose in a fixed order: the pipeline split first (`stages.hold.hold_stage`: each process keeps only what its
    stage runs), then FSDP2 over the stage's replicas (`fully_shard`, each layer a unit): parameters, gradients and
    optimizer state are sharded, and FSDP's reduce-scatter averages the gradients over the replicas.

    Args:
        model (`nn.Module`): the stock model, already parallelized (recompute, serialization).
        ipu_config (`IPUConfig`): its `layers_per_ipu`, `replication_factor` and `gradient_accumulation_steps`.
        cut (`StageCut`): the layers and encoder-decoder split (`PipelinedModel.stage_cut()`).
        keys (`Sequence[str]`, *optional*): the batch's tensor names (including labels), in a fixed order; by
            default those of the first micro-batch.
        counts (`Sequence[int]`): layers of each stage, wildcards resolved
            (`optimum_ipu.models.layout.layers_per_stage(ipu_config, len(cut.layer_paths), inference=False)`).
        schedule (`str`, *optional*, defaults to `"1F1B"`): `"1F1B"` or `"GPipe"` (one stage per process), or
            `"Interleaved1F1B"` or `"ZeroBubble"`, which also run several stages per process: with `layers_per_ipu`
            longer than the processes of a replica, process `r` runs stages `r, r + processes, ...` (looped).
        max_grad_norm (`float`, *optional*): clip to this global norm (over every stage).
        precision (`str`, *optional*, defaults to `"fp32"`): `"fp32"` or `"bf16"`.
        device (`torch.device`, *optional*): this process's device.
        fsdp (`bool`, *optional*, defaults to `False`): keep only this stage's layers and shard them over the
            stage's replicas (`fsdp.shard_stages`; a model sharded so already is taken as it is).
        required_inputs (`Sequence[str]`, *optional*): tensors every batch must carry (`StagePlan.process_stage_inputs`:
            what the model would otherwise draw at random inside its forward, on each stage apart).
        share_batches (`bool`, *optional*, defaults to `True`): send the last stage's micro-batches to the replica's
            other stages before each step (`distributed.batches_of`: a random collator draws other values on each
            process); `False` where the caller has shared them already (`IPUTrainer`, before it counts their items).
        mesh (`DeviceMesh`, *optional*): the `("dp", "pp")` mesh of the job (the layout's); a model that holds its stage
            keeps the mesh it was split by; a new one by default.
    """

    def __init__(
        self,
        model: nn.Module,
        ipu_config: IPUConfig,
        cut: StageCut,
        keys: Sequence[str] | None = None,
        *,
        counts: Sequence[int],
        schedule: str = "1F1B",
        max_grad_norm: float | None = None,
        precision: str = "fp32",
        device: torch.device | None = None,
        fsdp: bool = False,
        required_inputs: Sequence[str] = (),
        share_batches: bool = True,
        mesh: Any = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("PipelineEngine needs torch.distributed: launch with torchrun")
        check_schedule(schedule, "pipeline_schedule")
        if precision not in ("fp32", "bf16"):
            raise IncompatibleIPUConfigError(
                f"precision {precision!r} is not supported with pipeline stages on separate processes; use --bf16 "
                "(or fp32)"
            )
        counts = list(counts)
        stages, replicas = len(counts), ipu_config.value("replication_factor")
        # Interleaved schedules: several stages per process, looped (process r holds stages r, r + ranks, ...)
        per_rank = stages_per_process(ipu_config, dist.get_world_size(), schedule, "pipeline_schedule")
        # processes x per_rank = stages x replicas; the schedule's micro-batches are checked by the first step (a job
        # that only evaluates through the stages needs none)
        check_processes(ipu_config, dist.get_world_size(), per_rank, micro_batches=False)
        if per_rank > 1 and (fsdp or stage_hold(model) is not None):
            raise IncompatibleIPUConfigError(
                f"pipeline_schedule {schedule} with {per_rank} stages per process keeps the whole model on each "
                "process: not with --fsdp or a model loaded stage by stage; use one stage per process"
            )
        ranks = stages // per_rank
        micro = ipu_config.gradient_accumulation_steps
        self.device = device or torch.device("cpu")
        # Split first, then shard (torchtitan's order): the trainer shards before its optimizer exists.
        # A model loaded stage-local (stage_loading.load_stage) or sharded by the trainer holds its stage only.
        self.shards: StageHold | None = stage_hold(model)
        if fsdp and not (self.shards is not None and self.shards.sharded):
            mesh = mesh or (self.shards.mesh if self.shards is not None else stage_mesh(replicas, ranks, self.device))
            self.shards = shard_stages(model, cut, counts, mesh)
        self.sharded = self.shards is not None and self.shards.sharded
        if self.shards is not None:
            mesh = self.shards.mesh  # what the stage was split (and sharded) by
        elif mesh is None:
            mesh = stage_mesh(replicas, ranks, self.device)
        self.stage_group, self.replica_group = mesh.get_group("pp"), mesh.get_group("dp")
        # tensor parallelism inside each stage (`tensor_parallel_size`): the processes that share its layers
        self.split_group = mesh.get_group("tp") if "tp" in (mesh.mesh_dim_names or ()) else None
        # `stage`: this process's rank in its pipeline (its first stage); `local_stages`: every stage it runs
        self.stage, self.replicas, self.num_stages, self.ranks = mesh.get_local_rank("pp"), replicas, stages, ranks
        self.local_stages = list(range(self.stage, stages, ranks))
        self.ipu_config, self.max_grad_norm = ipu_config, max_grad_norm
        self._root = self.shards.gate if self.shards is not None else None
        self._cut, self._ranges = cut, stage_ranges(counts)
        self._required, self._share_batches = tuple(required_inputs), share_batches
        self._micro, self._schedule_name, self.precision = micro, schedule, precision
        if self.shards is None:  # held or sharded: on its device already, other stages' parameters on the meta device
            model.to(self.device)
        self.model = model
        self.is_last = stages - 1 in self.local_stages
        # The same names, in the same order, on every stage (other stages' parameters included): owners are found by
        # gathering one flag per name. Resolved at each use: sharding and freeing replace parameter objects.
        self._names = [n for n, _ in model.named_parameters()]
        self._owner: list[int] | None = None  # stage that updates each parameter, known after the first step
        self._shared: list[int] = []  # parameters with gradients on several stages (tied embeddings, tables)
        self._queued: list[tuple[dict[str, torch.Tensor], torch.Tensor]] = []  # this step's (micro-batch, weight)
        self.keys: list[str] | None = None
        self.schedule: Any = None
        self.steps_run = 0
        self.optimizer_steps = 0
        # sharded: False reduce-scatters after every micro-batch (no unsharded gradients held between them)
        self.reduce_once_per_step = True
        self.last_step_skipped = False
        self.last_grad_norm = math.nan  # of the last optimizer step, before clipping
        # the surface `Engine` has, for what drives either: fp16 is refused above, so the loss is never scaled
        self.loss_scaler = LossScaler(1.0, dynamic=False, enabled=False)
        if keys is not None:
            self._build_schedule(list(keys))

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of this engine's precision (nothing for fp32), as `Engine.autocast`."""
        return autocast(self.device, self.precision)

    def _build_schedule(self, keys: list[str]) -> None:
        """The stage module and its schedule, for batches of these tensors (stage 0 receives them in this order)."""
        check_micro_batches(self._micro, self.ranks)  # the schedule needs one micro-batch per stage at least
        missing = [name for name in self._required if name not in keys]
        if missing:
            # drawn inside the forward instead, each stage would draw its own (the loss on the last stage would not
            # be the one of the frames stage 0 masked)
            raise ValueError(
                f"{type(self.model).__name__} with pipeline stages on separate processes needs "
                f"{' and '.join(self._required)} in every batch (missing: {', '.join(missing)}): draw them "
                "once in the data collator, as transformers' and examples/speech-pretraining/run_pretraining.py's "
                "collators do, so that every stage is fed the same"
            )
        self.keys, root = keys, self._root
        self.stage_modules = [
            StageModule(self.model, self._cut, self._ranges[i], i, self.num_stages, keys, self.precision, root=root)
            for i in self.local_stages
        ]
        self.stage_module = self.stage_modules[0]
        stages = [
            PipelineStage(module, i, self.num_stages, self.device, group=self.stage_group)
            for i, module in zip(self.local_stages, self.stage_modules, strict=True)
        ]
        # Each micro-batch's target is its weight: the step's loss is the weighted sum of the micro-batches' mean
        # losses, as in one process (so gradients are not scaled again by the micro-batch count).
        multi = self._schedule_name in MULTI_STAGE_SCHEDULES
        self.schedule = SCHEDULES[self._schedule_name](
            stages if multi else stages[0], self._micro, loss_fn=_weighted_loss, scale_grads=False
        )

    @property
    def params(self) -> list[nn.Parameter]:
        """Every parameter of the model that a stage trains, in the same order on every stage."""
        return [self.model.get_parameter(name) for name in self._names]

    def _stage_rank(self, stage: int) -> int:
        return dist.get_global_rank(self.stage_group, stage)

    def same_batches(self, batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The replica's last stage's `batches` on every stage of the replica (`distributed.batches_of`); with
        tensor parallelism, those of the first process of that stage's split."""
        if self.split_group is not None:
            batches = batches_of(dist.get_global_rank(self.split_group, 0), self.split_group, batches, self.device)
        return batches_of(self._stage_rank(self.ranks - 1), self.stage_group, batches, self.device)

    # ------------------------------------------------------------- step protocol
    def micro_batch(
        self, inputs: Mapping[str, Any], weight: float | torch.Tensor, compute_loss: ComputeLoss | None = None
    ) -> torch.Tensor:
        """Queue one micro-batch of the current optimizer step (its tensors; the schedule runs in `finish_step`).

        Args:
            inputs (`Mapping[str, Any]`): the micro-batch, the same on every stage of the replica.
            weight (`float` or `torch.Tensor`): its share of the step's loss, as for `Engine.micro_batch`.
            compute_loss (`Callable`, *optional*): not supported: the last stage trains on the model's own loss
                (`IPUTrainer` refuses a `compute_loss_func` with stages on separate processes).

        Returns:
            `torch.Tensor`: 0: the step's loss is known once the schedule has run (`StepResult.loss`).
        """
        tensors = {k: v.to(self.device) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        weight = torch.as_tensor(weight, dtype=torch.float32, device=self.device).reshape(1)
        self._queued.append((tensors, weight))
        return torch.zeros((), device=self.device)

    def finish_step(self, step: int | None = None) -> StepResult:
        """Run the schedule over the queued micro-batches, then make the gradients ready for `optimizer.step()`:
        summed over the stages that share a parameter, averaged over the replicas, clipped to `max_grad_norm` with
        the norm over the whole model, and dropped if that norm is not finite (the step is skipped).

        Args:
            step (`int`, *optional*): the number of the optimizer step being finished, as logs count it.

        Returns:
            `StepResult`: the step's loss (the weighted sum of its micro-batches' losses, on every process) and the
            gradient norm before clipping.
        """
        queued, self._queued = self._queued, []
        if len(queued) != self._micro:
            raise ValueError(
                f"an optimizer step of pipeline stages on separate processes takes gradient_accumulation_steps="
                f"{self._micro} micro-batches (the schedule's); got {len(queued)}"
            )
        self.optimizer_steps = self.optimizer_steps + 1 if step is None else step
        loss = self._run_schedule([batch for batch, _ in queued], torch.cat([weight for _, weight in queued]))
        self._reduce_gradients()
        self.last_grad_norm = float(self._clip_grad_norm(self.max_grad_norm))
        self.last_step_skipped = not math.isfinite(self.last_grad_norm)
        if self.last_step_skipped:  # as Engine: dropped gradients leave the parameters and their state untouched
            for param in self.params:
                param.grad = None
        return StepResult(loss, self.last_grad_norm)

    def _run_schedule(self, micro_batches: list[dict[str, torch.Tensor]], weights: torch.Tensor) -> torch.Tensor:
        """One optimizer step's schedule over `micro_batches`; returns the step's loss (on every process)."""
        if self._share_batches:  # every stage on the last stage's micro-batches (a collator's draws differ per process)
            micro_batches = self.same_batches(micro_batches)
        if self.schedule is None:
            self._build_schedule(list(micro_batches[0]))
        micro_batches = [{k: b[k] for k in self.keys} for b in micro_batches]
        # Stage 0 is handed views of one tensor by the schedule and finds its micro-batch by their storage.
        first = torch.cat([b[self.keys[0]] for b in micro_batches])
        for batch, view in zip(micro_batches, first.chunk(len(micro_batches)), strict=True):
            batch[self.keys[0]] = view
        for module in self.stage_modules:
            module.reset(micro_batches, first_step=not self.steps_run)
        self.steps_run += 1
        losses: list[torch.Tensor] = []
        with self._gradient_sync_once():
            if self.stage == 0:
                # its rows set the micro-batch split; the values come from reset()
                self.schedule.step(first)
            elif self.is_last:
                self.schedule.step(target=weights, losses=losses)
            else:
                self.schedule.step()
        if self._owner is None:
            self._owner, self._shared = self._find_owners()
        loss = torch.stack(losses).sum().detach() if losses else torch.zeros((), device=self.device)
        dist.broadcast(loss, src=self._stage_rank(self.ranks - 1), group=self.stage_group)
        return loss

    @contextlib.contextmanager
    def _gradient_sync_once(self) -> Iterator[None]:
        """Sharded (FSDP), the stage's gradients are reduce-scattered over its replicas once per optimizer step, in the
        backward of its last micro-batch, not after every micro-batch: the earlier ones accumulate unsharded."""
        root = self._root if self.sharded and self._micro > 1 and self.reduce_once_per_step else None
        if root is None:
            yield
            return
        root.set_requires_gradient_sync(False)
        self.stage_module.on_last_backward = lambda: root.set_requires_gradient_sync(True)
        try:
            yield
        finally:
            self.stage_module.on_last_backward = None
            root.set_requires_gradient_sync(True)

    def _reduce_gradients(self) -> None:
        """Sum the gradients of parameters used on several stages; average over the replicas."""
        params = self.params
        with torch.no_grad():
            for i in self._shared:
                # e.g. the input embedding is also the output projection: its two gradients live on two stages
                # (sharded alike on each stage: the shards add up)
                param = params[i]
                grad = param.grad if param.grad is not None else torch.zeros_like(param)
                dist.all_reduce(_local(grad), group=self.stage_group)
                param.grad = grad
        if self.replicas > 1 and not self.sharded:
            self._average_over_replicas(params)

    def _average_over_replicas(self, params: list[nn.Parameter]) -> None:
        # Ours, not DDP's: each process keeps the whole model here, so DDP would bucket every stage's parameters (a
        # second copy of the whole model's gradients) and search the graph for the unused ones each step, to do what
        # this does: one flat all-reduce of this stage's gradients per step. Sharded, FSDP's reduce-scatter does it.
        grads = [_local(p.grad) for p in params if p.grad is not None]
        flat = _flatten_dense_tensors(grads).div_(self.replicas)
        dist.all_reduce(flat, group=self.replica_group)
        for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(synced)

    def _clip_grad_norm(self, max_norm: float | None) -> torch.Tensor:
        """Clip this stage's gradients with the norm over the whole model's; returns that norm."""
        shared, params = set(self._shared), self.params
        # a parameter shared by stages counts once, on the stage that owns it
        counted = [i not in shared or self._owner[i] == self.stage for i in range(len(params))]
        grads = [p.grad for p, counts in zip(params, counted, strict=True) if counts and p.grad is not None]
        squares = torch.zeros((), device=self.device)
        if self.split_group is not None:  # the split matrices' norm made whole over the stage's shares (a collective)
            squares += gradient_norm([g for g in grads if isinstance(g, DTensor)]).to(self.device).pow(2)
            grads = [g for g in grads if not isinstance(g, DTensor)]  # whole on each share: counted once
        for grad in grads:
            squares += _local(grad).detach().float().pow(2).sum()
        # sharded, each process holds a shard of its stage's gradients: the norm is over every process
        dist.all_reduce(squares, group=None if self.sharded else self.stage_group)
        norm = squares.sqrt()
        if max_norm and math.isfinite(float(norm)):
            coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)  # as torch.nn.utils.clip_grads_with_norm_
            with torch.no_grad():
                for grad in (p.grad for p in params if p.grad is not None):
                    _local(grad).mul_(coefficient)
        return norm

    def _find_owners(self) -> tuple[list[int], list[int]]:
        """The stage that updates each parameter (the first one where it has a gradient, 0 if none has), and the
        parameters with gradients on several stages."""
        has_grad = torch.tensor([p.grad is not None for p in self.params], dtype=torch.int32, device=self.device)
        gathered = [torch.zeros_like(has_grad) for _ in range(self.ranks)]
        dist.all_gather(gathered, has_grad, group=self.stage_group)
        table = torch.stack(gathered).cpu()  # (stage, parameter)
        owners = [int(column.nonzero()[0]) if column.any() else 0 for column in table.T]
        if self.shards is not None:  # a save takes each parameter from the stage that trains it
            self.shards.owners.update(zip(self._names, owners, strict=True))
        return owners, [i for i, column in enumerate(table.T) if int(column.sum()) > 1]

    def synchronize(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Give every process of the pipeline the current weights of every stage, and the optimizer state of
        every parameter if `optimizer` is given (a checkpoint then holds the single-process state).

        A process that holds its stage only (loaded stage-local, or sharded with `fsdp`) has nothing to copy into: a
        save gathers the weights instead (`fsdp.full_state_dict`)."""
        if self._owner is None or self.ranks == 1 or self.shards is not None:
            return
        with torch.no_grad():
            for param, owner in zip(self.params, self._owner, strict=True):
                # a split parameter: each process's share, from the owner stage's process of the same share
                dist.broadcast(_local(param.data), src=self._stage_rank(owner), group=self.stage_group)
        if optimizer is None:
            return
        params = self.params
        # only parameters the optimizer has state for: reading `optimizer.state` (a defaultdict) at a frozen one (peft's
        # base weights, a frozen feature encoder) would add an entry that `optimizer.state_dict()` cannot map
        own = {
            i: optimizer.state[p] for i, p in enumerate(params) if self._owner[i] == self.stage and p in optimizer.state
        }
        # a split parameter's state travels as this share's tensors (a DTensor names its own process's groups)
        own = {
            i: {k: _local(v).cpu() if torch.is_tensor(v) else v for k, v in state.items()} for i, state in own.items()
        }
        gathered: list[Any] = [None] * self.ranks
        dist.all_gather_object(gathered, own, group=self.stage_group)
        for stage, states in enumerate(gathered):
            if stage == self.stage:
                continue
            for i, state in states.items():
                param = params[i]
                optimizer.state[param] = {k: _like(v, param) for k, v in state.items()}


def _weighted_loss(output: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The last stage's loss of one micro-batch: its mean loss times its weight (a micro-batch with no labelled item
    has weight 0 and a NaN mean: it adds nothing, as in `Engine.micro_batch`)."""
    return torch.where(weight > 0, output * weight, torch.zeros_like(output)).sum()


def _like(value: Any, param: torch.Tensor) -> Any:
    """An optimizer state value received from another stage, placed as `param` is: on its device, and a split
    parameter's share of a moment made a `DTensor` of this process's split again (steps, scalars as they came)."""
    if not torch.is_tensor(value) or not value.dim():
        return value
    value = value.to(param.device)
    return DTensor.from_local(value, param.device_mesh, param.placements) if isinstance(param, DTensor) else value


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's shard of a sharded (`DTensor`) tensor, sharing its storage; a plain tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
