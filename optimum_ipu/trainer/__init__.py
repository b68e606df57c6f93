"""Training with the `transformers.Trainer` interface: `IPUTrainingArguments` and `IPUTrainer`."""

from .checkpoints import last_complete_checkpoint
from .trainer import IPUTrainer
from .training_args import IPUTrainingArguments

__all__ = ["IPUTrainer", "IPUTrainingArguments", "last_complete_checkpoint"]
