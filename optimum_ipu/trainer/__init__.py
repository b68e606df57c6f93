"""Training with the `transformers.Trainer` interface: `IPUTrainingArguments`, `IPUTrainer` and their seq2seq twins."""

from .callbacks import StepTimer
from .checkpoints import last_complete_checkpoint
from .seq2seq import IPUSeq2SeqTrainer, IPUSeq2SeqTrainingArguments
from .state import IPUTrainerState
from .trainer import IPUTrainer
from .training_args import IPUTrainingArguments

__all__ = [
    "IPUSeq2SeqTrainer",
    "IPUSeq2SeqTrainingArguments",
    "IPUTrainer",
    "IPUTrainerState",
    "IPUTrainingArguments",
    "StepTimer",
    "last_complete_checkpoint",
]
