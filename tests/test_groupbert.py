"""GroupBERT (`optimum_ipu.models.groupbert`): Optimum Graphcore's names and parameter names, `transformers`' auto
classes, a layer checked against the paper's equations written out here, padding that changes nothing, and the
pipelined model equal to the stock one (the registry's generated tests cover every class and layout)."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
import transformers
from optimum_ipu.models.groupbert import GroupBertConfig, GroupBertForPreTraining, GroupBertModel

from optimum_ipu import IPUConfig, to_pipelined

from .tiny_models import tiny_config, tiny_inputs, tiny_model

# `optimum/graphcore/models/groupbert/__init__.py`: what it exported and the auto class each was registered with
OG_EXPORTS = {
    "GroupBertModel": "AutoModel",
    "GroupBertForPreTraining": "AutoModelForPreTraining",
    "GroupBertForMaskedLM": "AutoModelForMaskedLM",
    "GroupBertForMultipleChoice": "AutoModelForMultipleChoice",
    "GroupBertForQuestionAnswering": "AutoModelForQuestionAnswering",
    "GroupBertForTokenClassification": "AutoModelForTokenClassification",
    "GroupBertForSequenceClassification": "AutoModelForSequenceClassification",
}
# One layer's parameters as Optimum Graphcore's modules named them (groupbert_convolution.py, groupbert_ffn.py,
# groupbert_attention.py), so that its checkpoints (`Graphcore/groupbert-base-uncased`) load by name.
LAYER_PARAMETERS = {
    "convolution.prenorm": ("weight", "bias"),
    "convolution.glu": ("weight", "bias"),
    "convolution.groupconv": ("weight", "bias"),
    "convolution.conv_norm": ("weight", "bias"),
    "convolution.output_projection": ("weight", "bias"),
    "attention.LayerNorm": ("weight", "bias"),
    "attention.self.query": ("weight", "bias"),
    "attention.self.key": ("weight", "bias"),
    "attention.self.value": ("weight", "bias"),
    "attention.output.dense": ("weight", "bias"),
    **{f"intermediate_{n}.{m}": ("weight", "bias") for n in ("first", "second") for m in ("LayerNorm", "dense")},
    **{
        f"output_{n}.{m}": ("weight", "bias")
        for n in ("first", "second")
        for m in ("grouped_matmul", "dense_output_projection")
    },
}


def test_optimum_graphcores_names_and_auto_classes(tmp_path):
    groupbert = importlib.import_module("optimum_ipu.models.groupbert")
    config = tiny_config("groupbert")
    inputs = {k: v for k, v in tiny_inputs("GroupBertForMaskedLM").items() if k != "labels"}
    for name, auto_name in OG_EXPORTS.items():
        model_class = getattr(groupbert, name)
        assert getattr(transformers, auto_name)._model_mapping[GroupBertConfig] is model_class
    model = groupbert.GroupBertForMaskedLM(config).eval()
    model.save_pretrained(tmp_path)
    assert transformers.AutoConfig.from_pretrained(tmp_path).model_type == "groupbert"
    loaded = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is groupbert.GroupBertForMaskedLM
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits, rtol=0, atol=0)


def test_parameter_names_and_shapes_are_optimum_graphcores():
    config = tiny_config("groupbert")
    model = GroupBertForPreTraining(config)
    layer = {k.removeprefix("bert.encoder.layer.0."): v for k, v in model.state_dict().items() if ".layer.0." in k}
    assert set(layer) == {f"{m}.{p}" for m, ps in LAYER_PARAMETERS.items() for p in ps}
    h, i, k = config.hidden_size, config.intermediate_size, config.conv_kernel_size
    assert layer["convolution.glu.weight"].shape == (2 * h, h)
    assert layer["convolution.groupconv.weight"].shape == (h, config.conv_group_size, k)
    assert layer["output_first.grouped_matmul.weight"].shape == (h, i // config.ffn_groups, 1)
    outside = {k for k in model.state_dict() if ".layer." not in k}
    assert {"bert.encoder.LayerNorm.weight", "bert.pooler.dense.weight", "cls.seq_relationship.weight"} <= outside


def _reference_layer(layer, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """GroupBERT's layer from its equations, with plain tensor algebra (no module's forward)."""

    def norm(module, t):
        return F.layer_norm(t, t.shape[-1:], module.weight, module.bias, module.eps)

    def linear(module, t):
        return t @ module.weight.T + module.bias

    c = layer.convolution
    g = linear(c.glu, norm(c.prenorm, x))
    half = g.shape[-1] // 2
    gated = g[..., half:] * torch.sigmoid(g[..., :half]) * keep[..., None]
    w = c.groupconv.weight  # (out, in / groups, kernel): channel o sees group o // (out / groups)
    groups, pad = c.groupconv.groups, w.shape[-1] // 2
    windows = F.pad(gated, (0, 0, pad, pad)).unfold(1, w.shape[-1], 1)  # (batch, seq, hidden, kernel)
    per_group = windows.reshape(*windows.shape[:2], groups, -1, w.shape[-1])
    per_weight = w.reshape(groups, -1, *w.shape[1:])
    conv = torch.einsum("bsgck,gock->bsgo", per_group, per_weight).flatten(2) + c.groupconv.bias
    x = x + linear(c.output_projection, F.silu(norm(c.conv_norm, conv)))

    def ffn(intermediate, output, t):
        up = F.gelu(linear(intermediate.dense, norm(intermediate.LayerNorm, t)))
        wd = output.grouped_matmul.weight[..., 0]  # (hidden, intermediate / groups)
        ups = up.reshape(*up.shape[:2], output.grouped_matmul.groups, -1)
        down = torch.einsum("bsgc,goc->bsgo", ups, wd.reshape(output.grouped_matmul.groups, -1, wd.shape[-1]))
        return t + linear(output.dense_output_projection, down.flatten(2) + output.grouped_matmul.bias)

    x = ffn(layer.intermediate_first, layer.output_first, x)
    a = layer.attention
    y = norm(a.LayerNorm, x)
    heads = a.self.num_heads

    def split(t):
        return t.reshape(*t.shape[:2], heads, -1).transpose(1, 2)

    q, k_, v = split(linear(a.self.query, y)), split(linear(a.self.key, y)), split(linear(a.self.value, y))
    scores = q @ k_.transpose(-1, -2) / q.shape[-1] ** 0.5 + (1 - keep[:, None, None, :]) * -1e9
    context = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)
    x = x + linear(a.output.dense, context)
    return ffn(layer.intermediate_second, layer.output_second, x)


def test_a_layer_computes_groupberts_equations():
    torch.manual_seed(0)
    config = tiny_config("groupbert")
    model = GroupBertModel(config).eval()
    x = torch.randn(2, 8, config.hidden_size)
    keep = torch.ones(2, 8)
    keep[1, 5:] = 0
    additive = (1.0 - keep[:, None, None, :]) * torch.finfo(x.dtype).min
    with torch.no_grad():
        got = model.encoder.layer[0](x, additive, keep[..., None])
        expected = _reference_layer(model.encoder.layer[0], x, keep)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1, :5], expected[1, :5])  # padded rows: their values are not used


def test_padding_changes_no_unpadded_output():
    """The convolution zeroes padded positions first: a row's tokens give the same states with padding after them."""
    model = tiny_model("GroupBertModel")
    ids = torch.randint(3, 99, (1, 6))
    padded = torch.cat([ids, torch.full((1, 2), 5)], dim=1)
    with torch.no_grad():
        alone = model(input_ids=ids).last_hidden_state
        with_padding = model(input_ids=padded, attention_mask=torch.tensor([[1] * 6 + [0, 0]])).last_hidden_state
    torch.testing.assert_close(with_padding[:, :6], alone)


def test_config_refuses_groups_that_do_not_divide():
    with pytest.raises(ValueError, match="hidden_size 32 must divide by conv_group_size 12"):
        GroupBertConfig(hidden_size=32, num_attention_heads=2, intermediate_size=36, conv_group_size=12)
    with pytest.raises(ValueError, match="conv_kernel_size 4 must be odd"):
        GroupBertConfig(hidden_size=32, num_attention_heads=2, intermediate_size=36, conv_kernel_size=4)


def test_pretraining_on_two_stages_equals_one_and_recomputes(tmp_path):
    model, inputs = tiny_model("GroupBertForPreTraining"), tiny_inputs("GroupBertForPreTraining")
    expected = model(**inputs).loss
    expected.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=[1, 3], recompute_checkpoint_every_layer=True))
    pipelined.parallelize().train()
    loss = pipelined(**inputs).loss
    loss.backward()
    torch.testing.assert_close(loss, expected)
    for name, grad in grads.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, msg=name)
