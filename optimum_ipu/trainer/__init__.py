"""Training with the `transformers.Trainer` interface: `IPUTrainingArguments` and `IPUTrainer`."""

from .trainer import IPUTrainer
from .training_args import IPUTrainingArguments

__all__ = ["IPUTrainer", "IPUTrainingArguments"]
