"""Inference layouts: how a `pipeline()`'s model runs in this job. `InferenceRunner` holds one and calls it; neither it
nor the pipeline asks which one it is.

- `WholeModelInference`: the whole model in this process, its inference replicas run in turn (under `torchrun`, this
  process's share of them);
- `StagesInference`: under `torchrun`, a model loaded stage by stage: each call goes through the replica's stages as
  micro-batches, several in flight, and the last stage's output comes back to every process (`stages.forward`); one
  stage cannot be compiled or exported alone, so it runs eagerly.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from ...config import IPUConfig
from ..distributed import world_size
from ..stages.forward import forward_through_stages
from ..stages.hold import StageHold, stage_hold

logger = logging.getLogger(__name__)


class WholeModelInference:
    """The whole model in this process (see the module docstring).

    Args:
        ipu_config (`IPUConfig`): the configuration (its `inference_*` fields are read).
    """

    def __init__(self, ipu_config: IPUConfig) -> None:
        self.ipu_config = ipu_config

    def rows_per_device(self) -> int:
        """Rows of a host call per row of the per-device batch: `inference_device_iterations` x the inference replicas
        this process runs (every one in one process; its share under `torchrun`)."""
        replicas = max(1, self.ipu_config.value("replication_factor", inference=True) // world_size())
        return replicas * self.ipu_config.value("device_iterations", inference=True)

    def backend(self, chosen: str) -> str:
        """The backend that runs here, given the one chosen for the device."""
        return chosen

    def attach(self, engine: Any, model: nn.Module, precision: str) -> None:
        """Make `engine` run the model as this layout does (here: as it is)."""


class StagesInference(WholeModelInference):
    """One stage of the model in this process, the others in the other processes of its replica.

    Args:
        ipu_config (`IPUConfig`): the configuration.
        hold (`StageHold`): what this process holds (`stage_hold`).
    """

    def __init__(self, ipu_config: IPUConfig, hold: StageHold) -> None:
        super().__init__(ipu_config)
        self.hold = hold

    def backend(self, chosen: str) -> str:
        if chosen != "eager":
            logger.info("backend=%r: this process holds one pipeline stage, which runs eagerly", chosen)
        return "eager"

    def attach(self, engine: Any, model: nn.Module, precision: str) -> None:
        stock = getattr(model, "model", model)  # the transformers model inside the PipelinedModel
        engine.forward = forward_through_stages(stock, model.stage_cut(), self.hold, precision, everywhere=True)


def inference_layout(model: nn.Module, ipu_config: IPUConfig) -> WholeModelInference:
    """The inference layout of `model` (a `PipelinedModel`) in this job: stages on processes when this process holds
    one stage of it, else the whole model."""
    hold = stage_hold(getattr(model, "model", model))
    return StagesInference(ipu_config, hold) if hold is not None else WholeModelInference(ipu_config)
