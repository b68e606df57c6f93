"""Training with the `transformers.Trainer` interface: `IPUTrainingArguments` (the trainer itself follows)."""

from .training_args import IPUTrainingArguments

__all__ = ["IPUTrainingArguments"]
