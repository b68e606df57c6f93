"""BERT pretraining collation: Optimum Graphcore's `DataCollatorForLanguageModelingWithMaxTokensMasked` (masked tokens
bounded per row) at its import paths, `pad_on_batch_axis`, and packed pretraining rows whose MLM + NSP loss equals
the stock `BertForPreTraining` loss of the same pairs run unpacked."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from optimum_ipu.packing.pretraining import (
    PackedPretrainingLoss,
    keep_at_most,
    max_num_masked_tokens,
    pack_pretraining_pairs,
    packed_pretraining_collator,
)


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return transformers.AutoTokenizer.from_pretrained(minilm_dir)


def pairs(tokenizer, count: int, seed: int = 0) -> list[dict]:
    """`count` sentence pairs of random word pieces, of random lengths, with alternating NSP labels."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        a, b = (torch.randint(1000, 20000, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g) for _ in "ab")
        encoded = tokenizer(tokenizer.decode(a), tokenizer.decode(b), truncation=True, max_length=48)
        rows.append(
            {
                "input_ids": encoded["input_ids"],
                "token_type_ids": encoded["token_type_ids"],
                "next_sentence_label": i % 2,
            }
        )
    return rows


def test_the_bound_is_mean_plus_two_deviations_rounded_up_to_16_and_capped():
    for length, p in ((128, 0.15), (512, 0.15), (384, 0.2), (64, 0.5), (16, 0.9)):
        bound = max_num_masked_tokens(length, p)
        two_sigma = length * p + 2 * math.sqrt(length * p * (1 - p))
        assert bound % 16 == 0 or bound == length
        assert min(two_sigma, length) <= bound <= length
        assert bound == length or bound - 16 < two_sigma  # the least multiple of 16 above mean + 2 std


def test_collator_masks_at_most_the_bound_never_special_tokens_and_passes_other_columns(tokenizer):
    from optimum_ipu.data import DataCollatorForLanguageModelingWithMaxTokensMasked
    from optimum_ipu.data.data_collator import DataCollatorForLanguageModelingWithMaxTokensMasked as same

    assert same is DataCollatorForLanguageModelingWithMaxTokensMasked  # both of Optimum Graphcore's paths
    torch.manual_seed(0)
    collator = DataCollatorForLanguageModelingWithMaxTokensMasked(
        48, tokenizer=tokenizer, mlm_probability=0.6, pad_to_multiple_of=48
    )
    assert collator.max_num_masked_tokens == max_num_masked_tokens(48, 0.6)
    collator.max_num_masked_tokens = 6  # a bound that bites: about 0.6 x 20 tokens are drawn in each row
    examples = pairs(tokenizer, 64)
    batch = collator(examples)
    assert isinstance(batch, dict) and batch["input_ids"].shape == (64, 48)
    assert batch["next_sentence_label"].tolist() == [e["next_sentence_label"] for e in examples]
    masked = batch["labels"] != -100
    counts = masked.sum(dim=1)
    assert counts.max() == 6 and (counts == 6).float().mean() > 0.9, counts  # bounded, and the bound is reached
    originals = torch.full((64, 48), tokenizer.pad_token_id)
    for r, e in enumerate(examples):
        originals[r, : len(e["input_ids"])] = torch.as_tensor(e["input_ids"])
    special = torch.isin(originals, torch.as_tensor(tokenizer.all_special_ids))  # [CLS], [SEP], padding
    assert not (masked & special).any()
    assert torch.equal(batch["labels"][masked], originals[masked])  # labels are the original tokens
    assert torch.equal(batch["input_ids"][~masked], originals[~masked])  # unmasked tokens untouched
    as_mask = (batch["input_ids"][masked] == tokenizer.mask_token_id).float().mean()
    assert 0.65 < as_mask < 0.95, as_mask  # 80 % [MASK]


def test_the_bound_holds_at_the_default_probability_and_keep_at_most_is_random(tokenizer):
    from optimum_ipu.data import DataCollatorForLanguageModelingWithMaxTokensMasked

    collator = DataCollatorForLanguageModelingWithMaxTokensMasked(48, tokenizer=tokenizer, pad_to_multiple_of=48)
    batch = collator(pairs(tokenizer, 256, seed=1))
    assert (batch["labels"] != -100).sum(dim=1).max() <= collator.max_num_masked_tokens
    all_masked = torch.ones(2000, 10, dtype=torch.bool)
    kept = keep_at_most(all_masked, 3, torch.Generator().manual_seed(0))
    assert (kept.sum(dim=1) == 3).all()
    share = kept.float().mean(dim=0)  # every position as likely to be kept
    assert ((share - 0.3).abs() < 0.05).all(), share


def test_pad_on_batch_axis_repeats_rows_to_the_batch_size():
    from optimum_ipu.data import pad_on_batch_axis

    collate = pad_on_batch_axis(5)(lambda rows: {"x": torch.tensor(rows), "y": torch.tensor(rows) * 2})
    batch = collate([1, 2])
    assert batch["x"].tolist() == [1, 2, 1, 2, 1] and batch["y"].tolist() == [2, 4, 2, 4, 2]


def test_packed_pretraining_loss_equals_the_stock_loss_of_the_pairs_unpacked(tokenizer):
    config = transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(config).eval()
    examples = pairs(tokenizer, 6, seed=2)
    packed = pack_pretraining_pairs(
        {k: [e[k] for e in examples] for k in ("input_ids", "token_type_ids", "next_sentence_label")}, 64
    )
    rows = [{k: packed[k][r] for k in packed} for r in range(len(packed["input_ids"]))]
    assert len(rows) < len(examples)  # some rows hold more than one pair
    collator = packed_pretraining_collator(model, tokenizer, 64, max(map(len, packed["labels"])), 0.3)
    torch.manual_seed(1)
    batch = collator(rows)
    labels = batch.pop("labels")
    assert labels.shape == (len(rows), 64, 2)
    assert (labels[..., 1] != -100).sum() == len(examples)  # one NSP label per pair, at its [CLS]
    assert (batch["input_ids"][labels[..., 1] != -100] == tokenizer.cls_token_id).all()
    with torch.no_grad():
        packed_loss = PackedPretrainingLoss(model)(model(**batch), labels)
    # the same pairs, with the same masked tokens, one per row, through the stock model and its own loss
    unpacked = {k: torch.full((len(examples), 48), v) for k, v in (("input_ids", 0), ("token_type_ids", 0))}
    unpacked["attention_mask"] = torch.zeros(len(examples), 48, dtype=torch.long)
    mlm, nsp = torch.full((len(examples), 48), -100), torch.zeros(len(examples), dtype=torch.long)
    for r, (indices, lengths) in enumerate(zip(packed["feature_index"], packed["sequence_lengths"], strict=True)):
        start = 0
        for index, length in zip(indices, lengths, strict=True):
            span = slice(start, start + length)
            unpacked["input_ids"][index, :length] = batch["input_ids"][r, span]
            unpacked["token_type_ids"][index, :length] = batch["token_type_ids"][r, span]
            unpacked["attention_mask"][index, :length] = 1
            mlm[index, :length], nsp[index] = labels[r, span, 0], labels[r, start, 1]
            start += length
    assert nsp.tolist() == [e["next_sentence_label"] for e in examples]
    with torch.no_grad():
        stock = model(**unpacked, labels=mlm, next_sentence_label=nsp).loss
    assert packed_loss.item() == pytest.approx(stock.item(), rel=1e-5, abs=1e-5)


def test_a_model_without_a_next_sentence_head_is_refused_in_one_line(tokenizer):
    model = transformers.BertForMaskedLM(
        transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    )
    with pytest.raises(ValueError, match="BertForMaskedLM has no next-sentence head"):
        PackedPretrainingLoss(model)
