"""examples/example_utils: which dataset errors become the Hub-unreachable message, the closing summary."""

from __future__ import annotations

import json
import subprocess

import datasets
import example_utils  # installed with the package (`pip install -e ".[examples]"`), as the scripts import it
import pytest

from ..conftest import PYTHON


def raising(error: BaseException):
    def load_dataset(*args, **kwargs):
        raise error

    return load_dataset


@pytest.mark.parametrize(
    "error",
    [ConnectionError("Couldn't reach 'squad' on the Hub (OfflineModeIsEnabled)"), TimeoutError("read timed out")],
    ids=["offline", "timeout"],
)
def test_an_unreachable_hub_is_one_message_for_both_users(monkeypatch, error):
    monkeypatch.setattr(datasets, "load_dataset", raising(error))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(example_utils.HubUnreachableError) as caught:
        example_utils.load_hub_dataset("squad", "plain_text", local_files_hint="--train_file train.json")
    message = str(caught.value)
    assert message.startswith("--dataset_name squad (plain_text): not in the local datasets cache")
    assert "With a network: unset HF_HUB_OFFLINE and HF_DATASETS_OFFLINE" in message
    assert message.endswith("Without one: pass local files instead, --train_file train.json")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    with pytest.raises(example_utils.HubUnreachableError, match="With a network: check the network"):
        example_utils.load_hub_dataset("squad", local_files_hint="--train_file train.json")


@pytest.mark.parametrize(
    "error",
    [
        datasets.exceptions.DatasetNotFoundError("Dataset 'sqaud' doesn't exist on the Hub"),
        ValueError("BuilderConfig 'plain' not found. Available: ['plain_text']"),
    ],
    ids=["misspelt", "bad-config"],
)
def test_other_errors_are_raised_as_datasets_raises_them(monkeypatch, error):
    monkeypatch.setattr(datasets, "load_dataset", raising(error))
    with pytest.raises(type(error)) as caught:
        example_utils.load_hub_dataset("sqaud", local_files_hint="--train_file train.json")
    assert caught.value is error


def test_closing_summary(tmp_path):
    (tmp_path / "all_results.json").write_text(
        json.dumps({"eval_exact_match": 33.92, "eval_f1": 48.26, "train_features_per_second": 8.64, "epoch": 1.0})
    )
    (tmp_path / "training_curves.png").write_bytes(b"\x89PNG")
    summary = example_utils.run_summary(tmp_path)
    assert summary.splitlines() == [
        f"Run in {tmp_path.resolve()}:",
        "  exact match (EM)         33.92",
        "  F1                       48.26",
        "  training features / s    8.64",
        f"  metrics                  {tmp_path.resolve() / 'all_results.json'}",
        f"  training curves          {tmp_path.resolve() / 'training_curves.png'}",
    ]
    run = subprocess.run(
        [PYTHON, "-m", "example_utils", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        env={"PATH": ""},  # no PYTHONPATH: the installed module
        timeout=120,
    )
    assert run.returncode == 1 and "no all_results.json; the run did not finish" in run.stderr


def test_a_vocabulary_to_grow_loads_the_whole_model_with_a_line_saying_why(monkeypatch, caplog, tmp_path):
    """With stages on processes each process loads its stage only, unless the tokenizer is larger than the
    checkpoint's vocabulary: `resize_token_embeddings` then needs the whole embedding matrix (mean resizing)."""
    import transformers

    from optimum_ipu import IPUConfig

    from ..tiny_models import tiny_model

    tiny_model("LlamaForCausalLM").save_pretrained(tmp_path)
    config = transformers.AutoConfig.from_pretrained(tmp_path)

    class Args:  # what load_pretrained asks of IPUTrainingArguments
        @staticmethod
        def load_ipu_config() -> IPUConfig:
            return IPUConfig(layers_per_ipu=[1, 1], ipus_per_replica=2)

    monkeypatch.setenv("WORLD_SIZE", "2")
    with caplog.at_level("WARNING", logger="example_utils"):
        model = example_utils.load_pretrained(
            transformers.AutoModelForCausalLM, str(tmp_path), Args(), config.vocab_size + 3, config=config
        )
    assert not any(p.is_meta for p in model.parameters())  # whole, to be resized
    assert f"its embeddings ({config.vocab_size} rows) grow to the tokenizer's {config.vocab_size + 3}" in caplog.text
    model.resize_token_embeddings(config.vocab_size + 3)
    assert model.get_output_embeddings().weight.shape[0] == config.vocab_size + 3
