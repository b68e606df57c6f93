"""The layout object: how a model is laid out over this job's processes, and everything that differs with it.

`IPUTrainer` holds one layout and calls it; it never asks which one it is. A layout is chosen from the IPU config and
the world (`choose_layout`), before anything is built, then applied to the stock model once the processes have agreed
on the run (`Layout.apply`): the parallelisms are applied in one fixed order (the pipeline split, then FSDP2 over the
replicas), as torchtitan composes them. What each layout owns:

- wrapping the model (`wrap_model`: DDP by accelerate, a container, FSDP shards, a forward through the stages);
- which rows of a batch a process reads (`train_loader`, `eval_loader`, `same_batches`);
- the engine that speaks the step protocol (`engine`, `optimum_ipu.runtime.step`);
- evaluation and prediction (`evaluation_scope`, `after_evaluation`);
- saving and loading a checkpoint (`save_model`, `save_optimizer`, `load_model`, `load_optimizer`,
  `runtime/layouts/checkpoints.py`), and what it logs.

The layouts (`runtime/layouts/`): `ReplicasLayout` (this module: one process running the stages in turn, or one
replica per process under DDP), `ShardedReplicasLayout` (`sharded.py`: FSDP2 over the replicas) and
`ProcessStagesLayout` (`stages.py`: pipeline stages on separate processes, each holding the whole model or only its
stage, optionally sharded over the stage's replicas).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import recursively_apply
from torch import nn

from ...config import IPUConfig
from ..distributed import world_size
from ..fsdp import stage_mesh, sync_gradients_at
from ..stages.hold import stage_hold
from ..step import TrainingStep
from . import checkpoints

logger = logging.getLogger(__name__)


@dataclass
class ModelParts:
    """What a layout is applied to: the stock model and the facts of its stage plan, read by the caller (the
    layouts live below `models/` and never read a plan themselves).

    Args:
        model (`nn.Module`): the stock model (a peft wrapper around it included), as the trainer holds it.
        runner (`nn.Module`): the pipelined wrapper that runs the model in one process (serialized heads).
        stage_cut (`Callable`): returns the model's `StageCut` (`PipelinedModel.stage_cut`).
        counts (`list[int]`): layers of each training stage, wildcards resolved.
        layer_paths (`list[str]`): dotted paths of every pipeline layer.
        name (`str`): the stock model's class name, as errors name it.
        process_stages_refusal (`str`): why the model cannot run its stages on separate processes ('' when it can).
        required_inputs (`tuple[str, ...]`): tensors every batch must carry through stages on processes.
        custom_loss (`bool`): the trainer computes the loss from the outputs (`compute_loss_func`).
        loss_shifts_labels (`bool`): the loss averages `labels[..., 1:]` (a causal LM).
        vocabulary_loss (`str`): `"causal"` or `"masked"` where the loss is a cross-entropy over the vocabulary from
            the output projection (the plan's `loss_kind`), else `""`.
        tensor_parallel_plan (`Callable`, *optional*): `(size) -> TensorParallelPlan`: what `tensor_parallel_size`
            splits in the model (`optimum_ipu.models.tensor_parallel_plan`; it raises where the family has no split).
    """

    model: nn.Module
    runner: nn.Module
    stage_cut: Callable[[], Any]
    counts: list[int]
    layer_paths: list[str]
    name: str = ""
    process_stages_refusal: str = ""
    required_inputs: tuple[str, ...] = ()
    custom_loss: bool = False
    loss_shifts_labels: bool = False
    vocabulary_loss: str = ""
    tensor_parallel_plan: Callable[[int], Any] | None = None


def shard_by_replica(loader: torch.utils.data.DataLoader, replicas: int, replica: int) -> torch.utils.data.DataLoader:
    """Shard accelerate's prepared `loader` by replica instead of by process: the processes of one replica (its
    pipeline stages, its tensor-parallel devices) read the same batches, and an epoch has the single-process number
    of steps."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    if not hasattr(batch_sampler, "num_processes"):
        raise ValueError(
            "a replica spread over several processes needs a map-style dataset (with __len__); an iterable dataset "
            "cannot be fed identically to every process of a replica"
        )
    batch_sampler.num_processes, batch_sampler.process_index = replicas, replica
    if replicas == 1:
        # one replica: its last batch needs no padding to match another's (a padded batch's mean loss would count
        # the padding rows, unlike one process's)
        batch_sampler.even_batches = False
    return loader


def one_copy_per_group(accelerator: Any, data: Any, group_size: int, keep: int) -> Any:
    """`Trainer`'s `gather_for_metrics` where each `group_size` consecutive processes (a replica's stages, a stage's
    tensor-parallel shares) evaluated the same batches: of every group's gathered blocks only its member `keep` is
    kept; the loader's remainder (counted over the groups) is dropped at the end."""

    def one_per_group(t: torch.Tensor) -> torch.Tensor:
        blocks = t.reshape(-1, group_size, t.shape[0] // accelerator.num_processes, *t.shape[1:])
        return blocks[:, keep].reshape(-1, *t.shape[1:])

    data = recursively_apply(one_per_group, accelerator.gather(data))
    state = accelerator.gradient_state
    if state.end_of_dataloader and state.remainder > 0:
        data = recursively_apply(lambda t: t[: state.remainder], data)
    return data


@dataclass
class SaveHooks:
    """The caller's writers a layout saves a model through (what `transformers.Trainer` writes beside the weights
    is the trainer's business, the tensors are the layout's).

    Args:
        should_save (`bool`): this process writes files (the main process).
        stock (`Callable`): `Trainer.save_model` as it is (one process, or DDP: the model is whole here).
        write_state_dict (`Callable`): writes a whole `state_dict` as `Trainer` writes a model.
        write_model_files (`Callable`): writes the config, processor and training arguments into a folder.
        write_adapters (`Callable`): writes a peft model's adapter tensors (gathered whole) into a folder.
    """

    should_save: bool
    stock: Callable[[], None]
    write_state_dict: Callable[[dict[str, torch.Tensor]], None]
    write_model_files: Callable[[str], None]
    write_adapters: Callable[[dict[str, torch.Tensor], str], None]


@dataclass
class EvaluationScope:
    """How `Trainer`'s evaluation loop runs in a layout: its `gather_function` (None: `Trainer`'s own) and the
    arguments it must read differently for that loop."""

    gather: Callable[[Any], Any] | None = None
    args: dict[str, Any] = field(default_factory=dict)


class ReplicasLayout:
    """Replicas of the whole model: one process that runs every stage (and every replica) in turn, or one replica
    per process under `torchrun`, whose gradients accelerate's DDP all-reduces. The other layouts override what
    differs from this one.

    Args:
        ipu_config (`IPUConfig`): the execution configuration.
    """

    # whether each process's loss is the model's loss (a stage's loss on processes is not)
    reports_model_loss = True
    # whether the parameters are split over the processes (FSDP shards or one stage each): no whole state here
    holds_part_only = False
    # whether FSDP2 shards the parameters over the replicas (`--fsdp`)
    sharded = False

    def __init__(self, ipu_config: IPUConfig) -> None:
        self.ipu_config = ipu_config
        self.parts: ModelParts | None = None
        self.engine: TrainingStep | None = None
        self.accelerator: Any = None
        self.mesh: Any = None  # the job's `("dp", "pp")` DeviceMesh (None in one process)

    def apply(self, parts: ModelParts, engine: Any, accelerator: Any) -> TrainingStep:
        """Lay the model out (a collective where processes shard or split it) and return the engine that drives its
        training steps. `engine` is the single-process `Engine` (precision, loss scaling, clipping)."""
        self.parts, self.engine, self.accelerator = parts, engine, accelerator
        self.mesh = self.device_mesh(engine.device)
        return engine

    def device_mesh(self, device: torch.device) -> Any:
        """The mesh this layout is over, its dims named `("dp", "pp")` (replicas, stages); here every process is a
        replica of the whole model: `(processes, 1)`. None in one process. A collective (every process makes it)."""
        processes = world_size()
        return stage_mesh(processes, 1, device) if processes > 1 else None

    # ------------------------------------------------------------------ the model
    def move_model_to_device(self, model: nn.Module, stock: Callable[[], None]) -> None:
        """`Trainer` moves the model to its device: a model that holds one stage was built on its device already."""
        if stage_hold(model) is None:
            stock()

    def wrap_model(self, model: nn.Module, training: bool, stock: Callable[[], nn.Module]) -> nn.Module:
        """The model `Trainer` runs: accelerate's (DDP over the processes while training)."""
        return stock()

    def training_runner(self, wrapped: nn.Module) -> nn.Module:
        """What runs a micro-batch's forward: in one process the pipelined wrapper (with
        `projection_serialization_factor` its output projection and loss run in chunks, full logits never built);
        under DDP the wrapped stock model, for DDP's gradient hooks (the projection is then serialized but its logits
        are built whole)."""
        return self.parts.runner.train() if wrapped is self.parts.model else wrapped

    def before_micro_batch(self, last: bool) -> None:
        """Called before each micro-batch: a sharded model reduce-scatters its gradients in the last one only."""
        sync_gradients_at(self.parts.model, last_micro_batch=last)

    def check_batch(self, packed_for_flex: bool) -> None:
        """Refuse a batch this layout cannot run (every batch runs here)."""

    # ------------------------------------------------------------------ the data
    def train_loader(self, loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        """The training loader, sharded as this layout reads it (accelerate's: by process)."""
        return loader

    def eval_loader(self, loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        """The evaluation loader, sharded as this layout reads it (accelerate's: by process)."""
        return loader

    def same_batches(self, batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """An optimizer step's micro-batches as this process must train on them (its own, here)."""
        return batches

    def samples_per_step(self, total: int) -> int:
        """Samples per optimizer step, from `Trainer`'s count over every process."""
        return total

    def optimizer_state_shardable(self) -> bool:
        """Whether ZeRO-1 (`replicated_tensor_sharding`) can shard the optimizer state over processes here."""
        return world_size() > 1

    # ------------------------------------------------------------------ evaluation
    def eval_device_iterations(self) -> int:
        """Batches of `per_device_eval_batch_size` rows in one evaluation host call: `inference_device_iterations`."""
        return self.ipu_config.value("device_iterations", inference=True)

    def evaluation_scope(self, batch_rows: int) -> EvaluationScope:
        """Ready the model for `Trainer`'s evaluation loop (of batches of `batch_rows` per device, a host call holding
        `eval_device_iterations` of them) and say how the loop runs."""
        return EvaluationScope()

    def after_evaluation(self) -> None:
        """Put back what an evaluation changed."""

    def before_prediction_step(self, loss_only: bool) -> None:
        """Called on every process before each evaluation or prediction batch: whether `Trainer` keeps its loss
        alone (`prediction_loss_only`), so the model need not make the logits."""

    # ------------------------------------------------------------------ checkpoints
    def before_checkpoint(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Called on every process before a checkpoint is written."""

    def save_model(self, folder: str, hooks: SaveHooks) -> None:
        """Write the stock model (`transformers`' layout) into `folder`; every process calls it."""
        hooks.stock()

    def save_optimizer(
        self, optimizer: torch.optim.Optimizer, scheduler: Any, folder: str, should_save: bool, stock: Callable
    ) -> None:
        """Write the optimizer and LR scheduler states of a checkpoint; every process calls it."""
        stock()

    def load_model(self, folder: str, stock: Callable[[], None]) -> None:
        """Load a checkpoint's weights into the model (every process)."""
        stock()

    def load_best_model(self, folder: str, stock: Callable[[], None]) -> None:
        """Load the best checkpoint's weights at the end of training (every process)."""
        stock()

    def load_optimizer(self, optimizer: Any, scheduler: Any, folder: str | None, stock: Callable[[], None]) -> None:
        """Load a checkpoint's optimizer and scheduler states, written in this layout or another."""
        checkpoints.load_optimizer_state(self.parts.model, optimizer, scheduler, folder, self.holds_part_only, stock)
