"""`"image-classification"` at static shapes: `transformers`' `ImageClassificationPipeline` (image loading, the
model's image processor, `top_k`, `function_to_apply`), the model run by the engine (`StaticBatchingPipeline`).

Every image leaves the image processor at the model's size (resized, or cropped), so the only shape that varies is
the number of images: host batches are filled to `host_batch_rows()` rows as for text.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers import ImageClassificationPipeline
from transformers.modeling_outputs import ImageClassifierOutput

from .base import StaticBatchingPipeline
from .images import load_image


class IPUImageClassificationPipeline(ImageClassificationPipeline, StaticBatchingPipeline):
    """`transformers.ImageClassificationPipeline` (task `"image-classification"`) at static shapes. Same inputs (a
    path, a URL, a `PIL.Image`, or lists of them), arguments (`top_k`, `function_to_apply`, `timeout`) and outputs
    (`[{"label", "score"}, ...]`), plus those of `StaticBatchingPipeline`. The model's image processor (its
    `preprocessor_config.json`) is loaded from the model folder by `pipeline()`."""

    model_mapping = "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"
    processors = ("image_processor",)

    def preprocess(self, image: Any, timeout: float | None = None) -> Any:
        """`ImageClassificationPipeline.preprocess` with the image decoded by `images.load_image`: a path that is
        not there is reported as missing, and every decode error names the file."""
        if not isinstance(image, (np.ndarray, torch.Tensor)):
            image = load_image(image, timeout=timeout)
        return super().preprocess(image, timeout=timeout)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Stack the processed images (all of the processor's one size)."""
        shapes = {tuple(item["pixel_values"].shape[1:]) for item in items}
        if len(shapes) != 1:
            raise ValueError(
                f"the image processor gave images of several sizes {sorted(shapes)}; set its `size` so "
                "that every image has one (static shapes)"
            )
        return {"pixel_values": torch.cat([item["pixel_values"] for item in items])}

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self.run_model(model_inputs)

    def postprocess(self, model_outputs: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
        return super().postprocess(ImageClassifierOutput(logits=model_outputs["logits"]), **kwargs)
