"""Layouts that cannot run, refused in one line naming the field and the fix (issue 42, item 14): `layers_per_ipu:
"auto"` with the stages on separate processes (it measures the whole model in one process; each holds only its
stage) or over more stages than the model has layers, and a serialization factor on a module that carries a `peft`
adapter (LoRA on GPT-2's `lm_head` / `wte`, Llama's `embed_tokens`): in one process when the model is parallelized
(`to_pipelined`, `IPUTrainer`), and in the example scripts under torchrun, whose stage-local models reached peft
serialized (peft's own 'SerializedLinear is not supported' before)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from accelerate import init_empty_weights

from optimum_ipu import IPUConfig, IPUTrainer, to_pipelined
from optimum_ipu.models import pipelined as pipelined_module
from optimum_ipu.models.stage_loading import load_stage
from optimum_ipu.runtime.serialization import SerializedEmbedding, SerializedLinear

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, free_port, launch, training_arguments
from ..tiny_models import tiny_config, tiny_inputs, tiny_model

GPT2_CONFIG = REPO_ROOT / "examples" / "language-modeling" / "ipu_config_gpt2.json"  # the documented one


def gpt2_config(**changes) -> IPUConfig:
    """The documented GPT-2 config of the examples (embedding and projection serialization factors 4), changed."""
    return IPUConfig.from_dict({**json.loads(GPT2_CONFIG.read_text()), **changes})


# ------------------------------------------------------------------------------------ layers_per_ipu: "auto"
def test_auto_with_stages_on_processes_is_refused_before_anything_is_read(reliability, tmp_path):
    """Under torchrun with the stages on processes, every model is loaded by `load_stage` (the examples'
    `load_pretrained`, `AutoModelFor*.from_pretrained(ipu_config=...)`, `pipeline()`): refused there first, before the
    process mesh or the model folder (absent here) is touched."""
    config = IPUConfig(layers_per_ipu="auto", ipus_per_replica=2)
    missing = str(tmp_path / "no-such-model")
    names = ("`layers_per_ipu`", '"auto"', "separate processes", "give the 2 counts", "optimum-ipu config balance")
    err = reliability.expect_clear_error(lambda: load_stage("AutoModelForMaskedLM", missing, config), names)
    assert f"balance {missing} --n-ipu 2" in str(err)
    inference = IPUConfig(layers_per_ipu=[2, 2], ipus_per_replica=2, inference_layers_per_ipu="auto")
    reliability.expect_clear_error(lambda: load_stage("AutoModelForMaskedLM", missing, inference), "inference_")


def test_auto_on_a_model_holding_one_stage_names_auto(reliability):
    """A model whose other stages are on the meta device (what `load_stage` gives), pipelined with an "auto" config:
    the same line, not the forward hook's 'cannot run whole here'."""
    with init_empty_weights():
        model = transformers.BertForMaskedLM(tiny_config("bert"))
    config = IPUConfig(layers_per_ipu="auto", ipus_per_replica=2)
    names = ('"auto"', "separate processes", "optimum-ipu config balance")
    reliability.expect_clear_error(lambda: to_pipelined(model, config, parallelize=True), names)


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"layers_per_ipu": "auto", "ipus_per_replica": 6}, ("`layers_per_ipu`", "6 stages", "4 layers", "at most 4")),
        (
            {"layers_per_ipu": [2, 2], "ipus_per_replica": 2, "inference_layers_per_ipu": "auto"}
            | {"inference_ipus_per_replica": 5},
            ("`inference_layers_per_ipu`", "5 stages", "`inference_ipus_per_replica`", "at most 4"),
        ),
    ],
    ids=["training", "inference"],
)
def test_auto_over_more_stages_than_layers_is_refused(reliability, monkeypatch, fields, names):
    """Explicit counts give every slot that asks for layers at least one (`resolve_layers_per_ipu`); "auto" asks for
    them on every slot: refused, before any layer is measured, and before parallelize (the layout printed)."""
    monkeypatch.setattr(pipelined_module, "auto_layers_per_ipu", _not_measured)
    model = tiny_model("BertForMaskedLM")  # 4 layers
    reliability.expect_clear_error(lambda: to_pipelined(model, IPUConfig(**fields), parallelize=True), names)
    pipelined = to_pipelined(model, IPUConfig(**fields))
    reliability.expect_clear_error(
        lambda: pipelined.stage_layout(inference="inference_layers_per_ipu" in fields), names
    )


def test_auto_over_one_stage_is_every_layer_without_measuring(monkeypatch):
    """One stage holds every layer: nothing to measure (so nothing that needs the whole model in one process)."""
    monkeypatch.setattr(pipelined_module, "auto_layers_per_ipu", _not_measured)
    config = IPUConfig(
        layers_per_ipu=[2, 2], ipus_per_replica=2, inference_layers_per_ipu="auto", inference_ipus_per_replica=1
    )
    pipelined = to_pipelined(tiny_model("BertForMaskedLM"), config, parallelize=True)
    assert [len(s.layers) for s in pipelined.stage_layout(inference=True)] == [4]


def _not_measured(*args, **kwargs):
    raise AssertionError("the layers were measured")


# ------------------------------------------------------------------------------- LoRA on a serialized module
def lora(class_name: str, targets: list[str]) -> torch.nn.Module:
    """The tiny model of `class_name` with LoRA adapters (rank 4) on `targets`."""
    peft = pytest.importorskip("peft", reason='the peft extra: pip install "optimum-ipu[peft]"')
    torch.manual_seed(3)
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM")
    return peft.get_peft_model(tiny_model(class_name), config)


ADAPTED_SERIALIZED = {
    "gpt2-lm_head": (
        "GPT2LMHeadModel",
        ["c_attn", "lm_head"],
        {},
        ("`lm_head`", "`projection_serialization_factor` (4)"),
    ),
    "gpt2-wte": ("GPT2LMHeadModel", ["c_attn", "wte"], {}, ("`transformer.wte`", "`embedding_serialization_factor`")),
    "gpt2-splits": (
        "GPT2LMHeadModel",
        ["lm_head"],
        {"projection_serialization_factor": None, "serialized_projection_splits_per_ipu": [2, 2]},
        ("`serialized_projection_splits_per_ipu` ([2, 2])", "remove `serialized_projection_splits_per_ipu`"),
    ),
    "gpt2-inference": (
        "GPT2LMHeadModel",
        ["lm_head"],
        {"projection_serialization_factor": 1, "inference_projection_serialization_factor": 2},
        ("`inference_projection_serialization_factor` (2)", "set `inference_projection_serialization_factor` to 1"),
    ),
    "llama-embed_tokens": ("LlamaForCausalLM", ["q_proj", "embed_tokens"], {}, ("`model.embed_tokens`",)),
}


@pytest.mark.parametrize(
    ("class_name", "targets", "changes", "names"), ADAPTED_SERIALIZED.values(), ids=list(ADAPTED_SERIALIZED)
)
def test_adapter_on_a_serialized_module_is_refused(reliability, class_name, targets, changes, names):
    """Adapters first (the examples' order, and `IPUTrainer`'s): the chunked module would drop the adapter's update
    (the serialization was skipped with a 'gave Linear, not Linear' warning before). Refused before the model
    changes: no module swapped, no activation checkpointing turned on."""
    model = lora(class_name, targets)
    before = {name: type(module) for name, module in model.named_modules()}
    config = gpt2_config(**changes)
    names = (*names, "peft adapter", "--lora_target_modules")
    reliability.expect_clear_error(lambda: to_pipelined(model, config, parallelize=True), names)
    assert {name: type(module) for name, module in model.named_modules()} == before
    assert not model.base_model.model.is_gradient_checkpointing


def test_adapter_on_a_serialized_head_is_refused_by_the_trainer(reliability, tmp_path):
    """What `run_clm.py --use_peft --lora_target_modules c_attn lm_head` with `ipu_config_gpt2.json` meets."""
    model = lora("GPT2LMHeadModel", ["c_attn", "lm_head"])
    names = ("`lm_head`", "`projection_serialization_factor` (4)", "set `projection_serialization_factor` to 1")
    reliability.expect_clear_error(lambda: IPUTrainer(model, gpt2_config(), training_arguments(tmp_path)), names)


def test_adapter_on_the_embedding_tied_to_a_serialized_head_trains_as_stock():
    """Only the projection serialized, LoRA on GPT-2's `wte` (tied to `lm_head`, which peft leaves plain): allowed,
    and the chunked loss is the stock model's."""
    model = lora("GPT2LMHeadModel", ["c_attn", "wte"])
    inputs = tiny_inputs("GPT2LMHeadModel")
    inputs["labels"] = inputs["input_ids"]
    want = model(**inputs).loss
    pipelined = to_pipelined(model, gpt2_config(embedding_serialization_factor=1), parallelize=True).train()
    assert isinstance(model.get_output_embeddings(), SerializedLinear)
    assert not isinstance(model.get_input_embeddings(), SerializedEmbedding)
    torch.testing.assert_close(pipelined(**inputs).loss, want, atol=1e-5, rtol=0)


def test_adapter_on_the_head_with_stages_on_processes_is_refused_in_one_line(tmp_path, shared_data, tiny_pretrained):
    """Under torchrun the example loads its stage serialized (`load_stage` parallelizes): peft then stopped with
    'Target module SerializedLinear(...) is not supported'. `load_pretrained` hands the stock modules to peft, and
    the trainer refuses the pair in one line, exit code 2, on every process."""
    pytest.importorskip("peft", reason='the peft extra: pip install "optimum-ipu[peft]"')
    folder = shared_data / "wikitext2_tokens"
    out = tmp_path / "out"
    run = launch(
        *TORCHRUN,
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        str(REPO_ROOT / "examples" / "language-modeling" / "run_clm.py"),
        "--use_peft",
        "--lora_target_modules",
        "c_attn",
        "lm_head",
        "--model_name_or_path",
        str(tiny_pretrained("GPT2LMHeadModel")),
        "--ipu_config_name",
        str(GPT2_CONFIG),
        "--train_file",
        str(folder / "wiki.valid.tokens"),
        "--do_train",
        "--block_size",
        "32",
        "--max_train_samples",
        "16",
        "--per_device_train_batch_size",
        "2",
        "--output_dir",
        str(out),
        "--report_to",
        "none",
    )
    assert run.returncode != 0
    assert "is not supported" not in run.stderr, run.stderr[-3000:]
    refusals = [line for line in run.stderr.splitlines() if "carries a peft adapter" in line]
    assert len(refusals) == 2, run.stderr[-3000:]  # one line a process
    assert all("`projection_serialization_factor` (4)" in line and "`lm_head`" in line for line in refusals)
    assert "Traceback" not in run.stderr
