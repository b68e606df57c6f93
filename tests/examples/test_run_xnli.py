"""run_xnli.py end to end with a tiny BERT: local files in XNLI's layout, a local dataset folder with one
configuration per language read through --dataset_name (the code path of the Hub's `xnli`), and the Hub's `xnli`
offline (one line, exit 2).

XNLI itself is not in the shared data. The files here are built from real sentence pairs in XNLI's columns
(premise, hypothesis, label) with labels that hold for them: GLUE MRPC's pairs (`shared/data/glue/MRPC`), a
paraphrase as `entailment` and a non-paraphrase as `neutral`; and Romanian news sentences of WMT16's newstest2016
(`shared/data/wmt16_en_ro`), a sentence with itself as `entailment` and with the next, unrelated one as `neutral`.
Neither has `contradiction` rows: they test the script's plumbing, not what it learns on XNLI.
"""

from __future__ import annotations

import csv
import gzip
import json
import subprocess

import pytest

from ..conftest import REPO_ROOT
from ..helpers import run_example

XNLI_DIR = REPO_ROOT / "examples" / "text-classification"
XNLI_LABELS = ["entailment", "neutral", "contradiction"]


def run_xnli(*args: str) -> subprocess.CompletedProcess:
    return run_example(XNLI_DIR, "run_xnli.py", *args, timeout=600)


def mrpc_rows(shared_data, split: str, count: int, names: bool = False) -> list[dict]:
    """The first `count` pairs of GLUE MRPC's `split` TSV in XNLI's columns (labels as ids, or as names)."""
    with open(shared_data / "glue" / "MRPC" / f"{split}.tsv", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:count]
    label = {"1": 0, "0": 1}  # paraphrase: entailment; not a paraphrase: neutral
    return [
        {
            "premise": row["#1 String"],
            "hypothesis": row["#2 String"],
            "label": XNLI_LABELS[label[row["Quality"]]] if names else label[row["Quality"]],
            "language": "en",
        }
        for row in rows
    ]


def romanian_rows(shared_data, count: int, names: bool = False) -> list[dict]:
    with gzip.open(shared_data / "wmt16_en_ro" / "newstest2016-enro.ro.gz", "rt", encoding="utf-8") as f:
        sentences = [line.strip() for _, line in zip(range(count + 1), f, strict=False)]
    return [
        {
            "premise": sentences[i],
            "hypothesis": sentences[i + (i % 2)],
            "label": XNLI_LABELS[i % 2] if names else i % 2,
            "language": "ro",
        }
        for i in range(count)
    ]


def write_jsonl(path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def common_flags(model, out) -> tuple[str, ...]:
    return (
        "--ipu_config_name=./",
        "--ipu_config_overrides",
        "gradient_accumulation_steps=1,inference_device_iterations=1",
        "--model_name_or_path",
        str(model),
        "--max_seq_length",
        "64",
        "--per_device_train_batch_size",
        "16",
        "--per_device_eval_batch_size",
        "8",
        "--seed",
        "0",
        "--logging_steps",
        "1",
        "--save_strategy",
        "no",
        "--output_dir",
        str(out),
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
    )


def test_local_files_in_xnli_layout_train_evaluate_and_predict(tmp_path, shared_data, tiny_pretrained):
    model = tiny_pretrained("BertForSequenceClassification")
    data = tmp_path / "data"
    # languages mixed in one file: --train_language en keeps the English pairs; labels given as names
    train = write_jsonl(
        data / "train.jsonl",
        mrpc_rows(shared_data, "train", 64, names=True) + romanian_rows(shared_data, 16, names=True),
    )
    validation = write_jsonl(
        data / "validation.jsonl", romanian_rows(shared_data, 24) + mrpc_rows(shared_data, "dev", 8)
    )
    test = write_jsonl(data / "test.jsonl", romanian_rows(shared_data, 6))
    out = tmp_path / "out"
    result = run_xnli(
        *common_flags(model, out),
        "--language",
        "ro",
        "--train_language",
        "en",
        "--train_file",
        train,
        "--validation_file",
        validation,
        "--test_file",
        test,
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--learning_rate",
        "3e-3",
        "--num_train_epochs",
        "10",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    everything = json.loads((out / "all_results.json").read_text())
    assert everything["train_samples"] == 64 and everything["eval_samples"] == 24  # en to train, ro to evaluate
    assert 0.0 <= everything["eval_accuracy"] <= 1.0 and everything["predict_samples"] == 6
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 40 and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.15  # it learns the 64 pairs
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "entailment", "1": "neutral", "2": "contradiction"}
    lines = (out / "predictions.txt").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 7
    assert all(line.split("\t")[1] in XNLI_LABELS for line in lines[1:])


def test_dataset_name_takes_a_configuration_per_language(tmp_path, shared_data, tiny_pretrained):
    """`--dataset_name` reads `load_dataset(name, language, split=...)`, as for the Hub's `xnli`: here a local dataset
    folder laid out as a Hub dataset repository (a README's `configs`, one per language)."""
    folder = tmp_path / "my-xnli"
    write_jsonl(folder / "en" / "train.jsonl", mrpc_rows(shared_data, "train", 32))
    write_jsonl(folder / "en" / "validation.jsonl", mrpc_rows(shared_data, "dev", 16))
    write_jsonl(folder / "ro" / "validation.jsonl", romanian_rows(shared_data, 10))
    (folder / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: en\n  data_files:\n  - split: train\n    path: en/train.jsonl\n"
        "  - split: validation\n    path: en/validation.jsonl\n"
        "- config_name: ro\n  data_files:\n  - split: validation\n    path: ro/validation.jsonl\n---\n"
    )
    out = tmp_path / "out"
    flags = common_flags(tiny_pretrained("BertForSequenceClassification"), out)
    result = run_xnli(
        *flags,
        "--dataset_name",
        str(folder),
        "--language",
        "ro",
        "--train_language",
        "en",
        "--do_train",
        "--do_eval",
        "--max_steps",
        "2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    everything = json.loads((out / "all_results.json").read_text())
    assert everything["train_samples"] == 32 and everything["eval_samples"] == 10


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--language", "de", "--do_eval"), "--dataset_name xnli (de): not in the local datasets cache"),
        (("--do_eval",), "--language: give the XNLI language to evaluate in"),
        (("--language", "de", "--validation_file", "VALIDATION", "--do_eval"), "--language de: --validation_file"),
        (("--language", "en", "--validation_file", "BAD", "--do_eval"), "label values ['maybe']"),
    ],
)
def test_bad_input_is_one_line(flags, message, tmp_path, shared_data, tiny_pretrained):
    validation = write_jsonl(tmp_path / "validation.jsonl", mrpc_rows(shared_data, "dev", 4))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"premise": "a", "hypothesis": "b", "label": "maybe"}])
    flags = [{"VALIDATION": validation, "BAD": bad}.get(flag, flag) for flag in flags]
    result = run_xnli(*common_flags(tiny_pretrained("BertForSequenceClassification"), tmp_path / "o"), *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert message in result.stderr.strip().splitlines()[-1]
