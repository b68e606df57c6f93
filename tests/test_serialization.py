"""Serialized embedding / projection / chunked loss: same numbers as the plain modules, less saved activation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optimum_ipu.runtime.serialization import (
    SerializedEmbedding,
    SerializedLinear,
    WeightMajorLinear,
    chunked_cross_entropy,
    saved_activation_bytes,
    swap_serialized,
    weight_major_projection,
)


@pytest.mark.parametrize("factor", [1, 3, 4])
def test_serialized_embedding_matches_embedding(factor):
    torch.manual_seed(0)
    embedding = nn.Embedding(16, 5, padding_idx=2)  # 16 is not divisible by 3
    serialized = SerializedEmbedding(embedding, factor)
    assert serialized.weight is embedding.weight
    assert (serialized.num_embeddings, serialized.embedding_dim, serialized.padding_idx) == (16, 5, 2)
    ids = torch.tensor([[0, 2, 5, 15, 2], [7, 11, 12, 1, 15]])
    grad_out = torch.randn(2, 5, 5)

    expected = embedding(ids)
    (expected_grad,) = torch.autograd.grad(expected, embedding.weight, grad_out)
    actual = serialized(ids)
    (actual_grad,) = torch.autograd.grad(actual, serialized.weight, grad_out)

    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    torch.testing.assert_close(actual_grad, expected_grad)
    assert actual_grad[2].abs().sum() == 0  # the padding row gets no gradient
    plain = serialized.to_embedding()
    assert type(plain) is nn.Embedding and plain.weight is embedding.weight and plain.padding_idx == 2


@pytest.mark.parametrize("bias", [True, False])
def test_serialized_linear_matches_linear(bias):
    torch.manual_seed(0)
    linear = nn.Linear(8, 23, bias=bias)
    serialized = SerializedLinear(linear, 4)
    assert serialized.weight is linear.weight and serialized.bias is linear.bias
    assert (serialized.in_features, serialized.out_features) == (8, 23)
    x = torch.randn(3, 5, 8, requires_grad=True)
    grad_out = torch.randn(3, 5, 23)
    params = [x, *linear.parameters()]

    expected = linear(x)
    expected_grads = torch.autograd.grad(expected, params, grad_out)
    actual = serialized(x)
    actual_grads = torch.autograd.grad(actual, params, grad_out)

    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6)
    for a, e in zip(actual_grads, expected_grads, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-5)
    plain = serialized.to_linear()
    assert type(plain) is nn.Linear and plain.weight is linear.weight and plain.bias is linear.bias


def _full_loss(hidden, weight, bias, labels):
    return F.cross_entropy(F.linear(hidden, weight, bias).reshape(-1, weight.shape[0]), labels.reshape(-1))


@pytest.mark.parametrize("chunks", [1, 3, 7])
def test_chunked_cross_entropy_matches_full(chunks):
    torch.manual_seed(0)
    hidden = torch.randn(2, 10, 8, requires_grad=True)  # 20 tokens: not divisible by 3 nor 7
    weight = torch.randn(50, 8, requires_grad=True)
    bias = torch.randn(50, requires_grad=True)
    labels = torch.randint(0, 50, (2, 10))
    labels[0, :4] = -100  # ignored tokens are uneven across chunks: a mean of chunk means would differ
    labels[1, 9] = -100

    expected = _full_loss(hidden, weight, bias, labels)
    expected_grads = torch.autograd.grad(expected, [hidden, weight, bias])
    actual = chunked_cross_entropy(hidden, weight, bias, labels, chunks)
    actual_grads = torch.autograd.grad(actual, [hidden, weight, bias])

    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
    for a, e in zip(actual_grads, expected_grads, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-5)


def test_chunked_cross_entropy_all_ignored_is_nan_like_torch():
    hidden, weight = torch.randn(4, 3), torch.randn(6, 3)
    labels = torch.full((4,), -100)
    assert torch.isnan(chunked_cross_entropy(hidden, weight, None, labels, 2))
    assert torch.isnan(F.cross_entropy(F.linear(hidden, weight), labels))


def test_chunked_cross_entropy_saves_less_activation():
    torch.manual_seed(0)
    hidden = torch.randn(256, 32, requires_grad=True)
    weight = nn.Parameter(torch.randn(4096, 32))
    labels = torch.randint(0, 4096, (256,))

    full = saved_activation_bytes(lambda: _full_loss(hidden, weight, None, labels))
    chunked = saved_activation_bytes(lambda: chunked_cross_entropy(hidden, weight, None, labels, 8))
    assert full >= 256 * 4096 * 4  # at least the [tokens, vocab] fp32 log-softmax is saved
    assert chunked < 0.5 * full


def _tiny_model(kind):
    # Random weights from a config: no Hub access, a few ms to build.
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    bert = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37)
    gpt2 = GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=2)
    for config in (bert, gpt2):
        config._attn_implementation = "eager"
    torch.manual_seed(0)
    return BertForMaskedLM(bert).eval() if kind == "bert" else GPT2LMHeadModel(gpt2).eval()


def _loss_and_grads(model, ids, labels):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_swap_serialized_on_transformers_model(kind):
    model = _tiny_model(kind)
    torch.manual_seed(1)
    ids = torch.randint(0, 99, (2, 7))
    labels = ids.clone()
    labels[:, :2] = -100
    input_emb, output_emb = model.get_input_embeddings(), model.get_output_embeddings()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    logits, loss, grads = _loss_and_grads(model, ids, labels)

    restore = swap_serialized(model, embedding_factor=3, projection_factor=4)
    assert isinstance(model.get_input_embeddings(), SerializedEmbedding)
    assert isinstance(model.get_output_embeddings(), SerializedLinear)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tying survives
    swapped_state = model.state_dict()
    assert list(swapped_state) == list(state)
    for key, value in state.items():
        assert torch.equal(swapped_state[key], value), key
    swapped_logits, swapped_loss, swapped_grads = _loss_and_grads(model, ids, labels)

    torch.testing.assert_close(swapped_logits, logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(swapped_loss, loss, rtol=0, atol=1e-5)
    assert swapped_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(swapped_grads[name], grad, rtol=0, atol=1e-5, msg=name)

    restore()
    assert model.get_input_embeddings() is input_emb and model.get_output_embeddings() is output_emb
    assert output_emb.weight is input_emb.weight
    assert list(model.state_dict()) == list(state)


def test_swap_serialized_factor_one_and_unsupported_modules_are_left_alone():
    model = nn.Module()
    model.get_input_embeddings = lambda: None
    model.get_output_embeddings = lambda: nn.Identity()
    restore = swap_serialized(model, 4, 4)
    restore()
    bert = _tiny_model("bert")
    emb = bert.get_input_embeddings()
    swap_serialized(bert, 1, 1)
    assert bert.get_input_embeddings() is emb and type(bert.get_output_embeddings()) is nn.Linear


@pytest.mark.parametrize("bias", [False, True])
def test_weight_major_linear_matches_linear(bias):
    torch.manual_seed(0)
    linear = nn.Linear(48, 1000, bias=bias)
    projection = WeightMajorLinear(linear)
    assert projection.weight is linear.weight and projection.bias is linear.bias
    for shape in [(1, 48), (5, 48), (2, 3, 48)]:
        hidden = torch.randn(*shape)
        logits = projection(hidden)
        assert logits.shape == (*shape[:-1], 1000) and logits.is_contiguous()
        torch.testing.assert_close(logits, linear(hidden), rtol=1e-5, atol=1e-5)


def test_weight_major_projection_swaps_the_head_for_the_context_only():
    model = _tiny_model("gpt2")
    head, ids = model.get_output_embeddings(), torch.randint(0, 99, (3, 7))
    with torch.no_grad():
        stock = model(input_ids=ids).logits
        with weight_major_projection(model):
            assert isinstance(model.get_output_embeddings(), WeightMajorLinear)
            assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # still tied
            swapped = model(input_ids=ids).logits
    assert model.get_output_embeddings() is head
    torch.testing.assert_close(swapped, stock, rtol=1e-5, atol=1e-5)
    model.transformer.h[0].to("meta")  # a process holding the last stage: another stage's layer is not here
    with weight_major_projection(model):
        assert isinstance(model.get_output_embeddings(), WeightMajorLinear)
    model.lm_head.to("meta")  # ... and one holding another stage: its projection is not here either
    with weight_major_projection(model):
        assert model.get_output_embeddings() is head
    bert_like = nn.Module()  # no plain nn.Linear head: left alone
    bert_like.get_output_embeddings = lambda: nn.Identity()
    with weight_major_projection(bert_like):
        assert isinstance(bert_like.get_output_embeddings(), nn.Identity)
