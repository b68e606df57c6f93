"""The arithmetic of the output projection shared by the stages (`optimum_ipu.runtime.stages.head`): the vocabulary
rows each stage holds, and the cross-entropy combined from the shares' numbers, against `F.cross_entropy` on the whole
logits; and when a shared head is refused. (The processes: tests/distributed/test_split_head.py.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from transformers import PretrainedConfig

from optimum_ipu.runtime.stages.head import (
    CHUNK_BYTES,
    CHUNK_TOKENS,
    chunk_words,
    chunked_share_numbers,
    combined_loss,
    share_numbers,
    share_rows,
    shared_head_hint,
    split_head_refusal,
)


@given(vocabulary=st.integers(1, 5000), splits=st.lists(st.integers(0, 6), min_size=1, max_size=8))
def test_the_shares_cover_the_vocabulary_in_order_as_the_splits_weigh(vocabulary, splits):
    if not sum(splits):
        splits = [*splits[:-1], 1]
    rows = share_rows(vocabulary, splits)
    assert len(rows) == len(splits)
    assert [r.start for r in rows[1:]] == [r.stop for r in rows[:-1]]  # consecutive, nothing twice
    assert rows[0].start == 0 and rows[-1].stop == vocabulary
    total = sum(splits)
    for r, count in zip(rows, splits, strict=True):
        assert abs(len(r) - vocabulary * count / total) < 1 + 1e-9  # each share within a row of its part
        if not count:
            assert not len(r)


def shares_numbers(logits: torch.Tensor, labels: torch.Tensor, splits: list[int]) -> torch.Tensor:
    """The numbers of every share that holds rows, from the whole logits."""
    shares = [rows for rows in share_rows(logits.shape[1], splits) if len(rows)]
    return torch.stack([share_numbers(logits[:, rows.start : rows.stop], labels, rows) for rows in shares])


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.integers(1, 40),
    vocabulary=st.integers(2, 300),
    splits=st.lists(st.integers(0, 4), min_size=1, max_size=5),
    ignored=st.floats(0.0, 0.9),
    scale=st.floats(0.1, 30.0),
    seed=st.integers(0, 2**16),
)
def test_the_combined_loss_is_the_cross_entropy_of_the_whole_logits(tokens, vocabulary, splits, ignored, scale, seed):
    if not sum(splits):
        splits = [*splits[:-1], 1]
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, vocabulary, generator=generator) * scale
    labels = torch.randint(0, vocabulary, (tokens,), generator=generator)
    labels[torch.rand(tokens, generator=generator) < ignored] = -100
    labels[0] = labels[0].clamp(min=0)  # at least one labelled token (all ignored: NaN, below)
    want = F.cross_entropy(logits, labels, ignore_index=-100)
    got = combined_loss(shares_numbers(logits, labels, splits), labels)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_a_batch_without_a_labelled_token_gives_nan_as_the_cross_entropy_does():
    logits, labels = torch.randn(3, 10), torch.full((3,), -100)
    assert torch.isnan(F.cross_entropy(logits, labels, ignore_index=-100))
    assert torch.isnan(combined_loss(shares_numbers(logits, labels, [1, 1]), labels))


class WithHead(nn.Module):
    def __init__(self, head: nn.Module, **config: Any) -> None:
        super().__init__()
        self.head = head
        self.config = PretrainedConfig(**config)

    def get_output_embeddings(self) -> nn.Module:
        return self.head


@pytest.mark.parametrize(
    ("splits", "stages", "loss_kind", "head", "reason"),
    [
        (None, 2, "causal", nn.Linear(4, 10), "not asked"),
        ([1, 1, 1], 2, "causal", nn.Linear(4, 10), "it has 3 entries for 2 stages on processes"),
        ([1, 1], 2, "", nn.Linear(4, 10), "the model's loss is not a cross-entropy over the vocabulary"),
        ([1, 1], 2, "causal", nn.Embedding(10, 4), "its output projection (Embedding) is not a linear layer"),
        ([1, 1], 2, "causal", nn.Linear(4, 10), ""),
        ([3, 1], 2, "masked", nn.Linear(4, 10), ""),
    ],
)
def test_a_shared_head_is_refused_where_the_shares_cannot_compute_the_loss(splits, stages, loss_kind, head, reason):
    assert split_head_refusal(WithHead(head), splits, stages, loss_kind) == reason


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ({"final_logit_softcapping": 30.0}, "config.final_logit_softcapping"),  # Gemma 2's tanh cap
        ({"logit_scale": 0.0625}, "config.logit_scale"),  # Cohere's
        ({"logits_scaling": 8.0}, "config.logits_scaling"),  # Granite's
        ({"final_logit_softcapping": None, "logit_scale": 1.0}, None),  # set, but changing nothing
    ],
)
def test_a_shared_head_is_refused_for_a_model_that_changes_its_logits_after_the_projection(config, reason):
    refusal = split_head_refusal(WithHead(nn.Linear(4, 10), **config), [1, 1], 2, "causal")
    want = f"the model changes its logits after the projection ({reason})" if reason else ""
    assert refusal == want


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(1, 70),
    width=st.integers(1, 16),
    words=st.integers(1, 50),
    word_chunk=st.integers(1, 60),
    token_chunk=st.integers(1, 80),
)
def test_a_share_computed_in_chunks_of_words_and_tokens_gives_the_numbers_of_its_whole_logits(
    tokens, width, words, word_chunk, token_chunk
):
    generator = torch.Generator().manual_seed(tokens * 1000 + words)
    hidden, weight = torch.randn(tokens, width, generator=generator), torch.randn(words, width, generator=generator)
    bias = torch.randn(words, generator=generator)
    rows = range(7, 7 + words)  # the share's rows within a vocabulary of 7 + words + 3
    labels = torch.randint(0, 7 + words + 3, (tokens,), generator=generator)
    want = share_numbers(F.linear(hidden, weight, bias), labels, rows)
    got = chunked_share_numbers(hidden, weight, bias, labels, rows, words=word_chunk, tokens=token_chunk)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    want = share_numbers(F.linear(hidden, weight), labels, rows)  # the default chunks, without a bias
    torch.testing.assert_close(chunked_share_numbers(hidden, weight, None, labels, rows), want)


def test_the_chunks_hold_about_8_mib_of_logits_over_1024_words_or_more():
    assert chunk_words(1016) == 2064  # the benchmark's micro-batch of 8 x 127 tokens
    assert chunk_words(1016) * 1016 * 4 <= CHUNK_BYTES < (chunk_words(1016) + 1) * 1016 * 4
    assert chunk_words(CHUNK_TOKENS) == 1024  # the most tokens a chunk takes
    assert chunk_words(10**9) == 1


def test_the_last_stage_hints_at_sharing_a_head_that_is_a_quarter_of_its_parameters_or_more():
    wide, narrow = WithHead(nn.Linear(8, 400)), WithHead(nn.Linear(8, 4))
    wide.layer = narrow.layer = nn.Linear(32, 32)  # the stage's one layer: 1,056 parameters
    hint = shared_head_hint(wide, 2, "causal")  # 3,600 of 4,656
    assert hint.startswith("the output projection is 77% of the last stage's parameters") and "[1, 1]" in hint
    assert shared_head_hint(narrow, 2, "causal") == ""  # 36 of 1,092
    assert shared_head_hint(wide, 2, "") == ""  # no vocabulary loss: nothing to share
    wide.layer.to("meta")  # another stage's layer, not held here: the head is all this stage holds
    assert shared_head_hint(wide, 2, "causal").startswith("the output projection is 100%")
