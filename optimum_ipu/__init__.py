"""optimum-ipu: the Optimum Graphcore programming model on the hardware people have.

`IPUConfig` is imported eagerly (pure Python); everything that needs torch or transformers is loaded
on first use, so `from optimum_ipu import IPUConfig` stays fast and torch-free.
"""

from __future__ import annotations

import importlib
from typing import Any

from .config import IPUConfig
from .config_validation import bundled_config_ids
from .errors import IncompatibleIPUConfigError
from .models.plans import AUTO_CLASSES

__version__ = "0.1.0"

# public name -> module that defines it (imported lazily)
_LAZY: dict[str, str] = {
    "to_pipelined": ".models.pipelined",
    "PipelinedModel": ".models.pipelined",
    "registered_classes": ".models.plans",
    "position_offset": ".models.plans",
    "Engine": ".runtime.engine",
    "IPUTrainingArguments": ".trainer.training_args",
    "IPUTrainer": ".trainer.trainer",
    "IPUTrainerState": ".trainer.state",
    "IPUSeq2SeqTrainer": ".trainer.seq2seq",
    "IPUSeq2SeqTrainingArguments": ".trainer.seq2seq",
    "last_complete_checkpoint": ".trainer.checkpoints",
    "pipeline": ".pipelines.factory",
    **{name: ".models.auto" for name in AUTO_CLASSES},
}
# Optimum Graphcore's `optimum.graphcore.modeling_utils` helpers, also at the top level
_LAZY.update({name: ".modeling_utils" for name in ("get_layer_ipu", "split_encoder_decoder_ipu_config")})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    if name.startswith("Pipelined"):  # Optimum Graphcore's top-level class names, from the stage plan registry
        return importlib.import_module(".models.class_modules", __name__).resolve_anywhere(name)
    raise AttributeError(f"module 'optimum_ipu' has no attribute {name!r}")


__all__ = ["IPUConfig", "IncompatibleIPUConfigError", "bundled_config_ids", "__version__", *_LAZY]
