"""Sequence packing (`optimum_ipu.packing`): several short tokenized features share one row of `max_seq_length` tokens.

SQuAD or GLUE features tokenized without padding are mostly far shorter than `max_seq_length`; padding each to a
full row spends most of the compute on padding. Packing puts several features in one row, keeping the static
shapes every graph here needs, with the numbers of running each feature alone:

- `pack_features` chooses the rows (best-fit decreasing bin packing) and concatenates each row's features:
  `input_ids`, `token_type_ids`, `position_ids` restarted at 0 for every sequence, and the labels moved to
  the row: QA `start_positions` / `end_positions` shifted by the sequence's offset in the row, classification
  `labels` one per sequence. It also records `feature_index` and `sequence_lengths` per row, for `unpack_logits`.
- `PackedDataCollator` pads rows to `max_seq_length` and masks attention block-diagonally: a token attends to
  the tokens of its own sequence only (padding to padding, so that no row of the mask is empty).
  `transformers`' BERT-family models take a ready 4-D mask as it is (`masking_utils` returns it unchanged):
  - `attention="dense"` (default; the `eager` and `sdpa` implementations): an additive 4-D `attention_mask`
    `(batch, 1, seq, seq)`, 0 or the minimum of its float type (the model's: float32 by default), which both
    accept (`eager` adds it to the scores; `sdpa` takes a float mask).
  - `attention="flex"` (`flex_attention`): no mask but `packed_sequence_ids` `(batch, seq)`, each token's
    sequence in its row (0 for padding). A `BlockMask` closes over tensors of the model's device, so it is made
    there at step time: `IPUTrainer` replaces the ids by `packed_block_mask(ids)` when it moves a batch to the
    device (`with_packed_block_mask` does the same for a hand-written loop). Flex attention skips the blocks of
    128 x 128 tokens that lie wholly between two sequences, and no `seq x seq` mask travels from the host.
    Its backward runs on CUDA (and other accelerators), not on CPU: PyTorch 2.13 has no flex attention backward
    there, eager or compiled, so flex packing trains on a GPU; on a CPU it evaluates only (forward).
  Flash attention kernels take no 4-D mask or `BlockMask`: not supported (`check_packing_support` says so).
  `PackedDataCollator(attention=packing_attention(model))` picks the kind a model takes.
- The labels of a packed batch are one tensor `labels` of shape `(batch, max_sequences_per_row, columns)`, one
  slot per sequence: `[start, end, start_position, end_position]` (QA), `[start, end, label]` (classification)
  or `[start, end, y_1, ..., y_k]` (multi-label classification: a multi-hot vector a sequence, with
  `problem_type="multi_label_classification"`; binary cross-entropy per sequence), `start:end` being the
  sequence's tokens in the row; empty slots, and sequences without a label, are all -100.
  `packed_question_answering_loss` and `PackedSequenceClassificationLoss` read it; both have the signature of
  `transformers.Trainer`'s `compute_loss_func`, so the stock model's forward runs unchanged (no labels reach it).

Per-sequence losses equal those of each feature run alone at its own length: a QA sequence's cross-entropy is
taken over its own tokens (the logits of the other sequences and of padding are masked out), a classification
sequence's logits come from the model's own head applied to the hidden state of its first token ([CLS]).

Modules: `binpack` (which features share a row, and back), `masks` (support check, dense and flex masks),
`collator` (`PackedDataCollator`, `prepare_packed_training`), `losses` (per-sequence losses), `inference` (packed
prediction: `predict_packed_classification`, `predict_packed_question_answering`), `pretraining` (BERT
MLM + NSP: Optimum Graphcore's `DataCollatorForLanguageModelingWithMaxTokensMasked`, packed pairs and their loss).
Scripts call `prepare_packed_training`; the rest is public for hand-written loops.
"""

from .binpack import IGNORE_INDEX, QA_COLUMNS, pack_features, pack_sequences, unpack_logits
from .collator import PackedDataCollator, PackedTraining, prepare_packed_training
from .inference import predict_packed_classification, predict_packed_question_answering
from .losses import PackedSequenceClassificationLoss, packed_question_answering_loss, sequence_classification_logits
from .masks import (
    PACKED_SEQUENCE_IDS,
    PACKING_ATTENTIONS,
    check_packing_support,
    packed_attention_mask,
    packed_block_mask,
    packing_attention,
    with_packed_block_mask,
)
from .pretraining import (
    DataCollatorForLanguageModelingWithMaxTokensMasked,
    PackedPretrainingCollator,
    PackedPretrainingLoss,
    max_num_masked_tokens,
    pack_pretraining_pairs,
    packed_pretraining_collator,
)

__all__ = [
    "IGNORE_INDEX",
    "QA_COLUMNS",
    "pack_sequences",
    "pack_features",
    "unpack_logits",
    "PACKING_ATTENTIONS",
    "PACKED_SEQUENCE_IDS",
    "check_packing_support",
    "packing_attention",
    "packed_attention_mask",
    "packed_block_mask",
    "with_packed_block_mask",
    "PackedDataCollator",
    "predict_packed_classification",
    "predict_packed_question_answering",
    "PackedTraining",
    "prepare_packed_training",
    "packed_question_answering_loss",
    "sequence_classification_logits",
    "PackedSequenceClassificationLoss",
    "DataCollatorForLanguageModelingWithMaxTokensMasked",
    "max_num_masked_tokens",
    "pack_pretraining_pairs",
    "PackedPretrainingCollator",
    "packed_pretraining_collator",
    "PackedPretrainingLoss",
]
