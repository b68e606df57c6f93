"""Batches at one static shape: a short batch padded to its full size for a compiled graph, and the real rows taken
back from what it returns (`IPUTrainer.prediction_step`, `IPUSeq2SeqTrainer`'s generation)."""

from __future__ import annotations

from typing import Any

import torch


def pad_to_static_batch(inputs: dict[str, Any], batch_size: int) -> tuple[dict[str, Any], torch.Tensor | None]:
    """Pad a batch to `batch_size` rows by repeating its last row, so the compiled graph sees one shape; returns
    the padded batch and which rows are real (None when it was full already)."""
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor) and v.dim()]
    real = tensors[0].shape[0] if tensors else batch_size
    if real >= batch_size:
        return inputs, None

    def pad(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == real:
            return torch.cat([value, value[-1:].expand(batch_size - real, *value.shape[1:])])
        return value

    return {k: pad(v) for k, v in inputs.items()}, torch.arange(batch_size) < real


def select_rows(value: Any, keep: torch.Tensor) -> Any:
    """The rows of `value` (a tensor, or tuples and lists of them) that `keep` marks: the real rows of a batch
    `pad_to_static_batch` padded; anything without those rows as it is."""
    if isinstance(value, torch.Tensor):
        return value[keep] if value.dim() and value.shape[0] == keep.shape[0] else value
    if isinstance(value, (tuple, list)):
        return type(value)(select_rows(v, keep) for v in value)
    return value
