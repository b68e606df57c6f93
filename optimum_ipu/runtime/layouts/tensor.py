"""`TensorParallelLayout`: each replica's layers split over `tensor_parallel_size` processes (`torchrun`), the mesh
`("dp", "pp", "tp")` with `tp` innermost (rank = replica x tp + share), as torchtitan lays it out.

Applied in torchtitan's order: tensor parallelism first (`runtime.tensor_parallel.parallelize`, the model's plan),
then, with several replicas, FSDP2 over the replicas' axis (`dp`): the numbers of data parallelism, each split
parameter sharded once more. The processes of one replica train on the same micro-batches (the loader is sharded by
replica, and the batches of the replica's first process are shared, as a collator's random draws differ per process);
each computes the whole model's loss. Checkpoints are gathered whole and written in the one-process layout, so they
load in one process or in another tensor-parallel size; evaluation runs the split model on the replica's batches and
keeps one copy of its predictions per replica.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from ...config import IPUConfig
from .. import fsdp
from ..distributed import batches_of, world_size
from ..fsdp import ShardedModel
from ..step import TrainingStep
from ..tensor_parallel import parallelize
from .base import EvaluationScope, ModelParts, ReplicasLayout, one_copy_per_group, shard_by_replica
from .sharded import ShardedReplicasLayout

logger = logging.getLogger(__name__)


class TensorParallelLayout(ShardedReplicasLayout):
    """Replicas of `tensor_parallel_size` processes each, every layer's matrices split over them (see the module
    docstring).

    Args:
        ipu_config (`IPUConfig`): the execution configuration (`tensor_parallel_size` > 1).
    """

    def __init__(self, ipu_config: IPUConfig) -> None:
        super().__init__(ipu_config)
        self.size = ipu_config.value("tensor_parallel_size")
        self.replicas = world_size() // self.size

    def device_mesh(self, device: torch.device) -> Any:
        """`(replicas, 1, tensor_parallel_size)`, dims `("dp", "pp", "tp")`."""
        return init_device_mesh(device.type, (self.replicas, 1, self.size), mesh_dim_names=("dp", "pp", "tp"))

    def apply(self, parts: ModelParts, engine: Any, accelerator: Any) -> TrainingStep:
        ReplicasLayout.apply(self, parts, engine, accelerator)  # the mesh; not ShardedReplicasLayout's sharding yet
        parallelize(parts.model, parts.tensor_parallel_plan(self.size), self.mesh["tp"])
        if self.replicas > 1:  # torchtitan's order: the split first, then FSDP2 over the replicas
            fsdp.shard_model(parts.model, parts.layer_paths, mesh=self.mesh["dp"])
        logger.info("tensor parallelism: %d replicas x %d devices a layer", self.replicas, self.size)
        return engine

    # ------------------------------------------------------------------ the model
    def wrap_model(self, model: nn.Module, training: bool, stock: Callable[[], nn.Module]) -> nn.Module:
        if training:  # no DDP around split parameters
            return model if isinstance(model, ShardedModel) else ShardedModel(model)
        return model

    def training_runner(self, wrapped: nn.Module) -> nn.Module:
        # the stock forward: the output projection is split over the devices by vocabulary rows already, which is what
        # `projection_serialization_factor` chunks in one process
        return wrapped

    def before_micro_batch(self, last: bool) -> None:
        if self.replicas > 1:
            super().before_micro_batch(last)

    # ------------------------------------------------------------------ the data
    def train_loader(self, loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        """Shard the prepared loader by replica: the processes of one replica read the same batches."""
        return shard_by_replica(loader, self.replicas, self.accelerator.process_index // self.size)

    def eval_loader(self, loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        return self.train_loader(loader)

    def same_batches(self, batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The micro-batches of the replica's first process on each of its processes (a collator's draws differ)."""
        first = self.accelerator.process_index // self.size * self.size
        return batches_of(first, self.mesh.get_group("tp"), batches, self.engine.device) if batches else batches

    def samples_per_step(self, total: int) -> int:
        return total // self.size  # the processes of a replica share its samples

    # ------------------------------------------------------------------ evaluation
    def evaluation_scope(self, batch_rows: int) -> EvaluationScope:
        # every process of a replica sees its batches: each process's own token count is its replica's
        return EvaluationScope(gather=self.gather, args={"average_tokens_across_devices": False})

    def gather(self, data: Any) -> Any:
        """`Trainer`'s `gather_for_metrics` with one copy per replica (its processes return the same outputs)."""
        return one_copy_per_group(self.accelerator, data, self.size, keep=0)  # rank = replica x tp + share
