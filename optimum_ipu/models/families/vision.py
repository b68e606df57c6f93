"""Stage plans of the vision families beyond ViT (which stays with the text families): ConvNeXt.

ConvNeXt has no list of identical layers: its encoder holds `num_stages` stages of different widths (each a
downsampling layer and `depths[i]` blocks). The stages are the pipeline layers, so `layers_per_ipu` counts them
(4 for every published ConvNeXt); the patch embedding goes with stage 0, the final norm and the classifier with
the last stage. `transformers`' ConvNeXt has no activation checkpointing, so `recompute_checkpoint_every_layer`
is a clear error for it (raised by `parallelize()`).
"""

from __future__ import annotations

from ..stage_plan import StagePlan

PLANS: tuple[StagePlan, ...] = (
    StagePlan(
        family="convnext",
        classes=("ConvNextModel", "ConvNextForImageClassification"),
        embeddings=("embeddings",),
        layers=("encoder.stages",),
        layer_count_fields=("num_stages",),
        input_kind="pixels",
    ),
)
