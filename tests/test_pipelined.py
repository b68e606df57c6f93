"""Pipelined models: parity with stock `transformers` for every registered class, generated from the registry.

Multi-stage layouts run through `run_stages_in_turn`: each stage runs only its own modules and hands its
activations (and, backwards, their gradients) to the next exactly as the process pipeline does, so a stage that
misses a module, a mask, a position table or the encoder's output gives other numbers than the stock model.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from optimum_ipu import IncompatibleIPUConfigError, IPUConfig, to_pipelined
from optimum_ipu.models import derived
from optimum_ipu.models.layout import layers_per_stage
from optimum_ipu.models.plans import plan_for_class, registered_classes, registered_plans
from optimum_ipu.runtime.stages.cut import run_stages_in_turn

from . import tiny_models, tiny_models_vision_speech

# Every layout of 4 pipeline layers that a stage boundary can fall into: after the embeddings, inside the
# stack, at the encoder/decoder seam (encoder-decoder models have 2 + 2), an empty middle stage, an empty last.
STAGE_LAYOUTS = {
    "2-stages": [2, 2],
    "3-stages-empty-first": [0, 2, 2],
    "3-stages": [1, 2, 1],
    "4-stages-empty-middle": [1, 0, 3, 0],
    "3-stages-seam-inside": [3, 1, 0],
}
# Layouts that change the modules themselves, run as one process runs them (PipelinedModel.forward).
ONE_PROCESS_LAYOUTS = {
    "recompute": {"layers_per_ipu": [2, -1], "recompute_checkpoint_every_layer": True},
    "serialized": {
        "layers_per_ipu": [-1, -1],
        "embedding_serialization_factor": 3,
        "projection_serialization_factor": 2,
    },
}
VISION_SPEECH = set(tiny_models_vision_speech.CLASSES)


def _stage_cases() -> list[tuple[str, str]]:
    """Every registered class in the 3-stage layout; the first class of each plan in every layout."""
    cases = [(name, "3-stages") for name in registered_classes()]
    for plan in registered_plans():
        cases += [(plan.classes[0], layout) for layout in STAGE_LAYOUTS if layout != "3-stages"]
    return cases


def _tiny(class_name: str):
    return tiny_models_vision_speech if class_name in VISION_SPEECH else tiny_models


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _stock(class_name: str):
    """The stock model's outputs and gradients on the class's tiny inputs (training mode, no dropout)."""
    tiny = _tiny(class_name)
    stock, inputs = tiny.tiny_model(class_name).train(), tiny.tiny_inputs(class_name)
    torch.manual_seed(0)  # Wav2Vec2ForPreTraining's quantizer draws Gumbel noise in training
    expected = stock(**inputs)
    tiny.scalar_objective(expected).backward()
    return stock, inputs, expected, _grads(stock)


def _assert_equal(class_name, expected, got, want, have, skip=()):
    for key, value in expected.items():
        if isinstance(value, torch.Tensor) and key not in skip:
            torch.testing.assert_close(got[key], value, atol=1e-5, rtol=1e-5, msg=f"{class_name} output {key}")
    assert want.keys() == have.keys() and want, f"{class_name}: other parameters got gradients"
    for name in want:
        torch.testing.assert_close(have[name], want[name], atol=1e-5, rtol=1e-5, msg=f"{class_name} grad {name}")


@pytest.mark.parametrize(("class_name", "layout"), _stage_cases())
def test_stages_run_apart_equal_stock(class_name, layout):
    stock, inputs, expected, want = _stock(class_name)
    model = copy.deepcopy(stock)
    model.zero_grad(set_to_none=True)
    pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=STAGE_LAYOUTS[layout]), parallelize=True).train()
    counts = layers_per_stage(pipelined.ipu_config, pipelined.num_layers)
    torch.manual_seed(0)
    got, _ = run_stages_in_turn(
        model, pipelined.stage_cut(), counts, inputs, objective=_tiny(class_name).scalar_objective
    )
    _assert_equal(class_name, expected, got, want, _grads(model))


@pytest.mark.parametrize("layout", list(ONE_PROCESS_LAYOUTS))
@pytest.mark.parametrize("class_name", registered_classes())
def test_one_process_features_equal_stock(class_name, layout):
    stock, inputs, expected, want = _stock(class_name)
    model = copy.deepcopy(stock)
    model.zero_grad(set_to_none=True)
    config = IPUConfig(**ONE_PROCESS_LAYOUTS[layout])
    if layout == "recompute" and not model.supports_gradient_checkpointing:
        with pytest.raises(IncompatibleIPUConfigError, match="recompute_checkpoint_every_layer"):
            to_pipelined(model, config, parallelize=True)
        return
    pipelined = to_pipelined(model, config, parallelize=True).train()
    torch.manual_seed(0)
    got = pipelined(**inputs)
    # projection + loss in chunks: training never builds the full logits (the loss must still match)
    chunked = layout == "serialized" and plan_for_class(class_name).loss_kind(class_name) is not None
    assert not chunked or got.get("logits") is None
    _tiny(class_name).scalar_objective(got).backward()
    _assert_equal(class_name, expected, got, want, _grads(model), skip=("logits",) if chunked else ())


@pytest.mark.parametrize("class_name", registered_classes())
def test_deparallelize_round_trips_state_dict(class_name, tmp_path):
    stock = _tiny(class_name).tiny_model(class_name)
    before = {k: v.clone() for k, v in stock.state_dict().items()}
    modules_before = dict(stock.named_modules())
    config = IPUConfig(
        layers_per_ipu=[0, -1],
        recompute_checkpoint_every_layer=True,
        embedding_serialization_factor=2,
        projection_serialization_factor=3,
    )
    if not stock.supports_gradient_checkpointing:
        config.recompute_checkpoint_every_layer = False
    pipelined = to_pipelined(stock, config, parallelize=True)
    model = pipelined.deparallelize()
    assert model is stock and dict(model.named_modules()) == modules_before
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    renamed = hasattr(type(model), "is_activation_checkpointing")  # transformers 5.2x renamed it
    assert not (model.is_activation_checkpointing if renamed else model.is_gradient_checkpointing)


def test_stage_layout_and_modules():
    pipelined = to_pipelined(tiny_models.tiny_model("BertForQuestionAnswering"), IPUConfig(layers_per_ipu=[0, -1, -1]))
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


def test_a_layout_for_a_deeper_model_takes_the_layers_in_order(caplog):
    # Optimum Graphcore's sentiment notebook: layers_per_ipu=[40] on one IPU for every model it loads
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        one = to_pipelined(tiny_models.tiny_model("BertModel"), IPUConfig(layers_per_ipu=[40]), parallelize=True)
        two = to_pipelined(tiny_models.tiny_model("BertModel"), IPUConfig(layers_per_ipu=[3, 40]), parallelize=True)
    assert [len(s.layers) for s in one.stage_layout()] == [4] and [len(s.layers) for s in two.stage_layout()] == [3, 1]
    said = [r.getMessage() for r in caplog.records if "take the model's layers in order" in r.getMessage()]
    assert len(said) == len(set(said)) and "`layers_per_ipu`: [40] places 40 layers and the model has 4" in said[0]
    assert any("[3, 40] places 43 layers and the model has 4" in m and "([3, 1])" in m for m in said), said


def test_t5_counts_encoder_and_decoder_layers():
    pipelined = to_pipelined(tiny_models.tiny_model("T5ForConditionalGeneration"), IPUConfig(layers_per_ipu=[2, 2]))
    assert pipelined.layer_paths() == ["encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1"]
    assert pipelined.stage_modules()[1][:2] == ["decoder.block.0", "decoder.block.1"]


def test_layout_that_does_not_fit_is_a_clear_error():
    pipelined = to_pipelined(tiny_models.tiny_model("BertModel"), IPUConfig(layers_per_ipu=[4, 4]))
    with pytest.raises(IncompatibleIPUConfigError, match="places 8 layers but the model has 4"):
        pipelined.parallelize()  # ipu1 would get none of the 4 it asks for
    short = to_pipelined(tiny_models.tiny_model("BertModel"), IPUConfig(layers_per_ipu=[1, 2]))
    with pytest.raises(IncompatibleIPUConfigError, match="places 3 layers but the model has 4"):
        short.parallelize()
    bad_inference = IPUConfig(layers_per_ipu=[-1], inference_layers_per_ipu=[3])
    with pytest.raises(IncompatibleIPUConfigError, match="inference_layers_per_ipu.*places 3 layers"):
        to_pipelined(tiny_models.tiny_model("BertModel"), bad_inference, parallelize=True)


def test_unregistered_class_gets_a_derived_plan_equal_to_stock(caplog):
    import transformers

    config = transformers.ElectraConfig(
        vocab_size=99,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=37,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    stock = transformers.ElectraForMaskedLM(config).train()
    inputs = tiny_models.tiny_inputs("BertForMaskedLM")
    expected = stock(**inputs)
    expected.loss.backward()
    model = copy.deepcopy(stock)
    model.zero_grad(set_to_none=True)
    derived._derived.pop("ElectraForMaskedLM", None)  # said once a process: another test may have said it
    with caplog.at_level("WARNING"):
        pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=[1, 2, 1]), parallelize=True)
    assert pipelined.plan.derived and pipelined.plan.layers == ("encoder.layer",)
    assert "ElectraForMaskedLM has no registered stage plan; derived one" in caplog.text
    got, _ = run_stages_in_turn(model, pipelined.stage_cut(), [1, 2, 1], inputs, objective=lambda out: out.loss)
    _assert_equal("ElectraForMaskedLM", expected, got, _grads(stock), _grads(model))


def test_a_model_of_ones_own_runs_on_a_derived_plan():
    """A plain `nn.Module` (Optimum Graphcore's external_model notebook: embeddings, a torch `TransformerEncoder`,
    a head) runs pipelined as it runs alone: it has no `transformers` `get_output_embeddings`."""

    class OwnModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.word_embeddings = torch.nn.Embedding(99, 32)
            layer = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
            self.transformer_encoder = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
            self.lm_head = torch.nn.Linear(32, 99)

        def forward(self, input_ids, labels=None):
            logits = self.lm_head(self.transformer_encoder(self.word_embeddings(input_ids)))
            return (torch.nn.functional.cross_entropy(logits.view(-1, 99), labels.view(-1)),)

    torch.manual_seed(0)
    model = OwnModel().eval()
    input_ids = torch.randint(0, 99, (2, 8))
    expected = model(input_ids, labels=input_ids)[0]
    pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=[2, 2]), parallelize=True).train()
    assert pipelined.plan.derived and pipelined.plan.layers == ("transformer_encoder.layers",)
    assert torch.equal(pipelined(input_ids, labels=input_ids)[0], expected)


def test_model_without_a_layer_list_is_refused_clearly():
    with pytest.raises(
        IncompatibleIPUConfigError, match="Linear holds no list of identical layers.*register_stage_plan"
    ):
        to_pipelined(torch.nn.Linear(2, 2), IPUConfig())


def test_eval_switches_to_inference_layout():
    config = IPUConfig(layers_per_ipu=[0, -1], inference_layers_per_ipu=[-1])
    pipelined = to_pipelined(tiny_models.tiny_model("BertModel"), config, parallelize=True)
    assert len(pipelined.train().stage_layout()) == 2
    assert len(pipelined.eval().stage_layout()) == 1
    assert config.mode == "training"  # the shared config is not flipped behind the user's back (it may be shared)


def test_save_pretrained_writes_stock_model_and_ipu_config(tmp_path):
    import transformers

    stock = tiny_models.tiny_model("BertForSequenceClassification")
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

    tiny_models.tiny_model("BertForQuestionAnswering").save_pretrained(tmp_path)
    IPUConfig(layers_per_ipu=[0, -1]).save_pretrained(tmp_path / "cfg")
    model = AutoModelForQuestionAnswering.from_pretrained(tmp_path, ipu_config=str(tmp_path / "cfg"))
    assert isinstance(model, PipelinedModel) and model.ipu_config.layers_per_ipu == [0, -1]
    assert type(model.model).__name__ == "BertForQuestionAnswering"


def test_auto_classes_use_the_ipu_config_saved_with_the_model(tmp_path, monkeypatch):
    from optimum_ipu import AutoModelForQuestionAnswering
    from optimum_ipu.models import auto

    tiny_models.tiny_model("BertForQuestionAnswering").save_pretrained(tmp_path / "model")
    assert AutoModelForQuestionAnswering.from_pretrained(tmp_path / "model").ipu_config == IPUConfig()  # none saved
    IPUConfig(layers_per_ipu=[0, -1], gradient_accumulation_steps=4).save_pretrained(tmp_path / "model")
    model = AutoModelForQuestionAnswering.from_pretrained(tmp_path / "model")
    assert model.ipu_config.layers_per_ipu == [0, -1] and model.ipu_config.gradient_accumulation_steps == 4
    # a Hub repo: transformers' file resolution is asked for ipu_config.json with the same revision and token
    asked = {}

    def fake_cached_file(repo, filename, **kwargs):
        asked.update(repo=repo, filename=filename, **kwargs)
        return str(tmp_path / "model" / filename)

    monkeypatch.setattr(auto, "cached_file", fake_cached_file)
    config = auto.repo_ipu_config(
        "someone/bert-qa", revision="v2", token="hf_x", force_download=True, torch_dtype="float32"
    )
    assert config.gradient_accumulation_steps == 4
    # force_download too: a fresh model beside a stale config from the cache would be another layout
    assert (asked["repo"], asked["filename"], asked["revision"], asked["token"], asked["force_download"]) == (
        "someone/bert-qa",
        "ipu_config.json",
        "v2",
        "hf_x",
        True,
    )
    assert "torch_dtype" not in asked  # only what locates a file


def test_stages_leave_no_hooks_on_the_model():
    model = tiny_models.tiny_model("T5ForConditionalGeneration").train()
    pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=[1, 2, 1]), parallelize=True)
    before = {name: module for name, module in model.named_modules()}
    run_stages_in_turn(model, pipelined.stage_cut(), [1, 2, 1], tiny_models.tiny_inputs("T5ForConditionalGeneration"))
    hooked = [
        name
        for name, module in model.named_modules()
        if module._forward_hooks or module._forward_pre_hooks or module._forward_hooks_with_kwargs
    ]
    assert not hooked, f"hooks left on the user's model: {hooked}"
    assert dict(model.named_modules()) == before, "every stood-in layer is put back"
