"""`optimum_ipu.data`: Optimum Graphcore's `optimum.graphcore.data` (its data collators), at the same path.

`DataCollatorForLanguageModelingWithMaxTokensMasked` and `pad_on_batch_axis` live in `optimum_ipu.packing.pretraining`
beside the packed pretraining collator and loss; `from optimum.graphcore.data import ...` becomes
`from optimum_ipu.data import ...`.
"""

from ..packing.pretraining import DataCollatorForLanguageModelingWithMaxTokensMasked, pad_on_batch_axis

__all__ = ["DataCollatorForLanguageModelingWithMaxTokensMasked", "pad_on_batch_axis"]
