"""Bad SQuAD data: malformed records are one clear error naming the record; odd but valid records (answers past
max_seq_length, empty contexts, non-ASCII text) train and evaluate end to end; a run that fails on bad data leaves
output_dir exactly as it was. (Unit cases of the loader are in tests/examples/test_utils_qa.py.)"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ..conftest import REPO_ROOT
from ..helpers import run_example

QA_DIR = REPO_ROOT / "examples" / "question-answering"
sys.path.insert(0, str(QA_DIR))
import utils_qa  # noqa: E402

FILLER = "Nothing of note happened on this day in the small town by the river. "


def record(rid: str, context: str, question: str, answer: str | None) -> dict:
    starts = [] if answer is None else [context.rindex(answer)]
    return {
        "id": rid,
        "title": "T",
        "context": context,
        "question": question,
        "answers": {"text": [] if answer is None else [answer], "answer_start": starts},
    }


ODD_BUT_VALID = [
    # the answer sits far past max_seq_length (64 tokens): only a later doc_stride window holds it
    record(
        "long",
        FILLER * 12 + "The treasure is buried under the old oak tree.",
        "Where is the treasure?",
        "under the old oak tree",
    ),
    record("empty-context", "", "Is there anything here?", None),
    record("umlaut", "Die Stadt Zürich liegt am Zürichsee in der Schweiz.", "Wo liegt Zürich?", "am Zürichsee"),
    record("cjk", "東京は日本の首都です。 Tokyo is the capital of Japan.", "What is the capital of Japan?", "Tokyo"),
    record(
        "emoji", "The 🚀 rocket left from Cape Canaveral in 1969.", "Where did the rocket leave from?", "Cape Canaveral"
    ),
    record("arabic", "القاهرة هي عاصمة مصر. Cairo is the capital of Egypt.", "What is the capital of Egypt?", "Cairo"),
    record("plain-1", "Denver Broncos won Super Bowl 50 in 2016.", "Who won Super Bowl 50?", "Denver Broncos"),
    record(
        "plain-2",
        "The Amazon river flows through Brazil and Peru.",
        "Where does the Amazon flow?",
        "through Brazil and Peru",
    ),
]


def write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("bad-data")


@st.composite
def malformed_records(draw) -> tuple[dict, tuple[str, ...]]:
    """One record broken in one way, and what its error must name (the record id, else its position #1)."""
    rid = f"rec-{draw(st.integers(0, 999))}"
    context = draw(st.sampled_from([r["context"] for r in ODD_BUT_VALID if r["answers"]["text"]]))
    good = next(r for r in ODD_BUT_VALID if r["context"] == context)
    bad = {**json.loads(json.dumps(good)), "id": rid}
    answers = bad["answers"]
    start, text = answers["answer_start"][0], answers["text"][0]
    kind = draw(
        st.sampled_from(
            [
                "missing",
                "question_type",
                "context_type",
                "answers_type",
                "start_type",
                "start_off",
                "start_range",
                "lengths",
                "duplicate",
                "no_id",
                "id_type",
                "not_object",
            ]
        )
    )
    if kind == "missing":
        bad.pop(draw(st.sampled_from(["question", "context", "answers"])))
    elif kind == "question_type":
        bad["question"] = draw(st.sampled_from([7, None, ["why?"]]))
    elif kind == "context_type":
        bad["context"] = draw(st.sampled_from([3, None, {"text": context}]))
    elif kind == "answers_type":
        bad["answers"] = draw(st.sampled_from(["x", [], {"text": text, "answer_start": start}, {"text": [text]}]))
    elif kind == "start_type":
        answers["answer_start"] = [draw(st.sampled_from([str(start), float(start) + 0.5, None, True]))]
    elif kind == "start_off":  # the answer_start does not match the text
        shift = draw(
            st.sampled_from([-2, -1, 1, 2]).filter(lambda s: context[start + s : start + s + len(text)] != text)
        )
        answers["answer_start"] = [start + shift]
    elif kind == "start_range":
        answers["answer_start"] = [draw(st.sampled_from([-1, len(context), len(context) + 50]))]
    elif kind == "lengths":
        answers["text"] = [text, text]
    elif kind == "duplicate":  # the id of the first record of the file
        return dict(ODD_BUT_VALID[-1]), (ODD_BUT_VALID[-1]["id"],)
    elif kind == "no_id":
        bad.pop("id")
        return bad, ("#1",)
    elif kind == "id_type":
        bad["id"] = draw(st.sampled_from([5, None, ["a"]]))
        return bad, ("#1",)
    else:
        return draw(st.sampled_from([[rid], rid, 3])), ("#1",)
    return bad, (rid,)


@settings(max_examples=80, deadline=None)
@given(bad=malformed_records())
def test_malformed_record_is_one_error_naming_it(bad, reliability, folder):
    bad_record, names = bad
    path = folder / "train.jsonl"
    write_jsonl(path, [ODD_BUT_VALID[-1], bad_record])  # a good record first: the bad one is #1
    reliability.expect_clear_error(lambda: utils_qa.load_squad_json(path), names)


def test_file_that_is_not_utf8_names_the_file(tmp_path, reliability):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(ODD_BUT_VALID[2], ensure_ascii=False).encode("latin-1"))
    reliability.expect_clear_error(lambda: utils_qa.load_squad_json(path), ("latin1.jsonl",))


def run_qa(*args: str) -> subprocess.CompletedProcess:
    return run_example(QA_DIR, "run_qa.py", *args, timeout=900)


def snapshot(folder) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def test_odd_records_run_end_to_end_and_a_bad_record_leaves_output_dir_untouched(
    tmp_path, tiny_qa_model_dir, reliability
):
    data, out = tmp_path / "odd.jsonl", tmp_path / "output"
    write_jsonl(data, ODD_BUT_VALID)
    common = [
        "--model_name_or_path",
        str(tiny_qa_model_dir),
        "--do_train",
        "--do_eval",
        "--output_dir",
        str(out),
        "--overwrite_output_dir",
        "--per_device_train_batch_size",
        "2",
        "--per_device_eval_batch_size",
        "2",
        "--max_seq_length",
        "64",
        "--doc_stride",
        "32",
        "--num_train_epochs",
        "1",
        "--save_strategy",
        "no",
        "--report_to",
        "none",
        "--seed",
        "3",
    ]
    run = run_qa(*common, "--train_file", str(data), "--validation_file", str(data))
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "all_results.json").read_text())
    assert results["train_samples"] > len(ODD_BUT_VALID)  # the long context gave several doc_stride windows
    assert set(json.loads((out / "eval_predictions.json").read_text())) == {r["id"] for r in ODD_BUT_VALID}

    # The same output_dir, a validation file with one bad record: the run stops before writing anything.
    before = snapshot(out)
    bad_record = {**ODD_BUT_VALID[-1], "id": "bad-record-7", "answers": {"text": ["Peru"], "answer_start": [3]}}
    write_jsonl(tmp_path / "bad.jsonl", [*ODD_BUT_VALID, bad_record])
    run = run_qa(*common, "--train_file", str(data), "--validation_file", str(tmp_path / "bad.jsonl"))
    last = run.stderr.strip().splitlines()[-1]
    assert reliability.bad_input(run.returncode != 0 and "bad-record-7" in last and "answers" in last), last
    assert snapshot(out) == before, "a failed run changed output_dir"


@settings(max_examples=10, deadline=None)
@given(cut=st.floats(0.001, 0.999))
def test_a_truncated_nested_squad_file_says_where_it_broke(cut, tmp_path_factory, shared_data, reliability):
    """It was reported as "line 1 is not valid JSON" (read as JSON Lines after the document failed)."""
    text = (shared_data / "squad" / "squad-v1.1-dev-articles-00-39.json").read_text(encoding="utf-8")
    path = tmp_path_factory.mktemp("truncated") / "squad.json"
    path.write_text(text[: int(cut * len(text))], encoding="utf-8")
    err = reliability.expect_clear_error(lambda: utils_qa.load_squad_json(path), (str(path), "truncated?"))
    assert "line 1 is not valid JSON" not in str(err)
