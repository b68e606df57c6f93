"""Optimum Graphcore's `optimum.graphcore.data.data_collator` module path (see `optimum_ipu.data`)."""

from ..packing.pretraining import DataCollatorForLanguageModelingWithMaxTokensMasked, pad_on_batch_axis

__all__ = ["DataCollatorForLanguageModelingWithMaxTokensMasked", "pad_on_batch_axis"]
