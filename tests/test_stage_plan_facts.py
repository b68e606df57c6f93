"""Family facts held by the `StagePlan` and read through it (DESIGN.md: "One StagePlan per family holds every fact
about that family"): Optimum Graphcore's extra names at a family's path, a family's own model module, the reason its
stages cannot run on separate processes, the head `optimum-ipu config balance` measures, the position offset the
examples read. Each is checked with a registered custom plan: its value is what the caller uses."""

from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace

import example_utils  # installed with the package (`pip install -e ".[examples]"`), as the scripts import it
import pytest
import transformers
from example_utils.language_modeling import max_positions

import optimum_ipu
from optimum_ipu.cli.balance import _model_and_task
from optimum_ipu.models import StagePlan, load_model_modules, pipelined_classes, plans, register_stage_plan
from optimum_ipu.models.plans import plan_for_class, plan_for_model

GPT2_CLASSES = ("GPT2Model", "GPT2LMHeadModel", "GPT2ForSequenceClassification", "GPT2ForTokenClassification")


@pytest.fixture
def scratch_registry(monkeypatch):
    """The registry as it is, restored after the test: the plans it registers stay out of other tests."""
    monkeypatch.setattr(plans, "_PLAN_BY_CLASS", dict(plans._PLAN_BY_CLASS))
    monkeypatch.setattr(pipelined_classes, "_USER_CLASSES", dict(pipelined_classes._USER_CLASSES))


def _gpt2_plan(**facts) -> StagePlan:
    return StagePlan(family="gpt2", classes=GPT2_CLASSES, embeddings=("wte", "wpe"), layers=("h",), **facts)


def test_optimum_graphcores_names_come_from_the_plans():
    hubert, whisper = plan_for_class("HubertForCTC"), plan_for_class("WhisperForConditionalGeneration")
    assert hubert.graphcore_aliases == {"PipelinedHubertCTC": "HubertForCTC"}
    assert whisper.graphcore_extras["WhisperProcessorTorch"] == "WhisperProcessor"
    assert plan_for_class("GroupBertForMaskedLM").model_module == "optimum_ipu.models.modeling_groupbert"


def test_a_registered_plans_own_names_and_model_module_are_served(tmp_path, monkeypatch, scratch_registry):
    (tmp_path / "own_tiny_model.py").write_text(
        "import transformers\n\n"
        "class OwnTinyForMaskedLM(transformers.BertForMaskedLM):\n    pass\n\n"
        "__all__ = ['OwnTinyForMaskedLM']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("optimum_ipu.models.owntiny") or m == "own_tiny_model"]:
        monkeypatch.delitem(sys.modules, name)
    register_stage_plan(
        StagePlan(
            family="owntiny",
            classes=("OwnTinyForMaskedLM",),
            embeddings=("embeddings",),
            layers=("encoder.layer",),
            model_module="own_tiny_model",
            graphcore_aliases={"PipelinedOwnTinyMLM": "OwnTinyForMaskedLM"},
            graphcore_extras={"OwnTinyTokenizer": "BertTokenizer"},
            graphcore_submodules=("tokenization_owntiny",),
        )
    )
    try:
        load_model_modules()
        own = sys.modules["own_tiny_model"]
        assert pipelined_classes.transformers_class("OwnTinyForMaskedLM") is own.OwnTinyForMaskedLM
        module = importlib.import_module("optimum_ipu.models.owntiny")
        assert module.OwnTinyForMaskedLM is own.OwnTinyForMaskedLM  # the model module's `__all__`
        assert module.PipelinedOwnTinyMLM is module.PipelinedOwnTinyForMaskedLM
        assert module.PipelinedOwnTinyMLM.get_transformers_cls() is own.OwnTinyForMaskedLM
        submodule = importlib.import_module("optimum_ipu.models.owntiny.tokenization_owntiny")
        assert submodule.OwnTinyTokenizer is transformers.BertTokenizer
        assert "OwnTinyTokenizer" in module.__all__ and "PipelinedOwnTinyMLM" in module.__all__
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("optimum_ipu.models.owntiny.processing_owntiny")
    finally:
        for name in [m for m in sys.modules if m.startswith("optimum_ipu.models.owntiny") or m == "own_tiny_model"]:
            del sys.modules[name]


def _tiny_wav2vec2(**overrides) -> transformers.Wav2Vec2ForCTC:
    config = transformers.Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        conv_dim=(8, 8),
        conv_stride=(2, 2),
        conv_kernel=(3, 3),
        **overrides,
    )
    return transformers.Wav2Vec2ForCTC(config)


def test_process_stages_refusal_reads_the_weighted_layer_sum_and_the_plan(scratch_registry):
    model = _tiny_wav2vec2()
    plan = plan_for_model(model)
    assert plan.process_stages_refusal(model) == ""
    weighted = _tiny_wav2vec2(use_weighted_layer_sum=True)
    assert plan.process_stages_refusal(weighted) == (
        "with use_weighted_layer_sum its head on the last stage reads every layer's output"
    )
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=50))
    assert plan_for_model(gpt2).process_stages_refusal(gpt2) == ""
    one_process = register_stage_plan(
        _gpt2_plan(process_stages=False, process_stages_reason="its cache is shared"), replace=True
    )
    assert plan_for_model(gpt2) is one_process and one_process.process_stages_refusal(gpt2) == "its cache is shared"
    gpt2.config.reads_all_layers = True
    flagged = register_stage_plan(_gpt2_plan(all_layer_outputs_flags=("reads_all_layers",)), replace=True)
    assert flagged.process_stages_refusal(gpt2) == (
        "with reads_all_layers its head on the last stage reads every layer's output"
    )


def test_the_balance_commands_task_is_the_plans(scratch_registry):
    names = ("tiny-bert-config", "tiny-gpt2-config", "tiny-t5-config")
    assert [_model_and_task(name, "auto")[1] for name in names] == ["question-answering", "causal-lm", "translation"]
    # a plan declaring no causal loss, with a question-answering class: its head is measured
    plan = StagePlan(
        family="gpt2",
        classes=(*GPT2_CLASSES, "GPT2ForQuestionAnswering"),
        embeddings=("wte", "wpe"),
        layers=("h",),
        layer_count_fields=("n_layer",),
    )
    register_stage_plan(plan, replace=True)
    model, task = _model_and_task("tiny-gpt2-config", "auto")
    assert task == "question-answering" and type(model) is transformers.GPT2ForQuestionAnswering


@pytest.mark.parametrize(
    ("config", "offset"),
    [
        (transformers.RobertaConfig(pad_token_id=1), 2),
        (transformers.MPNetConfig(pad_token_id=1), 2),
        (transformers.BertConfig(), 0),
        (transformers.GPT2Config(), 0),
        # no registered plan: read from the structure, as the derived plan is
        (transformers.XLMRobertaConfig(pad_token_id=1), 2),
        (transformers.CamembertConfig(pad_token_id=1), 2),
        (transformers.LongformerConfig(pad_token_id=1), 2),
        (transformers.ElectraConfig(), 0),
        (SimpleNamespace(model_type="no-such-family"), 0),
    ],
    ids=lambda value: getattr(value, "model_type", None) if not isinstance(value, int) else str(value),
)
def test_position_offset(config, offset):
    assert optimum_ipu.position_offset(config) == offset


def test_a_derived_plan_reads_its_position_offset_from_its_embeddings():
    config = transformers.XLMRobertaConfig(
        vocab_size=99, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, pad_token_id=1
    )
    plan = plan_for_model(transformers.XLMRobertaForTokenClassification(config))
    assert plan.derived and plan.position_offset(config) == 2
    electra = transformers.ElectraConfig(
        vocab_size=99, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37
    )
    assert plan_for_model(transformers.ElectraForMaskedLM(electra)).position_offset(electra) == 0


def test_the_examples_read_the_position_offset_through_the_plan(scratch_registry):
    tokenizer = SimpleNamespace(model_max_length=10**30)
    config = transformers.GPT2Config(n_positions=64)
    assert example_utils.max_model_length(tokenizer, config) == 64 and max_positions(config) == 64
    register_stage_plan(_gpt2_plan(position_offset=lambda config: 5), replace=True)
    assert example_utils.max_model_length(tokenizer, config) == 59 and max_positions(config) == 59
    xlmr = transformers.XLMRobertaConfig(max_position_embeddings=514, pad_token_id=1)
    assert example_utils.max_model_length(tokenizer, xlmr) == 512 and max_positions(xlmr) == 512
