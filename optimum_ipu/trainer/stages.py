"""`IPUTrainer` with pipeline stages on separate processes (`torchrun`, `ipus_per_replica` > 1).

`transformers.Trainer` runs one micro-batch per `training_step` and wraps the model in DDP over every
process. A pipeline needs the other way round: the whole optimizer step's micro-batches at once (the schedule
interleaves them over the stages), the same micro-batches on every stage of a replica, and gradients averaged
over the replicas of each stage only. `ProcessPipeline` does that through the trainer's hooks:

- `wrap` returns the model in a plain container, so accelerate does not wrap it in DDP over all processes;
- `shard_loader` makes the training loader shard the data by replica (rank // stages), not by process, so the
  stages of one replica see the same batches and an epoch has the single-process number of steps;
- `same_batches` gives every stage of a replica the micro-batches its last stage collated, before they are counted;
- `make_engine` builds the `PipelineEngine` that `IPUTrainer.training_step` drives through the step protocol
  (`optimum_ipu.runtime.step`), as it drives the single-process `Engine`: micro-batches are queued, and the
  schedule runs, and the gradients are reduced and clipped with the norm over every stage, at `finish_step`;
- `synchronize` brings every stage's weights (and, for checkpoints, optimizer state) to every process, so
  saves are the stock model of a single-process run and evaluation runs the whole model on every process;
- when each process holds its stage only (`stage_hold`: loaded stage-local, or `--fsdp`), evaluation instead runs
  each batch forward through the replica's stages (`forward_module`), on the loader sharded by replica, and
  `gather` keeps one copy of the predictions per replica.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from accelerate.utils import recursively_apply
from torch import nn

from ..config import IPUConfig
from ..errors import IncompatibleIPUConfigError
from ..models.layout import layers_per_stage
from ..runtime.distributed import world_size
from ..runtime.pipeline_forward import PipelinedForward, StageForward
from ..runtime.pipeline_parallel import PipelineEngine
from ..runtime.stage_hold import stage_hold
from ..topology import check_schedule, stages_per_process

logger = logging.getLogger(__name__)


class StagesContainer(nn.Module):
    """Holds the model while its stages train on separate processes (accelerate leaves it unwrapped)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class ProcessPipeline:
    """The pipeline-over-processes side of an `IPUTrainer` (see the module docstring).

    Args:
        trainer (`IPUTrainer`): the trainer; its `pipelined` model, `ipu_config`, `engine` and arguments are used.
        schedule (`str`): `"1F1B"`, `"GPipe"`, `"Interleaved1F1B"` or `"ZeroBubble"` (these two also run several
            stages per process, when `layers_per_ipu` is longer than the processes of a replica).
    """

    def __init__(self, trainer: Any, schedule: str) -> None:
        check_schedule(schedule, "pipeline_schedule")
        config: IPUConfig = trainer.ipu_config
        if config.value("replicated_tensor_sharding") and config.value("replication_factor") > 1:
            # Graphcore's bert-base config asks for it: refusing would refuse the reference recipe
            logger.warning(
                "replicated_tensor_sharding (ZeRO-1) does not apply to pipeline stages on separate processes; each "
                "process keeps the optimizer state of its stage whole. To shard it over the stage's replicas, pass "
                "--fsdp (parameters, gradients and optimizer state), or use ipus_per_replica=1"
            )
        plan, model = trainer.pipelined.plan, trainer.pipelined.model
        reason = plan.process_stages_reason if not plan.process_stages else ""
        if getattr(getattr(model, "config", None), "use_weighted_layer_sum", False):  # Wav2Vec2/HuBERT/Whisper heads
            reason = "with use_weighted_layer_sum its head on the last stage reads every layer's output"
        if reason:
            raise IncompatibleIPUConfigError(
                f"{type(model).__name__} cannot run its pipeline stages on separate processes: "
                f"{reason}; run one process (the stages run in turn), or set "
                "layers_per_ipu=[-1] and ipus_per_replica=1 for data parallelism over the processes"
            )
        if getattr(trainer, "compute_loss_func", None) is not None:
            # The last stage returns the model's own loss from inside the schedule; a loss computed from the
            # outputs (packed rows' losses, say) would need the step's label count on that stage: not done yet.
            raise ValueError(
                "compute_loss_func (packing's packed losses among them) is not supported with pipeline stages on "
                "separate processes yet: the last stage trains on the model's own loss. Train without it, in one "
                "process (the stages run in turn), or with layers_per_ipu=[-1] and ipus_per_replica=1 for data "
                "parallelism over the processes"
            )
        self.trainer, self.schedule = trainer, schedule
        # processes of one pipeline: its stages, or fewer with an interleaved schedule (several stages each)
        self.stages = config.value("ipus_per_replica") // stages_per_process(config, world_size(), schedule)
        self.engine: PipelineEngine | None = None
        self._forward: PipelinedForward | None = None
        self._synchronized_at = 0  # the engine's steps when every process last got every stage's weights
        logger.info(
            "pipeline of %d stages on separate processes x %d replicas, %s schedule",
            self.stages,
            config.value("replication_factor"),
            schedule,
        )

    @staticmethod
    def wanted(ipu_config: IPUConfig) -> bool:
        """Whether training runs the stages on separate processes (several processes, several stages)."""
        return world_size() > 1 and ipu_config.value("ipus_per_replica") > 1

    def wrap(self, model: nn.Module) -> nn.Module:
        return model if isinstance(model, StagesContainer) else StagesContainer(model)

    def shard_loader(self, loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        """Shard the prepared training loader by replica instead of by process."""
        batch_sampler = getattr(loader, "batch_sampler", None)
        if not hasattr(batch_sampler, "num_processes"):
            raise ValueError(
                "pipeline stages on separate processes need a map-style training dataset (with __len__); an "
                "iterable dataset cannot be fed identically to every stage"
            )
        batch_sampler.num_processes = self.trainer.ipu_config.value("replication_factor")
        batch_sampler.process_index = self.trainer.args.process_index // self.stages
        if batch_sampler.num_processes == 1:
            # one replica: its last batch needs no padding to match another's (a padded batch's mean loss would
            # count the padding rows, unlike one process's)
            batch_sampler.even_batches = False
        return loader

    def make_engine(self) -> PipelineEngine:
        """The training engine of this process's stage (after any sharding: it keeps the model as it finds it)."""
        trainer = self.trainer
        cut = trainer.pipelined.stage_cut()
        self.engine = PipelineEngine(
            trainer.pipelined.model,
            trainer.ipu_config,
            cut,
            counts=layers_per_stage(trainer.ipu_config, len(cut.layer_paths), inference=False),
            schedule=self.schedule,
            max_grad_norm=trainer.args.max_grad_norm,
            precision=trainer.engine.precision,
            device=trainer.args.device,
            required_inputs=trainer.pipelined.plan.process_stage_inputs,
            share_batches=False,  # `same_batches` shares them in `get_batch_samples`, before Trainer counts them
        )
        return self.engine

    def same_batches(self, batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """An optimizer step's micro-batches as the replica's last stage collated them, on every stage of the replica
        (`runtime.distributed.batches_of`: a collator's random draws differ per process), before anything is
        counted from them (`Trainer`'s items in the batch, each micro-batch's loss weight)."""
        return self.engine.same_batches(batches)

    # ---------------------------------------------------------------- evaluation
    def forward_module(self) -> PipelinedForward:
        """The model that evaluation and prediction run when this process holds only its stage: each batch goes
        forward through the replica's stages, and every stage returns the last stage's output."""
        if self._forward is None:
            trainer = self.trainer
            hold = stage_hold(trainer.model)
            cut = trainer.pipelined.stage_cut()
            counts = layers_per_stage(trainer.ipu_config, len(cut.layer_paths), inference=False)
            group, precision = hold.mesh.get_group("pp"), trainer.engine.precision
            stage = StageForward(trainer.model, cut, counts, hold.stage, group, precision, gate=hold.gate)
            self._forward = PipelinedForward(stage, trainer.model)
        return self._forward

    def gather(self, data: Any) -> Any:
        """`Trainer`'s `gather_for_metrics` with one copy per replica: the stages of a replica return the same
        predictions, so of every process's gathered block only the last stage's is kept; the loader's remainder
        (counted over the replicas, `shard_loader`) is dropped at the end."""
        accelerator = self.trainer.accelerator
        replicas = self.trainer.ipu_config.value("replication_factor")

        def last_stage(t: torch.Tensor) -> torch.Tensor:
            blocks = t.reshape(replicas, self.stages, -1, *t.shape[1:])  # rank = replica x stages + stage
            return blocks[:, -1].reshape(-1, *t.shape[1:])

        data = recursively_apply(last_stage, accelerator.gather(data))
        state = accelerator.gradient_state
        if state.end_of_dataloader and state.remainder > 0:
            data = recursively_apply(lambda t: t[: state.remainder], data)
        return data

    def synchronize(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Every stage's current weights (and optimizer state, when given) on every process of the pipeline."""
        if self.engine is None:
            return
        if self.engine.steps_run != self._synchronized_at or optimizer is not None:
            inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper keeps the torch optimizer
            self.engine.synchronize(inner)
            self._synchronized_at = self.engine.steps_run
