"""run_clm.py end to end: a tiny GPT-2 on the real WikiText-2 files (valid to train, test to evaluate)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest
from example_utils.language_modeling import ModelArguments, check_data_arguments, load_raw_datasets, sequence_length
from safetensors import safe_open

from ..conftest import REPO_ROOT
from ..helpers import run_example

LM_DIR = REPO_ROOT / "examples" / "language-modeling"
sys.path.insert(0, str(LM_DIR))  # the scripts import as modules (their dataclasses), as upstream's tests do


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    return run_example(LM_DIR, script, *args)


def wikitext_files(shared_data) -> list[str]:
    folder = shared_data / "wikitext2_tokens"
    return ["--train_file", str(folder / "wiki.valid.tokens"), "--validation_file", str(folder / "wiki.test.tokens")]


def tensor_names(path) -> set[str]:
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


def test_gpt2_trains_on_wikitext_with_serialized_projection(tmp_path, shared_data, tiny_pretrained):
    model_dir = tiny_pretrained("GPT2LMHeadModel")
    out = tmp_path / "output"
    result = run_script(
        "run_clm.py",
        "--model_name_or_path",
        str(model_dir),
        *wikitext_files(shared_data),
        "--ipu_config_name",
        "./ipu_config_gpt2.json",
        "--ipu_config_overrides",
        "projection_serialization_factor=2,gradient_accumulation_steps=1",
        "--do_train",
        "--do_eval",
        "--block_size",
        "32",
        "--max_train_samples",
        "160",
        "--max_eval_samples",
        "24",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "1",
        "--logging_steps",
        "1",
        "--seed",
        "3",
        "--output_dir",
        str(out),
        "--report_to",
        "none",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    everything = json.loads((out / "all_results.json").read_text())
    assert (out / "training_curves.png").read_bytes()[:4] == b"\x89PNG"  # beside all_results.json
    card = (out / "README.md").read_text()  # the model card upstream's scripts end with
    assert f"This model is a fine-tuned version of [{model_dir}]" in card
    evaluation = json.loads((out / "eval_results.json").read_text())
    expected = {
        "train_loss",
        "train_samples",
        "train_samples_per_second",
        "eval_loss",
        "eval_accuracy",
        "eval_samples",
        "perplexity",
    }
    assert expected <= set(everything), expected - set(everything)
    assert {"eval_loss", "perplexity"} <= set(evaluation)
    assert everything["perplexity"] == pytest.approx(math.exp(everything["eval_loss"]), rel=1e-9)
    assert everything["train_samples"] == 160 and everything["eval_samples"] == 24
    assert 0.0 <= everything["eval_accuracy"] <= 1.0
    # Trained from a random 1,000-token model: far below the vocabulary-size perplexity of a uniform guess.
    assert everything["perplexity"] < 1000
    # The IPU config of the run: the file's recompute and layout, the command line's overrides.
    saved = json.loads((out / "ipu_config.json").read_text())
    assert saved["projection_serialization_factor"] == 2 and saved["gradient_accumulation_steps"] == 1
    assert saved["embedding_serialization_factor"] == 4 and saved["recompute_checkpoint_every_layer"] is True
    # The saved model is the stock transformers layout: the same tensors as the model it started from.
    assert tensor_names(out) == tensor_names(model_dir)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 40  # 160 blocks, full batches of 4, one micro-batch per step
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (first, last)


def data_args(**kwargs) -> SimpleNamespace:
    defaults = {
        "dataset_name": None,
        "dataset_config_name": None,
        "train_file": None,
        "validation_file": None,
        "validation_split_percentage": 5,
        "keep_linebreaks": True,
    }
    return SimpleNamespace(**{**defaults, **kwargs})


def test_lone_train_file_is_split_by_validation_split_percentage(shared_data):
    path = str(shared_data / "wikitext2_tokens" / "wiki.valid.tokens")
    model_args = SimpleNamespace(cache_dir=None, token=None)
    raw = load_raw_datasets(data_args(train_file=path, validation_split_percentage=10), model_args)
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()  # line breaks kept, as --keep_linebreaks does by default
    assert len(raw["validation"]) == len(lines) // 10 and len(raw["train"]) == len(lines) - len(lines) // 10
    assert raw["validation"]["text"] == lines[: len(lines) // 10] and raw["train"]["text"] == lines[len(lines) // 10 :]


def test_help_of_both_scripts_lists_the_transformers_flags():
    from run_clm import DataTrainingArguments as ClmData
    from run_mlm import DataTrainingArguments as MlmData
    from transformers import HfArgumentParser

    from optimum_ipu import IPUTrainingArguments

    scripts = {
        ClmData: ["--block_size", "--keep_linebreaks"],
        MlmData: ["--mlm_probability", "--line_by_line", "--pad_to_max_length", "--max_seq_length"],
    }
    for data, flags in scripts.items():
        text = HfArgumentParser((ModelArguments, data, IPUTrainingArguments)).format_help()
        for flag in (
            "--model_type",
            "--config_overrides",
            "--validation_split_percentage",
            "--ipu_config_name",
            *flags,
        ):
            assert flag in text, flag


def test_bad_inputs_are_clear_errors(tmp_path, shared_data):
    with pytest.raises(
        ValueError, match="give --dataset_name .*Salesforce/wikitext.* or local files, e.g. --train_file"
    ):
        check_data_arguments(data_args())
    bad = tmp_path / "corpus.parquet"
    bad.write_text("x")
    with pytest.raises(ValueError, match=r"--train_file .*corpus.parquet: expected a csv, .* file"):
        check_data_arguments(data_args(train_file=str(bad)))
    with pytest.raises(ValueError, match="--validation_split_percentage 100"):
        check_data_arguments(data_args(train_file=str(tmp_path / "a.txt"), validation_split_percentage=100))
    tokenizer = SimpleNamespace(model_max_length=1024)
    config = SimpleNamespace(model_type="gpt2", max_position_embeddings=128)
    with pytest.raises(ValueError, match="--block_size 256: the model has only 128 positions; use at most 128"):
        sequence_length(256, "block_size", tokenizer, config)
    assert sequence_length(None, "block_size", tokenizer, config) == 128
    roberta = SimpleNamespace(model_type="roberta", max_position_embeddings=514, pad_token_id=1)
    assert sequence_length(None, "max_seq_length", SimpleNamespace(model_max_length=10**30), roberta) == 512
    with pytest.raises(ValueError, match="--model_type gpt3: unknown"):
        ModelArguments(model_type="gpt3")
    with pytest.raises(ValueError, match="--config_overrides can't be used in combination with --config_name"):
        ModelArguments(model_name_or_path="some-model", config_overrides="n_layer=2")
    with pytest.raises(ValueError, match="give --model_name_or_path, or --model_type"):
        ModelArguments()
    model_args = SimpleNamespace(cache_dir=str(tmp_path / "cache"), token=None)
    with pytest.raises(
        ConnectionError, match="--dataset_name wikitext .*not in the local datasets cache.*--train_file"
    ):
        load_raw_datasets(data_args(dataset_name="wikitext", dataset_config_name="wikitext-2-raw-v1"), model_args)


def test_llama_with_grouped_query_attention_trains_on_wikitext_in_2_stages(tmp_path, shared_data):
    """A tiny LlamaForCausalLM (4 heads sharing 2 key/value heads, rotary positions) in 2 pipeline stages."""
    import transformers

    from ..local_tokenizers import byte_level_bpe, save_tiny_pretrained

    model_dir = save_tiny_pretrained(tmp_path / "tiny-llama", "LlamaForCausalLM", byte_level_bpe(shared_data, "llama"))
    config = transformers.AutoConfig.from_pretrained(model_dir)
    assert config.model_type == "llama" and config.num_key_value_heads < config.num_attention_heads
    out = tmp_path / "output"
    result = run_script(
        "run_clm.py",
        "--model_name_or_path",
        str(model_dir),
        *wikitext_files(shared_data),
        "--ipu_config_name",
        "./ipu_config_gpt2.json",
        "--ipu_config_overrides",
        "layers_per_ipu=[2 2],embedding_serialization_factor=1,gradient_accumulation_steps=1",
        "--do_train",
        "--do_eval",
        "--block_size",
        "32",
        "--max_train_samples",
        "160",
        "--max_eval_samples",
        "24",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "4",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "1",
        "--logging_steps",
        "1",
        "--seed",
        "3",
        "--output_dir",
        str(out),
        "--report_to",
        "none",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    everything = json.loads((out / "all_results.json").read_text())
    assert {"eval_loss", "perplexity"} <= set(json.loads((out / "eval_results.json").read_text()))
    assert everything["perplexity"] == pytest.approx(math.exp(everything["eval_loss"]), rel=1e-9)
    assert everything["train_samples"] == 160 and everything["perplexity"] < 1000
    saved = json.loads((out / "ipu_config.json").read_text())
    assert saved["layers_per_ipu"] == [2, 2] and saved["ipus_per_replica"] == 2
    assert tensor_names(out) == tensor_names(model_dir)  # the stock Llama layout, k/v projections included
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 40  # 160 blocks, full batches of 4, one micro-batch per step
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (first, last)


def test_use_peft_trains_lora_adapters_and_saves_peft_files(tmp_path, shared_data, tiny_pretrained):
    """`--use_peft` with TRL's LoRA flags: only the adapters train (recompute and embedding serialization on, as the
    GPT-2 config has them), and the output folder holds peft's adapter files, which load onto the base model."""
    peft = pytest.importorskip("peft")
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model_dir = tiny_pretrained("GPT2LMHeadModel")
    out = tmp_path / "output"
    lora = ["--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0"]
    lora += ["--lora_target_modules", "c_attn"]
    result = run_script(
        "run_clm.py",
        *lora,
        "--model_name_or_path",
        str(model_dir),
        *wikitext_files(shared_data),
        "--ipu_config_name",
        "./ipu_config_gpt2.json",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=1",
        "--do_train",
        "--do_eval",
        "--block_size",
        "32",
        "--max_train_samples",
        "80",
        "--max_eval_samples",
        "8",
        "--per_device_train_batch_size",
        "4",
        "--num_train_epochs",
        "1",
        "--learning_rate",
        "1e-2",
        "--logging_steps",
        "1",
        "--seed",
        "3",
        "--output_dir",
        str(out),
        "--report_to",
        "none",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    names = {p.name for p in out.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "ipu_config.json", "all_results.json"} <= names
    assert "model.safetensors" not in names  # the base model is not saved again
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["target_modules"] == ["c_attn"]
    adapters = load_file(out / "adapter_model.safetensors")
    assert adapters and all("lora_" in key for key in adapters)
    assert any(value.abs().max() > 0 for key, value in adapters.items() if "lora_B" in key)  # B starts at zero
    losses = [e["loss"] for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert len(losses) == 20 and sum(losses[-5:]) < sum(losses[:5])
    reloaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(out))
    state = reloaded.state_dict()
    for key, value in adapters.items():  # peft's own loader reads them back
        torch.testing.assert_close(state[key.replace(".weight", ".default.weight")], value, atol=0, rtol=0)


def test_use_peft_without_peft_names_the_extra(monkeypatch):
    from example_utils.peft import PeftArguments, maybe_wrap_with_lora

    monkeypatch.setitem(sys.modules, "peft", None)  # as if not installed
    with pytest.raises(ImportError, match=r'pip install "optimum-ipu\[peft\]"'):
        maybe_wrap_with_lora(object(), PeftArguments(use_peft=True))
    model = object()
    assert maybe_wrap_with_lora(model, PeftArguments()) is model  # without --use_peft, peft is never imported
