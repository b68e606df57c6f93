"""The model zoo sweep (`benchmarks/model_zoo.py`) on a fixed sample of derived architectures.

The full sweep (every class of four auto mappings) runs from the command line; CI runs its per-class check on
architectures of different kinds (encoders, decoders with grouped-query or latent attention, mixtures of
experts, a composite vision-language config, encoder-decoders, a classification head) and on a class without a
list of identical layers, which must be refused clearly.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest
import torch

from .conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # importable by name: the sweep's worker process imports it too
import model_zoo  # noqa: E402

DERIVED_SAMPLE = [
    "ElectraForMaskedLM",  # BERT-like encoder with its own embedding projection
    "XLMRobertaForMaskedLM",  # RoBERTa positions (offset after the padding index)
    "FalconForCausalLM",  # parallel attention + MLP
    "PhiForCausalLM",  # partial rotary positions
    "GemmaForCausalLM",  # grouped-query attention, scaled embeddings
    "Qwen3MoeForCausalLM",  # mixture of experts
    "DeepseekV3ForCausalLM",  # multi-head latent attention + routed experts
    "Gemma3ForConditionalGeneration",  # nested text and vision configs, sliding-window layers
    "GPTNeoXForSequenceClassification",  # last-token classification head (pad token set)
    "PegasusForConditionalGeneration",  # encoder-decoder, sinusoidal positions
    "MBartForConditionalGeneration",  # encoder-decoder, listed for masked LM and seq2seq
]
NO_LAYER_LIST = "MllamaForCausalLM"  # self-attention and cross-attention layers of two classes in one list


@pytest.fixture(scope="module")
def zoo() -> dict[str, dict[str, str]]:
    # not model_zoo.quiet(): it is for the sweep's own worker processes (one thread, logs off) and would leak
    # into the rest of this pytest process
    return model_zoo.zoo_classes()


def test_the_sweep_covers_at_least_60_classes_of_the_four_mappings(zoo):
    assert len(zoo) >= 60
    assert {info["auto"] for info in zoo.values()} == set(model_zoo.MAPPINGS)
    assert set(DERIVED_SAMPLE) | {NO_LAYER_LIST} <= set(zoo)


@pytest.mark.parametrize("class_name", DERIVED_SAMPLE)
def test_derived_architecture_pipelines_into_2_and_3_stages(zoo, class_name):
    record = model_zoo.check_class(class_name, zoo[class_name])
    assert record["category"] == "passes", record
    assert record["plan"] == "derived" and record["stages_2"] == record["stages_3"] == "pass"
    assert 0 < record["parameters"] <= model_zoo.MAX_PARAMETERS


def test_class_without_a_layer_list_is_refused_clearly(zoo):
    record = model_zoo.check_class(NO_LAYER_LIST, zoo[NO_LAYER_LIST])
    assert record["category"] == "no_layer_list" and record["plan"] == "none"
    assert "holds no list of identical layers" in record["reason"] and "register_stage_plan" in record["reason"]
    assert record["stages_2"] is None and record["stages_3"] is None


def test_a_difference_is_named_and_equal_tensors_pass():
    want = {"loss": torch.tensor(1.0), "logits": torch.zeros(2, 3)}
    assert model_zoo.first_difference(want, {k: v.clone() for k, v in want.items()}, "output") is None
    off = {"loss": torch.tensor(1.0), "logits": torch.zeros(2, 3).index_fill(1, torch.tensor([2]), 1e-3)}
    assert model_zoo.first_difference(want, off, "output") == "output logits: max difference 1.00e-03"
    assert model_zoo.first_difference(want, {"loss": want["loss"]}, "grad") == "grad missing ['logits']"


def test_shrunk_config_keeps_grouped_query_attention_and_cuts_per_layer_lists():
    import transformers

    config = model_zoo.tiny_config(transformers.Gemma3ForCausalLM)
    assert (config.hidden_size, config.num_hidden_layers) == (model_zoo.HIDDEN, 4)
    assert config.num_key_value_heads < config.num_attention_heads
    assert len(config.layer_types) == 4 and config.vocab_size == model_zoo.VOCAB
    params, _ = model_zoo.count_parameters_on_meta(transformers.Gemma3ForCausalLM, config)
    assert params <= model_zoo.MAX_PARAMETERS


def test_summary_counts_every_category():
    results = [
        {"class": "A", "plan": "derived", "stages_2": "pass", "stages_3": "pass", "category": "passes", "reason": ""},
        {"class": "B", "plan": "none", "category": "no_layer_list", "reason": "no list | here"},
    ]
    text = model_zoo.summary_markdown(results)
    assert "| passes | 1 |" in text and "| no_layer_list | 1 |" in text and "| crashed | 0 |" in text
    assert "| B | none | - | - | no_layer_list | no list \\| here |" in text


def test_a_worker_that_dies_is_one_crashed_class_and_the_sweep_goes_on(zoo):
    pool = model_zoo.WorkerPool(timeout=120)
    try:
        pool._start()
        threading.Timer(0.2, os.kill, (pool.process.pid, signal.SIGKILL)).start()  # while it still imports
        record = pool.check("ElectraForMaskedLM", zoo["ElectraForMaskedLM"])
        assert record["category"] == "crashed" and record["reason"] == "worker died (signal 9)"
        assert pool.check("ElectraForMaskedLM", zoo["ElectraForMaskedLM"])["category"] == "passes"
    finally:
        pool.stop()


def test_readme_reports_the_counts_of_the_committed_sweep():
    """The model zoo page's table (docs/model-zoo.md) is the committed sweep's JSON (rerun the sweep, then update
    both)."""
    import json
    import re

    report = json.loads((REPO_ROOT / "benchmarks" / "results" / "model_zoo.json").read_text())
    page = (REPO_ROOT / "docs" / "model-zoo.md").read_text()
    section = page.split("# Model zoo: registered and derived plans", 1)[1].split("\n## ", 1)[0]
    table = dict(re.findall(r"^\| (\w+): .*? \| (\d+)", section, flags=re.M))
    assert set(table) == set(model_zoo.CATEGORIES)
    assert {k: int(v) for k, v in table.items()} == {c: report["counts"].get(c, 0) for c in model_zoo.CATEGORIES}
    plans = [r["plan"] for r in report["classes"] if r["category"] == "passes"]
    assert f"({plans.count('registered')} registered, {plans.count('derived')} derived)" in section
    assert f"({len(report['classes'])} classes;" in section and len(report["classes"]) >= 60


def test_derived_encoders_built_as_bert_are_fused_as_bert():
    """ONNX Runtime's BERT fusions apply to a derived plan whose layers are built as BERT's (XLM-RoBERTa, ELECTRA),
    and to no other derived plan (GPT-Neo's layers are not)."""
    import transformers

    from optimum_ipu.models.plans import plan_for_model

    shape = {"vocab_size": 64, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32}
    xlmr = transformers.XLMRobertaForSequenceClassification(transformers.XLMRobertaConfig(num_hidden_layers=2, **shape))
    electra = transformers.ElectraForMaskedLM(
        transformers.ElectraConfig(num_hidden_layers=2, embedding_size=16, **shape)
    )
    neo_config = transformers.GPTNeoConfig(
        vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, attention_types=[[["global"], 2]]
    )
    neo = transformers.GPTNeoForCausalLM(neo_config)
    assert [plan_for_model(m).onnx_model_type for m in (xlmr, electra)] == ["bert", "bert"]
    assert plan_for_model(neo).onnx_model_type == "gpt_neo"  # its own family name: not one ONNX Runtime fuses
