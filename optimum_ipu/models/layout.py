"""Which layers sit on which device slot: the stage layout of a model under an `IPUConfig`. No torch."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import IPUConfig


@dataclass(frozen=True)
class StageSpec:
    """One pipeline stage of a replica (one device slot).

    Args:
        index (`int`): the stage's position, which is also its device slot in the replica (`ipu{index}`).
        layers (`range`): indices of the layers it runs, counted over the plan's layer lists.
        embeddings (`bool`): it runs the embeddings (stage 0).
        heads (`bool`): it runs the heads and the loss (the last stage).
    """

    index: int
    layers: range
    embeddings: bool
    heads: bool

    def describe(self) -> str:
        parts = ["embeddings"] if self.embeddings else []
        if len(self.layers):
            last = self.layers[-1]
            parts.append(f"layer {last}" if len(self.layers) == 1 else f"layers {self.layers[0]}-{last}")
        if self.heads:
            parts.append("heads")
        return " + ".join(parts) or "(empty: passes activations on)"


def stage_layout(ipu_config: IPUConfig, num_layers: int, inference: bool | None = None) -> list[StageSpec]:
    """Stages of `ipu_config` for a model of `num_layers` layers: of its current mode, or of the inference
    (`inference=True`) or training layout."""
    counts = ipu_config.layers_per_stage(num_layers, inference=inference)
    stages, start = [], 0
    for index, count in enumerate(counts):
        stages.append(
            StageSpec(index, range(start, start + count), embeddings=index == 0, heads=index == len(counts) - 1)
        )
        start += count
    return stages


def format_layout(stages: list[StageSpec]) -> str:
    """A printable table: one line per device slot."""
    return "\n".join(f"  ipu{s.index}: {s.describe()}" for s in stages)
