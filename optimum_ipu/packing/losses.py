"""Per-sequence losses of packed rows, with the signature of `transformers.Trainer`'s `compute_loss_func`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.loss.loss_utils import ForSequenceClassificationLoss

from ..models.plans import plan_for_model, registered_plans
from .binpack import IGNORE_INDEX


def _present(labels: torch.Tensor) -> torch.Tensor:
    return labels[..., 0] != IGNORE_INDEX


def _sequence_count(labels: torch.Tensor, num_items_in_batch: Any) -> torch.Tensor | int:
    """The sequences a loss is averaged over: this batch's labelled ones, or, as `Trainer` counts items over the
    accumulated batches (non -100 entries of `labels`), that count over the entries of a slot."""
    if num_items_in_batch is None:
        return _present(labels).sum().clamp(min=1)
    return num_items_in_batch / labels.shape[-1]


def packed_question_answering_loss(
    outputs: Mapping[str, torch.Tensor], labels: torch.Tensor, num_items_in_batch: Any = None
) -> torch.Tensor:
    """The QA loss of packed rows: for each sequence, `(CE(start) + CE(end)) / 2` over its own tokens, averaged
    over the sequences (the mean over a batch of the same features run alone). A `compute_loss_func`.

    Args:
        outputs (`Mapping[str, torch.Tensor]`): the model's outputs, with `start_logits` and `end_logits`
            `(batch, seq)`.
        labels (`torch.Tensor`): `(batch, slots, 4)` from `PackedDataCollator`.
        num_items_in_batch (*optional*): `Trainer`'s count of non -100 label entries over the accumulated batches;
            the sum of losses is divided by the sequences it counts. Without it, the mean over this batch.
    """
    positions = torch.arange(outputs["start_logits"].shape[-1], device=labels.device)
    present = _present(labels)
    in_span = (positions >= labels[..., :1]) & (positions < labels[..., 1:2])  # (batch, slots, seq)
    in_span |= ~present[..., None]  # empty slots keep finite logits; their targets are ignored
    total = 0.0
    for logits, targets in ((outputs["start_logits"], labels[..., 2]), (outputs["end_logits"], labels[..., 3])):
        logits = logits.float()[:, None, :].expand(in_span.shape)
        masked = logits.masked_fill(~in_span, torch.finfo(torch.float32).min)
        total = total + F.cross_entropy(
            masked.reshape(-1, masked.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
        )
    return total / 2 / _sequence_count(labels, num_items_in_batch)


def sequence_classification_logits(model: nn.Module, hidden_states: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Logits of every labelled sequence of packed rows: the model's own classification head applied to the
    last hidden state of each sequence's first token ([CLS]), as the model does for position 0 of a row.

    Args:
        model (`nn.Module`): a `...ForSequenceClassification` whose stage plan has a `sequence_head` (BERT,
            RoBERTa, DistilBERT).
        hidden_states (`torch.Tensor`): the last hidden states `(batch, seq, hidden)`.
        labels (`torch.Tensor`): `(batch, slots, 3)` from `PackedDataCollator` (their sequence starts are read).

    Returns:
        `torch.Tensor`: `(sequences, num_labels)`, labelled slots in row-major order.
    """
    rows, slots = _present(labels).nonzero(as_tuple=True)
    first = hidden_states[rows, labels[rows, slots, 0].long()][:, None, :]  # (sequences, 1, hidden)
    name, plan = type(model).__name__, plan_for_model(model)
    if plan.sequence_head is None or not name.endswith("ForSequenceClassification"):
        supported = sorted(c for p in registered_plans() if p.sequence_head for c in p.classes if "Sequence" in c)
        raise ValueError(
            f"sequence classification with packing: {name} is not supported ({', '.join(supported)} are); train it "
            "without packing"
        )
    return plan.sequence_head(model, first)


class PackedSequenceClassificationLoss:
    """The classification loss of packed rows, one label (or multi-hot vector) a sequence (a `compute_loss_func`).

    The model runs unchanged with `output_hidden_states=True` (pass it in the batch, or set
    `model.config.output_hidden_states = True`); `sequence_classification_logits` gives each sequence's logits.
    Cross-entropy for class labels, mean squared error for regression (`num_labels == 1`), binary cross-entropy
    with logits for `problem_type="multi_label_classification"` (each feature's `labels` a multi-hot vector of
    `num_labels` values; the mean over the sequences and their classes, as the model's `BCEWithLogitsLoss` and
    Optimum Graphcore's packed-BERT notebook), as the model's own loss, averaged over the sequences. Unpacked
    batches (labels of one value or vector per example, as in evaluation) get the model's own loss.

    Args:
        model (`nn.Module`): the model whose head is applied (the stock model; a pipelined model's `.model`).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
        if labels.dim() != 3:
            # Unpacked examples (evaluation): `Trainer` hands every batch's labels to its `compute_loss_func`,
            # so those get the model's own loss, computed from its logits
            return ForSequenceClassificationLoss(labels, outputs["logits"], self.model.config)
        hidden = getattr(outputs, "hidden_states", None)
        if hidden is None:
            raise ValueError(
                "packed classification needs the model's hidden states: call it with output_hidden_states=True"
            )
        logits = sequence_classification_logits(self.model, hidden[-1], labels).float()
        config = self.model.config
        if config.problem_type == "multi_label_classification":
            targets = labels[..., 2:][_present(labels)].float()
            if targets.shape[-1] != config.num_labels:
                raise ValueError(
                    f"multi-label packing: the label slots hold {targets.shape[-1]} values a sequence and the model "
                    f"has num_labels={config.num_labels}; give each feature a multi-hot vector of num_labels values"
                )
            # the model's BCEWithLogitsLoss is the mean over sequences x classes: the sum / classes / sequences
            losses = F.binary_cross_entropy_with_logits(logits, targets, reduction="sum") / config.num_labels
            return losses / _sequence_count(labels, num_items_in_batch)
        targets = labels[..., 2][_present(labels)]
        if config.num_labels == 1:
            losses = F.mse_loss(logits.squeeze(-1), targets.float(), reduction="sum")
        else:
            losses = F.cross_entropy(logits, targets.long(), reduction="sum")
        return losses / _sequence_count(labels, num_items_in_batch)
