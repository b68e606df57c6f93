"""Layouts: how a model is laid out over this job's processes (see `base.py`), chosen from the IPU config and the
world by `choose_layout`. `IPUTrainer` holds one and calls it; it never asks which one it is."""

from __future__ import annotations

import logging

from ...config import IPUConfig
from ..distributed import world_size
from .base import EvaluationScope, ModelParts, ReplicasLayout, SaveHooks
from .sharded import ShardedReplicasLayout
from .stages import ProcessStagesLayout, StagesContainer
from .tensor import TensorParallelLayout

logger = logging.getLogger(__name__)

__all__ = [
    "EvaluationScope",
    "ModelParts",
    "ProcessStagesLayout",
    "ReplicasLayout",
    "SaveHooks",
    "ShardedReplicasLayout",
    "StagesContainer",
    "TensorParallelLayout",
    "choose_layout",
]


def choose_layout(ipu_config: IPUConfig, *, fsdp: bool = False, schedule: str = "1F1B") -> ReplicasLayout:
    """The layout of a training job: each layer split over processes with `tensor_parallel_size` > 1, stages on
    separate processes when there are several processes and several stages a replica, else replicas (FSDP2-sharded
    with `fsdp`). Nothing is built yet: `Layout.apply` does it, once the
    processes have agreed on the run.

    Args:
        ipu_config (`IPUConfig`): the execution configuration (its training layout).
        fsdp (`bool`, *optional*, defaults to `False`): shard parameters, gradients and optimizer state over the
            replicas (`--fsdp`).
        schedule (`str`, *optional*, defaults to `"1F1B"`): the pipeline schedule of stages on processes.
    """
    processes, tensor_parallel = world_size(), ipu_config.value("tensor_parallel_size")
    if tensor_parallel > 1 and processes == 1:
        logger.warning(
            "tensor_parallel_size %d in one process: its devices' shares run in turn here (the whole model, the same "
            "numbers); launch torchrun to split the layers over processes",
            tensor_parallel,
        )
    elif tensor_parallel > 1 and ipu_config.value("ipus_per_replica") == 1:
        return TensorParallelLayout(ipu_config)
    if fsdp and processes == 1:
        logger.warning("--fsdp in one process: the replicas run in turn here, there is nothing to shard over")
        fsdp = False
    if processes > 1 and ipu_config.value("ipus_per_replica") > 1:
        return ProcessStagesLayout(ipu_config, schedule, sharded=fsdp)
    return ShardedReplicasLayout(ipu_config) if fsdp else ReplicasLayout(ipu_config)
