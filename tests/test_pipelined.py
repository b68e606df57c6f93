"""Pipelined models: parity with stock `transformers` for every registered class, generated from the registry."""

from __future__ import annotations

import copy

import pytest
import torch

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig, to_pipelined
from optimum_ipu.models.plans import VOCABULARY_LOSS, registered_classes

from .tiny_models import scalar_objective, tiny_inputs, tiny_model

LAYOUTS = {
    "one-stage": {"layers_per_ipu": [-1]},
    "wildcards-empty-first": {"layers_per_ipu": [0, -1, -1]},
    "explicit-empty-middle": {"layers_per_ipu": [1, 0, 3]},
    "recompute": {"layers_per_ipu": [2, -1], "recompute_checkpoint_every_layer": True},
    "serialized": {
        "layers_per_ipu": [-1, -1],
        "embedding_serialization_factor": 3,
        "projection_serialization_factor": 2,
    },
}


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("class_name", registered_classes())
def test_outputs_and_gradients_equal_stock(class_name, layout):
    stock = tiny_model(class_name).train()
    pipelined = to_pipelined(copy.deepcopy(stock), IPUConfig(**LAYOUTS[layout]), parallelize=True).train()
    inputs = tiny_inputs(class_name)
    expected, got = stock(**inputs), pipelined(**inputs)
    # projection + loss in chunks: training never builds the full logits (the loss must still match)
    chunked = layout == "serialized" and class_name in VOCABULARY_LOSS
    assert not chunked or got.get("logits") is None
    for key, value in expected.items():
        if isinstance(value, torch.Tensor) and not (chunked and key == "logits"):
            torch.testing.assert_close(got[key], value, atol=1e-5, rtol=1e-5, msg=f"{class_name} output {key}")
    scalar_objective(expected).backward()
    scalar_objective(got).backward()
    want, have = _grads(stock), _grads(pipelined.model)
    assert want.keys() == have.keys() and want
    for name in want:
        torch.testing.assert_close(have[name], want[name], atol=1e-5, rtol=1e-5, msg=f"{class_name} grad {name}")
    assert len(pipelined.stage_layout()) == len(LAYOUTS[layout]["layers_per_ipu"])


@pytest.mark.parametrize("class_name", registered_classes())
def test_deparallelize_round_trips_state_dict(class_name, tmp_path):
    stock = tiny_model(class_name)
    before = {k: v.clone() for k, v in stock.state_dict().items()}
    modules_before = dict(stock.named_modules())
    config = IPUConfig(
        layers_per_ipu=[0, -1],
        recompute_checkpoint_every_layer=True,
        embedding_serialization_factor=2,
        projection_serialization_factor=3,
    )
    pipelined = to_pipelined(stock, config, parallelize=True)
    model = pipelined.deparallelize()
    assert model is stock and dict(model.named_modules()) == modules_before
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    renamed = hasattr(type(model), "is_activation_checkpointing")  # transformers 5.2x renamed it
    assert not (model.is_activation_checkpointing if renamed else model.is_gradient_checkpointing)


def test_stage_layout_and_modules():
    pipelined = to_pipelined(tiny_model("BertForQuestionAnswering"), IPUConfig(layers_per_ipu=[0, -1, -1]))
    assert pipelined.describe_layout() == (
        "BertForQuestionAnswering (4 layers):\n  ipu0: embeddings\n  ipu1: layers 0-1\n  ipu2: layers 2-3 + heads"
    )
    stages = pipelined.stage_modules()
    assert stages[0] == ["bert.embeddings"]
    assert stages[1] == ["bert.encoder.layer.0", "bert.encoder.layer.1"]
    assert stages[2][:2] == ["bert.encoder.layer.2", "bert.encoder.layer.3"] and "qa_outputs" in stages[2]
    every = {m for stage in stages for m in stage}
    params = {n for n, _ in pipelined.model.named_parameters()}
    assert all(any(p.startswith(m + ".") for m in every) for p in params), "every parameter belongs to a stage"


def test_t5_counts_encoder_and_decoder_layers():
    pipelined = to_pipelined(tiny_model("T5ForConditionalGeneration"), IPUConfig(layers_per_ipu=[2, 2]))
    assert pipelined.layer_paths() == ["encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1"]
    assert pipelined.stage_modules()[1][:2] == ["decoder.block.0", "decoder.block.1"]


def test_layout_that_does_not_fit_is_a_clear_error():
    pipelined = to_pipelined(tiny_model("BertModel"), IPUConfig(layers_per_ipu=[2, 4]))
    with pytest.raises(IncompatibleIPUConfigError, match="places 6 layers but the model has 4"):
        pipelined.parallelize()
    bad_inference = IPUConfig(layers_per_ipu=[-1], inference_layers_per_ipu=[3])
    with pytest.raises(IncompatibleIPUConfigError, match="inference_layers_per_ipu.*places 3 layers"):
        to_pipelined(tiny_model("BertModel"), bad_inference, parallelize=True)


def test_unregistered_class_lists_registered_ones():
    import transformers

    config = transformers.ElectraConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37
    )
    model = transformers.ElectraModel(config)
    with pytest.raises(IncompatibleIPUConfigError, match="ElectraModel has no stage plan.*BertForQuestionAnswering"):
        to_pipelined(model, IPUConfig())


def test_eval_switches_to_inference_layout():
    config = IPUConfig(layers_per_ipu=[0, -1], inference_layers_per_ipu=[-1])
    pipelined = to_pipelined(tiny_model("BertModel"), config, parallelize=True)
    assert len(pipelined.train().stage_layout()) == 2
    assert len(pipelined.eval().stage_layout()) == 1 and config.mode == "inference"


def test_save_pretrained_writes_stock_model_and_ipu_config(tmp_path):
    import transformers

    stock = tiny_model("BertForSequenceClassification")
    pipelined = to_pipelined(stock, IPUConfig(layers_per_ipu=[1, 3], recompute_checkpoint_every_layer=True))
    pipelined.parallelize().save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "ipu_config.json").is_file()
    assert IPUConfig.from_pretrained(tmp_path) == pipelined.ipu_config
    reloaded = transformers.BertForSequenceClassification.from_pretrained(tmp_path)
    for key, value in stock.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], value)
    assert pipelined._parallelized, "saving must leave the model parallelized"


def test_auto_classes_return_pipelined_models(tmp_path):
    from optimum_ipu import AutoModelForQuestionAnswering, PipelinedModel

    tiny_model("BertForQuestionAnswering").save_pretrained(tmp_path)
    IPUConfig(layers_per_ipu=[0, -1]).save_pretrained(tmp_path / "cfg")
    model = AutoModelForQuestionAnswering.from_pretrained(tmp_path, ipu_config=str(tmp_path / "cfg"))
    assert isinstance(model, PipelinedModel) and model.ipu_config.layers_per_ipu == [0, -1]
    assert type(model.model).__name__ == "BertForQuestionAnswering"
