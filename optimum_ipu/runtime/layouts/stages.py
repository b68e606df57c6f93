"""`ProcessStagesLayout`: pipeline stages on separate processes (`torchrun`, `ipus_per_replica` > 1).

`transformers.Trainer` runs one micro-batch per `training_step` and wraps the model in DDP over every process. A
pipeline needs the other way round: the whole optimizer step's micro-batches at once (the schedule interleaves them
over the stages), the same micro-batches on every stage of a replica, and gradients averaged over the replicas of
each stage only. This layout does that:

- `wrap_model` returns the model in a plain container while training, so accelerate does not wrap it in DDP over all
  processes;
- `train_loader` shards the data by replica (rank // stages), not by process, so the stages of one replica see the
  same batches and an epoch has the single-process number of steps;
- `same_batches` gives every stage of a replica the micro-batches its last stage collated, before they are counted;
- `apply` builds the `PipelineEngine` that the trainer drives through the step protocol (`optimum_ipu.runtime.step`),
  as it drives the single-process `Engine`: micro-batches are queued, and the schedule runs, and the gradients are
  reduced and clipped with the norm over every stage, at `finish_step`; with `--fsdp` each process first keeps only
  its stage, then shards it over the stage's replicas (a replicas x stages mesh);
- when each process holds the whole model, evaluation and saves first bring every stage's weights (and, for
  checkpoints, optimizer state) to every process (`synchronize`): saves are the stock model of a single-process run
  and evaluation runs the whole model on every process;
- when each process holds its stage only (`stage_hold`: loaded stage-local, or `--fsdp`), evaluation instead runs
  each batch forward through the replica's stages (`PipelinedForward`) on the loader sharded by replica, `gather`
  keeps one copy of the predictions per replica, and each stage saves and loads its own part of a checkpoint.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers.trainer import OPTIMIZER_NAME

from ...config import IPUConfig
from ...errors import IncompatibleIPUConfigError
from ...topology import check_schedule, stages_per_process
from .. import fsdp
from ..distributed import world_size
from ..stages.checkpoint import save_stage_shards
from ..stages.engine import PipelineEngine
from ..stages.forward import MICRO_BATCHES_PER_STAGE, PipelinedForward, forward_through_stages
from ..stages.head import SplitHead, head_group, shared_head_hint, split_head_refusal
from ..stages.hold import stage_hold
from ..stages.optimizer import save_stage_optimizer
from ..step import TrainingStep
from ..tensor_parallel import parallelize
from . import checkpoints
from .base import EvaluationScope, ModelParts, ReplicasLayout, SaveHooks, one_copy_per_group, shard_by_replica

logger = logging.getLogger(__name__)


class StagesContainer(nn.Module):
    """Holds the model while its stages train on separate processes (accelerate leaves it unwrapped)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class ProcessStagesLayout(ReplicasLayout):
    """Pipeline stages on separate processes x replicas (see the module docstring).

    Args:
        ipu_config (`IPUConfig`): the execution configuration.
        schedule (`str`): `"1F1B"`, `"GPipe"`, `"Interleaved1F1B"` or `"ZeroBubble"` (these two also run several
            stages per process, when `layers_per_ipu` is longer than the processes of a replica).
        sharded (`bool`, *optional*, defaults to `False`): shard each stage over its replicas (FSDP2, `--fsdp`).
    """

    reports_model_loss = False

    def __init__(self, ipu_config: IPUConfig, schedule: str, sharded: bool = False) -> None:
        super().__init__(ipu_config)
        self.schedule, self.sharded = schedule, sharded
        self.split = ipu_config.value("tensor_parallel_size")  # processes sharing each stage's layers (tp)
        self.stages = 0  # processes of one pipeline, known once checked
        self._forward: PipelinedForward | None = None
        self._said_whole_head = False  # a shared head's evaluations that keep the logits: said once
        self._synchronized_at = 0  # the engine's steps when every process last got every stage's weights

    @property
    def holds_part_only(self) -> bool:  # type: ignore[override]
        return stage_hold(self.parts.model) is not None

    def device_mesh(self, device: torch.device) -> Any:
        """`(replicas, processes of a pipeline)`: the mesh a model loaded stage by stage was split by, else a new
        one."""
        hold = stage_hold(self.parts.model)
        return (
            hold.mesh
            if hold is not None
            else fsdp.stage_mesh(self.ipu_config.value("replication_factor"), self.stages, device, self.split)
        )

    def check(self, parts: ModelParts) -> int:
        """Refuse what cannot run its stages on processes, warn of what does not apply; returns the processes of one
        pipeline (its stages, or fewer with an interleaved schedule: several stages each)."""
        check_schedule(self.schedule, "pipeline_schedule")
        config = self.ipu_config
        if config.value("replicated_tensor_sharding") and config.value("replication_factor") > 1:
            # Graphcore's bert-base config asks for it: refusing would refuse the reference recipe
            logger.warning(
                "replicated_tensor_sharding (ZeRO-1) does not apply to pipeline stages on separate processes; each "
                "process keeps the optimizer state of its stage whole. To shard it over the stage's replicas, pass "
                "--fsdp (parameters, gradients and optimizer state), or use ipus_per_replica=1"
            )
        if parts.process_stages_refusal:
            raise IncompatibleIPUConfigError(
                f"{parts.name} cannot run its pipeline stages on separate processes: "
                f"{parts.process_stages_refusal}; run one process (the stages run in turn), or set "
                "layers_per_ipu=[-1] and ipus_per_replica=1 for data parallelism over the processes"
            )
        if self.split > 1 and (self.sharded or stage_hold(parts.model) is not None):
            raise IncompatibleIPUConfigError(
                f"tensor_parallel_size {self.split} with pipeline stages on separate processes runs with each process "
                "holding the model it splits: not yet with --fsdp or a model loaded stage by stage; drop --fsdp (or "
                "load the model whole), or use ipus_per_replica=1"
            )
        if parts.custom_loss:
            # The last stage returns the model's own loss from inside the schedule; a loss computed from the
            # outputs (packed rows' losses, say) would need the step's label count on that stage: not done yet.
            raise ValueError(
                "compute_loss_func (packing's packed losses among them) is not supported with pipeline stages on "
                "separate processes yet: the last stage trains on the model's own loss. Train without it, in one "
                "process (the stages run in turn), or with layers_per_ipu=[-1] and ipus_per_replica=1 for data "
                "parallelism over the processes"
            )
        return config.value("ipus_per_replica") // stages_per_process(config, world_size(), self.schedule)

    def apply(self, parts: ModelParts, engine: Any, accelerator: Any) -> TrainingStep:
        self.stages = self.check(parts)
        logger.info(
            "pipeline of %d stages on separate processes x %d replicas, %s schedule",
            self.stages,
            self.ipu_config.value("replication_factor"),
            self.schedule,
        )
        super().apply(parts, engine, accelerator)
        if self.split > 1:  # torchtitan's order: tensor parallelism, then the pipeline split
            parallelize(parts.model, parts.tensor_parallel_plan(self.split), self.mesh["tp"])
        if self.sharded:  # the pipeline split first, then FSDP2 over each stage's replicas (torchtitan's order)
            fsdp.shard_pipeline(parts.model, parts.stage_cut(), parts.counts, self.ipu_config, engine.device, self.mesh)
        self.engine = PipelineEngine(
            parts.model,
            self.ipu_config,
            parts.stage_cut(),
            counts=parts.counts,
            schedule=self.schedule,
            max_grad_norm=engine.max_grad_norm,
            precision=engine.precision,
            device=engine.device,
            required_inputs=parts.required_inputs,
            share_batches=False,  # `same_batches` shares them in `get_batch_samples`, before Trainer counts them
            mesh=self.mesh,
        )
        return self.engine

    # ------------------------------------------------------------------ the model
    def wrap_model(self, model: nn.Module, training: bool, stock: Callable[[], nn.Module]) -> nn.Module:
        if training:  # stages reduce their own gradients: no DDP over all
            return model if isinstance(model, StagesContainer) else StagesContainer(model)
        if stage_hold(model) is not None:  # evaluation: forward through the replica's stages
            return self._forward_module()
        return stock()

    def training_runner(self, wrapped: nn.Module) -> nn.Module:
        return wrapped  # never run: the engine queues the micro-batch and its schedule runs the stages' forwards

    def before_micro_batch(self, last: bool) -> None:
        """Nothing: `PipelineEngine.finish_step` reduces the step's gradients once, over each stage's replicas."""

    def check_batch(self, packed_for_flex: bool) -> None:
        if packed_for_flex:
            raise ValueError(
                "PackedDataCollator(attention='flex') is not supported with pipeline stages on separate processes; "
                "run one process per replica (its stages run in turn)"
            )

    def _forward_module(self) -> PipelinedForward:
        """The model that evaluation and prediction run when this process holds only its stage: each batch goes
        forward through the replica's stages as micro-batches, several in flight (`eval_device_iterations`)."""
        if self._forward is None:
            model = self.parts.model
            hold = stage_hold(model)
            self._forward = forward_through_stages(
                model,
                self.parts.stage_cut(),
                hold,
                self.engine.precision,
                micro_batches=self.eval_device_iterations(),
                shifts_labels=self.parts.loss_shifts_labels,
            )
            self._forward.split_head = self._split_head(hold)
        return self._forward

    def _split_head(self, hold: Any) -> SplitHead | None:
        """The output projection shared by the stages in evaluation, when the config's
        `inference_serialized_projection_splits_per_ipu` asks for it and it can be (`stages.head`); said in one line,
        once, when it was asked for and cannot be."""
        field = "inference_serialized_projection_splits_per_ipu"
        splits = self.ipu_config.value("serialized_projection_splits_per_ipu", inference=True)
        refusal = split_head_refusal(self.parts.model, splits, len(hold.ranges), self.parts.vocabulary_loss)
        if not refusal and (hold.sharded or self.split > 1):
            refusal = "each stage's weights are sharded over processes (--fsdp, tensor_parallel_size)"
        if refusal == "not asked":
            last, first_replica = hold.stage == len(hold.ranges) - 1, hold.mesh.get_coordinate()[0] == 0
            if last and first_replica and not (hold.sharded or self.split > 1):  # said once, by one process
                hint = shared_head_hint(self.parts.model, len(hold.ranges), self.parts.vocabulary_loss)
                if hint:
                    logger.warning(hint)
            return None
        if refusal:
            logger.warning(f"{field} {splits}: evaluation runs the projection on the last stage alone: {refusal}")
            return None
        group, ranks = head_group(hold.mesh)
        return SplitHead(self.parts.model, group, ranks, splits, shifts_labels=self.parts.vocabulary_loss == "causal")

    def before_prediction_step(self, loss_only: bool) -> None:
        forward = self._forward
        if forward is None:
            return
        forward.loss_only = loss_only  # a shared head computes the loss alone
        if forward.split_head is not None and not loss_only and not self._said_whole_head:
            logger.info(
                "inference_serialized_projection_splits_per_ipu: this evaluation keeps the logits (predict(), "
                "compute_metrics), so the output projection runs whole on the last stage; the stages share it where "
                "the loss alone is kept"
            )
            self._said_whole_head = True

    def eval_device_iterations(self) -> int:
        """Micro-batches of one evaluation host call, each `per_device_eval_batch_size` rows, several in flight through
        the stages: `inference_device_iterations` when set above 1 (as an IPU streams a host call's batches through its
        pipeline), else `MICRO_BATCHES_PER_STAGE` a stage when this process holds its stage only. Cutting each batch
        into micro-batches of single rows instead (as before) ran 1.27x slower: each batch filled and drained the
        pipeline, and rows alone use the matrix units worse (BENCHMARKS.md, evaluation through stages)."""
        iterations = super().eval_device_iterations()
        if iterations > 1 or not self.holds_part_only:
            return iterations
        return MICRO_BATCHES_PER_STAGE * self.stages

    # ------------------------------------------------------------------ the data
    def train_loader(self, loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        """Shard the prepared loader by replica instead of by process."""
        replicas = self.ipu_config.value("replication_factor")
        # rank = (replica x stages + stage) x tensor_parallel_size + share
        return shard_by_replica(loader, replicas, self.accelerator.process_index // (self.stages * self.split))

    def eval_loader(self, loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        """Evaluation through the stages: every stage of a replica gets the same batches."""
        if self.split > 1 and not self.holds_part_only:  # the shares of a stage's split see the same batches
            return shard_by_replica(loader, world_size() // self.split, self.accelerator.process_index // self.split)
        return self.train_loader(loader) if self.holds_part_only else loader

    def same_batches(self, batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """An optimizer step's micro-batches as the replica's last stage collated them, on every stage of the replica
        (`runtime.distributed.batches_of`: a collator's random draws differ per process), before anything is
        counted from them (`Trainer`'s items in the batch, each micro-batch's loss weight)."""
        return self.engine.same_batches(batches) if batches else batches

    def samples_per_step(self, total: int) -> int:
        # the stages of a replica (and the shares of each) read its samples: only replicas multiply the batch
        return total // (self.stages * self.split)

    # ------------------------------------------------------------------ evaluation
    def evaluation_scope(self, batch_rows: int) -> EvaluationScope:
        if not self.holds_part_only:
            self.synchronize()  # every process evaluates the whole model on its shard
            if self.split > 1:  # ... its split, with the other shares of its stage: one copy of their outputs kept
                gather = functools.partial(one_copy_per_group, self.accelerator, group_size=self.split, keep=0)
                return EvaluationScope(gather=gather, args={"average_tokens_across_devices": False})
            return EvaluationScope()
        # The stages of a replica see the same batch: Trainer's token count over every process (and its loss scaled by
        # the process count) would count each batch once per stage. Each process's own count is its replica's: the
        # one-process loss (a classifier's mean would otherwise come out x stages).
        forward = self._forward_module()  # each host call's batches of one process go through the stages as such
        forward.new_evaluation()
        forward.rows_per_micro_batch = batch_rows if super().eval_device_iterations() == 1 else None
        return EvaluationScope(gather=self.gather, args={"average_tokens_across_devices": False})

    def after_evaluation(self) -> None:
        fsdp.reshard(self.parts.model)  # sharded stages: the optimizer must find the shards, not what was gathered

    def gather(self, data: Any) -> Any:
        """`Trainer`'s `gather_for_metrics` with one copy per replica: the stages of a replica return the same
        predictions, so of every process's gathered block only the last stage's is kept."""
        return one_copy_per_group(self.accelerator, data, self.stages, keep=-1)  # rank = replica x stages + stage

    def synchronize(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Every stage's current weights (and optimizer state, when given) on every process of the pipeline."""
        if self.engine.steps_run != self._synchronized_at or optimizer is not None:
            inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper keeps the torch optimizer
            self.engine.synchronize(inner)
            self._synchronized_at = self.engine.steps_run

    # ------------------------------------------------------------------ checkpoints
    def before_checkpoint(self, optimizer: torch.optim.Optimizer | None) -> None:
        self.synchronize(optimizer)  # the checkpoint of a single-process run

    def save_model(self, folder: str, hooks: SaveHooks) -> None:
        self.synchronize()  # called by every process, as in the example scripts
        model = self.parts.model
        hold = stage_hold(model)
        if hold is None and self.split > 1:  # the shares gathered whole (every process), written by one
            state_dict = fsdp.full_state_dict(model)
            if hooks.should_save:
                hooks.write_state_dict(state_dict)
        elif hold is None:
            hooks.stock()
        elif checkpoints.has_adapters(model):  # peft's adapter files, as in one process
            state_dict = checkpoints.gather_stage_adapters(model, hold)
            if hooks.should_save:
                hooks.write_adapters(state_dict, folder)
        else:  # each stage writes its own shard of the stock sharded layout: nothing is gathered
            save_stage_shards(model, hold, folder)
            if hooks.should_save:
                hooks.write_model_files(folder)

    def save_optimizer(
        self, optimizer: torch.optim.Optimizer, scheduler: Any, folder: str, should_save: bool, stock: Callable
    ) -> None:
        if self.split > 1:  # every stage's state on every process (`before_checkpoint`), gathered whole over the shares
            state = fsdp.full_optimizer_state_dict(self.parts.model, getattr(optimizer, "optimizer", optimizer))
            if should_save:
                torch.save(state, os.path.join(folder, OPTIMIZER_NAME))
            return checkpoints.save_scheduler(scheduler, folder, should_save)
        if not self.holds_part_only:
            return stock()
        # each stage writes its part: nothing gathered
        save_stage_optimizer(self.parts.model, getattr(optimizer, "optimizer", optimizer), folder)
        checkpoints.save_scheduler(scheduler, folder, should_save)

    def load_model(self, folder: str, stock: Callable[[], None]) -> None:
        if not self.holds_part_only and self.split == 1:
            return stock()
        checkpoints.load_held_model(self.parts.model, folder)

    def load_best_model(self, folder: str, stock: Callable[[], None]) -> None:
        self.load_model(folder, stock)

    def load_optimizer(self, optimizer: Any, scheduler: Any, folder: str | None, stock: Callable[[], None]) -> None:
        held = self.holds_part_only or self.split > 1  # split layers take the whole state as shares
        checkpoints.load_optimizer_state(self.parts.model, optimizer, scheduler, folder, held, stock)
