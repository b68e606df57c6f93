"""Optimum Graphcore's `Pipelined<Class>` names import from its module paths with `optimum.graphcore` changed to
`optimum_ipu`, are generated from the stage plan registry, and run as its classes did (issue 27, item 1).

`OG_NAMES` is read from Optimum Graphcore's tree at `OG_COMMIT`: every `class Pipelined...` of
`optimum/graphcore/models/<module>/modeling_<module>.py` (`git grep "^class Pipelined"`), and whether its
`models/<module>/__init__.py` exports it.
"""

from __future__ import annotations

import importlib
import logging

import pytest
import torch
import transformers

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.modeling_utils import PipelineMixin, register
from optimum_ipu.models import StagePlan, pipelined_classes, plans, registered_classes, registered_plans
from optimum_ipu.models.pipelined_classes import module_name

from . import tiny_models, tiny_models_vision_speech

OG_COMMIT = "b8cd6e096a11139745d519aedea4a9414395f093"  # huggingface/optimum-graphcore, 2026-04-15
EXPORTED, MODELING_ONLY = True, False
OG_NAMES: dict[str, dict[str, bool]] = {
    "bart": dict.fromkeys(("PipelinedBartForConditionalGeneration", "PipelinedBartForSequenceClassification"), True),
    "bert": dict.fromkeys(
        (
            "PipelinedBertModel",
            "PipelinedBertForPreTraining",
            "PipelinedBertForMaskedLM",
            "PipelinedBertForSequenceClassification",
            "PipelinedBertForMultipleChoice",
            "PipelinedBertForTokenClassification",
            "PipelinedBertForQuestionAnswering",
        ),
        EXPORTED,
    ),
    "convnext": {"PipelinedConvNextForImageClassification": EXPORTED},
    "deberta": dict.fromkeys(
        (
            "PipelinedDebertaForMaskedLM",
            "PipelinedDebertaForSequenceClassification",
            "PipelinedDebertaForTokenClassification",
            "PipelinedDebertaForQuestionAnswering",
        ),
        EXPORTED,
    ),
    "distilbert": dict.fromkeys(
        (
            "PipelinedDistilBertForMaskedLM",
            "PipelinedDistilBertForSequenceClassification",
            "PipelinedDistilBertForQuestionAnswering",
            "PipelinedDistilBertForTokenClassification",
            "PipelinedDistilBertForMultipleChoice",
        ),
        EXPORTED,
    ),
    "gpt2": dict.fromkeys(
        ("PipelinedGPT2LMHeadModel", "PipelinedGPT2ForSequenceClassification", "PipelinedGPT2ForTokenClassification"),
        EXPORTED,
    ),
    "groupbert": dict.fromkeys(
        (
            "PipelinedGroupBertForPreTraining",
            "PipelinedGroupBertForMaskedLM",
            "PipelinedGroupBertForSequenceClassification",
            "PipelinedGroupBertForMultipleChoice",
            "PipelinedGroupBertForTokenClassification",
            "PipelinedGroupBertForQuestionAnswering",
        ),
        MODELING_ONLY,
    ),
    "hubert": {"PipelinedHubertForSequenceClassification": EXPORTED, "PipelinedHubertCTC": MODELING_ONLY},
    "lxmert": {"PipelinedLxmertForQuestionAnswering": EXPORTED},
    "mpnet": dict.fromkeys(("PipelinedMPNetModel", "PipelinedMPNetForMaskedLM"), EXPORTED),
    "mt5": {"PipelinedMT5ForConditionalGeneration": EXPORTED},
    "roberta": dict.fromkeys(
        (
            "PipelinedRobertaForMaskedLM",
            "PipelinedRobertaForSequenceClassification",
            "PipelinedRobertaForMultipleChoice",
            "PipelinedRobertaForTokenClassification",
            "PipelinedRobertaForQuestionAnswering",
        ),
        EXPORTED,
    ),
    "t5": dict.fromkeys(("PipelinedT5ForConditionalGeneration", "PipelinedT5EncoderModel"), EXPORTED),
    "vit": {"PipelinedViTForImageClassification": EXPORTED},
    "wav2vec2": dict.fromkeys(("PipelinedWav2Vec2ForPreTraining", "PipelinedWav2Vec2ForCTC"), EXPORTED),
    "whisper": {"PipelinedWhisperForConditionalGeneration": EXPORTED},
}
# `optimum/graphcore/__init__.py` exported the names of `models/*/__init__.py` at the top too, but for these.
NOT_AT_TOP = {"deberta", "whisper", "PipelinedWav2Vec2ForCTC"}
ALL = [(module, name) for module, names in OG_NAMES.items() for name in names]


def _tiny(class_name: str) -> tuple[transformers.PreTrainedModel, dict[str, torch.Tensor]]:
    source = tiny_models_vision_speech if class_name in tiny_models_vision_speech.CLASSES else tiny_models
    return source.tiny_model(class_name), source.tiny_inputs(class_name)


def _tensors(outputs) -> dict[str, torch.Tensor]:
    return {k: v for k, v in outputs.items() if isinstance(v, torch.Tensor)}


def test_the_names_are_optimum_graphcores_45():
    assert len(ALL) == 45
    assert sum(exported for names in OG_NAMES.values() for exported in names.values()) == 38


@pytest.mark.parametrize(("module", "name"), ALL, ids=[name for _, name in ALL])
def test_each_name_imports_from_its_path_and_runs_as_the_stock_model(module, name):
    modeling = importlib.import_module(f"optimum_ipu.models.{module}.modeling_{module}")
    pipelined_cls = getattr(modeling, name)
    if OG_NAMES[module][name]:
        assert getattr(importlib.import_module(f"optimum_ipu.models.{module}"), name) is pipelined_cls
    assert issubclass(pipelined_cls, PipelineMixin) and pipelined_cls.__module__ == f"optimum_ipu.models.{module}"
    stock_cls = pipelined_cls.get_transformers_cls()
    model, inputs = _tiny(stock_cls.__name__)
    assert type(model) is stock_cls

    pipelined = pipelined_cls.from_transformers(model, IPUConfig(layers_per_ipu=[-1, -1]))
    assert pipelined.model is not model and not pipelined.training, "a copy, in the model's mode"
    assert pipelined.parallelize() is pipelined
    assert [stage.index for stage in pipelined.stage_layout()] == [0, 1]
    with torch.no_grad():
        expected, got = _tensors(model(**inputs)), _tensors(pipelined(**inputs))
    assert expected and got.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=f"{name}: {key}")
    assert pipelined.deparallelize() is pipelined and type(pipelined.model) is stock_cls


def test_the_top_level_names_of_optimum_graphcore():
    import optimum_ipu

    top = [(m, n) for m, n in ALL if OG_NAMES[m][n] and m not in NOT_AT_TOP and n not in NOT_AT_TOP]
    assert len(top) == 32
    for module, name in top:
        assert getattr(optimum_ipu, name) is getattr(importlib.import_module(f"optimum_ipu.models.{module}"), name)
    assert not hasattr(optimum_ipu, "PipelinedGPT2Model2")


def test_whispers_processor_names_at_its_paths():
    """Its whisper/__init__.py exported `WhisperFeatureExtractorTorch` (feature_extraction_whisper.py) and
    `WhisperProcessorTorch` (processing_whisper.py): torch log-mel features, which transformers 5 computes already."""
    for path in ("", ".feature_extraction_whisper", ".processing_whisper"):
        module = importlib.import_module(f"optimum_ipu.models.whisper{path}")
        assert module.WhisperFeatureExtractorTorch is transformers.WhisperFeatureExtractor
        assert module.WhisperProcessorTorch is transformers.WhisperProcessor
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("optimum_ipu.models.whisper.processing_bert")


def test_every_registered_class_has_its_name():
    for plan in registered_plans():
        module = importlib.import_module(f"optimum_ipu.models.{module_name(plan.family)}")
        for class_name in plan.classes:
            stock_cls = pipelined_classes.transformers_class(class_name)
            assert stock_cls is not None
            assert getattr(module, f"Pipelined{class_name}").get_transformers_cls() is stock_cls
    with pytest.raises(AttributeError, match="has no attribute 'PipelinedBertLMHeadModel'; it serves"):
        importlib.import_module("optimum_ipu.models.bert").PipelinedBertLMHeadModel  # noqa: B018


def test_constructors_and_ipu_config_as_in_optimum_graphcore(tmp_path):
    from optimum_ipu.models.bert import PipelinedBertForSequenceClassification as Pipelined

    model, inputs = _tiny("BertForSequenceClassification")
    model.save_pretrained(tmp_path)
    ipu_config = IPUConfig(layers_per_ipu=[1, 3])
    loaded = Pipelined.from_pretrained_transformers(str(tmp_path), ipu_config)
    assert loaded.ipu_config == ipu_config and loaded.ipu_config is not ipu_config
    assert loaded.model.state_dict().keys() == model.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(**inputs).logits, model(**inputs).logits)  # sdpa once loaded
    assert Pipelined.from_model(model).ipu_config == IPUConfig(), "the default config, as there"
    IPUConfig(layers_per_ipu=[3, 1]).save_pretrained(tmp_path)
    assert Pipelined.from_pretrained(str(tmp_path)).ipu_config.layers_per_ipu == [3, 1], "the config saved beside"
    assert Pipelined(model.config).get_transformers_cls() is transformers.BertForSequenceClassification
    wrapped = Pipelined(model, ipu_config)
    assert wrapped.model is model and wrapped.bert is model.bert and wrapped.num_parameters() == model.num_parameters()
    with pytest.raises(TypeError, match="ipu_config must be an IPUConfig, not str"):
        wrapped.ipu_config = "Graphcore/bert-base-ipu"
    with pytest.raises(TypeError, match="pipelines a BertForSequenceClassification, not a BertModel"):
        Pipelined(model.bert, ipu_config)
    assert isinstance(to_pipelined(model, ipu_config).model, Pipelined.get_transformers_cls())


@pytest.fixture
def scratch_registry(monkeypatch):
    """The registry as it is, restored after the test: the classes it registers stay out of other tests."""
    monkeypatch.setattr(plans, "_PLAN_BY_CLASS", dict(plans._PLAN_BY_CLASS))
    monkeypatch.setattr(pipelined_classes, "_USER_CLASSES", dict(pipelined_classes._USER_CLASSES))


def test_register_registers_a_stage_plan_and_gives_the_generated_class(caplog, scratch_registry):
    class TinyElectraForMaskedLM(transformers.ElectraForMaskedLM):
        """A class no plan names: `register` derives its plan."""

    with caplog.at_level(logging.WARNING, logger="optimum_ipu.models.pipelined_classes"):

        @register(TinyElectraForMaskedLM)
        class PipelinedTinyElectraForMaskedLM(TinyElectraForMaskedLM, PipelineMixin):
            def parallelize(self):  # poptorch placement there
                return self

    assert "PipelinedTinyElectraForMaskedLM's own parallelize not used" in caplog.text
    assert "TinyElectraForMaskedLM" in registered_classes()
    assert PipelinedTinyElectraForMaskedLM.get_transformers_cls() is TinyElectraForMaskedLM
    assert importlib.import_module("optimum_ipu.models.electra").PipelinedTinyElectraForMaskedLM is (
        PipelinedTinyElectraForMaskedLM
    )
    config = transformers.ElectraConfig(
        vocab_size=99,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=37,
    )
    model = TinyElectraForMaskedLM(config).eval()
    pipelined = PipelinedTinyElectraForMaskedLM.from_transformers(model, IPUConfig(layers_per_ipu=[2, 2]))
    ids = torch.randint(3, 99, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(pipelined.parallelize()(input_ids=ids).logits, model(input_ids=ids).logits)

    class OwnBertForQuestionAnswering(transformers.BertForQuestionAnswering):
        pass

    plan = StagePlan("bert", ("OwnBertForQuestionAnswering",), ("embeddings",), ("encoder.layer",))

    @register(plan=plan)
    class PipelinedOwnBertForQuestionAnswering(OwnBertForQuestionAnswering, PipelineMixin):
        pass

    assert PipelinedOwnBertForQuestionAnswering.get_transformers_cls() is OwnBertForQuestionAnswering
    assert to_pipelined(OwnBertForQuestionAnswering(tiny_models.tiny_config("bert")), IPUConfig()).plan is plan
