"""The SQuAD data utilities of examples/question-answering: loader, features, post-processing and metric."""

from __future__ import annotations

import json
import sys
import types
import unicodedata

import datasets
import numpy as np
import pytest

from ..conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "examples" / "question-answering"))
import utils_qa  # noqa: E402

SQUAD_FILE = ("squad", "squad-v1.1-dev-articles-00-39.json")
MAX_LEN, STRIDE = 64, 16  # small windows, so that ordinary SQuAD paragraphs span several features


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def squad_path(shared_data):
    return shared_data.joinpath(*SQUAD_FILE)


def _record(rid: str, context: str, question: str, answer: str | None) -> dict:
    starts = [] if answer is None else [context.index(answer)]
    texts = [] if answer is None else [answer]
    return {
        "id": rid,
        "title": "T",
        "context": context,
        "question": question,
        "answers": {"text": texts, "answer_start": starts},
    }


def _write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def _one(example: dict) -> dict:
    """A batch of one example, as `Dataset.map(batched=True)` passes it."""
    return {k: [v] for k, v in example.items()}


def _norm(text: str) -> str:
    # The uncased MiniLM tokenizer lowercases and strips accents, and decoding re-spaces punctuation.
    text = unicodedata.normalize("NFD", text.lower())
    return "".join(ch for ch in text if not ch.isspace() and unicodedata.category(ch) != "Mn")


# --- metric -----------------------------------------------------------------------------------------------------


def test_squad_metrics_known_values():
    examples = [
        {"id": "exact", "answers": {"text": ["Denver Broncos"], "answer_start": [0]}},
        {"id": "partial", "answers": {"text": ["Denver Broncos"], "answer_start": [0]}},
        {"id": "normalised", "answers": {"text": ["broncos"], "answer_start": [0]}},
        {"id": "two_golds", "answers": {"text": ["Denver Broncos", "Broncos of Denver city"], "answer_start": [0, 0]}},
    ]
    predictions = {
        "exact": "Denver Broncos",  # EM 1, F1 1
        # "the" is dropped: pred {denver, broncos, team} vs gold {denver, broncos}: P = 2/3, R = 1,
        # F1 = 2 * (2/3 * 1) / (2/3 + 1) = 0.8; EM 0
        "partial": "the Denver Broncos team",
        "normalised": "The Broncos!",  # lower case, no article, no punctuation -> "broncos": EM 1, F1 1
        # best over the golds: vs "Denver Broncos" P = 1, R = 1/2, F1 = 2/3; vs "Broncos of Denver city"
        # P = 1, R = 1/4, F1 = 0.4 -> 2/3; EM 0
        "two_golds": "Denver",
    }
    scores = utils_qa.squad_metrics(predictions, examples)
    assert set(scores) == {"exact_match", "f1"}
    assert scores["exact_match"] == pytest.approx(100 * 2 / 4, abs=1e-4)
    assert scores["f1"] == pytest.approx(100 * (1 + 0.8 + 1 + 2 / 3) / 4, abs=1e-4)  # 86.667
    assert all(isinstance(v, float) for v in scores.values())


def test_squad_metrics_unanswerable_missing_and_unknown():
    examples = datasets.Dataset.from_dict(
        {"id": ["none", "missing"], "answers": [{"text": [], "answer_start": []}, {"text": ["x"], "answer_start": [0]}]}
    )
    # An empty prediction for an unanswerable question is right (SQuAD v2); a missing prediction scores 0.
    with pytest.warns(UserWarning, match="missing"):
        assert utils_qa.squad_metrics({"none": ""}, examples) == pytest.approx({"exact_match": 50.0, "f1": 50.0})
    assert utils_qa.squad_metrics({"none": "something", "missing": "x"}, examples)["exact_match"] == pytest.approx(50)
    with pytest.raises(ValueError, match="stray"):
        utils_qa.squad_metrics({"stray": "x"}, examples)


def test_squad_v2_official_keys_and_values():
    """Hand-computed with the official SQuAD v2.0 rules (article dropping, HasAns/NoAns split, best threshold)."""
    examples = datasets.Dataset.from_dict(
        {
            "id": ["cat", "paris", "none-right", "none-wrong", "article-only"],
            "answers": [
                {"text": ["the cat", "a cat sat"], "answer_start": [0, 0]},
                {"text": ["Paris France"], "answer_start": [0]},
                {"text": [], "answer_start": []},
                {"text": [], "answer_start": []},
                {"text": ["The"], "answer_start": [0]},  # normalises to nothing: only "" is right
            ],
        }
    )
    predictions = {"cat": "Cat!", "paris": "paris", "none-right": "", "none-wrong": "London", "article-only": ""}
    scores = utils_qa.squad_v2_metrics(predictions, examples)
    expected = {
        "exact": 100 * 3 / 5,
        "f1": 100 * (1 + 2 / 3 + 1 + 0 + 1) / 5,
        "total": 5,
        "HasAns_exact": 100 * 2 / 3,
        "HasAns_f1": 100 * (1 + 2 / 3 + 1) / 3,
        "HasAns_total": 3,
        "NoAns_exact": 50.0,
        "NoAns_f1": 50.0,
        "NoAns_total": 2,
        # no-answer probabilities all 0.0 (as upstream passes): start from the 2 unanswerable questions counted
        # right, add each question's score in order (-1 for a wrong unanswerable one), keep the best running total:
        # 2 -> 3 -> 3 -> 3 -> 2 -> 3 (exact), 2 -> 3 -> 3.67 -> 3.67 -> 2.67 -> 3.67 (F1)
        "best_exact": 100 * 3 / 5,
        "best_exact_thresh": 0.0,
        "best_f1": 100 * (3 + 2 / 3) / 5,
        "best_f1_thresh": 0.0,
    }
    assert scores == pytest.approx(expected)
    assert list(scores) == list(expected)  # the upstream key order
    with pytest.raises(ValueError, match="1 of 5 questions have no prediction"):
        utils_qa.squad_v2_metrics({k: v for k, v in predictions.items() if k != "cat"}, examples)
    with pytest.raises(ValueError, match="stray"):
        utils_qa.squad_v2_metrics({**predictions, "stray": "x"}, examples)


# --- post-processing --------------------------------------------------------------------------------------------

FILLER = "the quick brown fox jumps over the lazy dog near the river bank. "
ANSWER = "Captain Amelia Hartwell"
# ~60 context tokens before the answer: past the first window (~53 context tokens), before the third one starts.
LONG_CONTEXT = FILLER * 4 + f"The ship was commanded by {ANSWER} during the storm. " + FILLER * 6


def _validation_features(tokenizer, examples: datasets.Dataset) -> datasets.Dataset:
    return examples.map(
        utils_qa.prepare_validation_features,
        fn_kwargs={"tokenizer": tokenizer, "max_seq_length": MAX_LEN, "doc_stride": STRIDE},
        batched=True,
        remove_columns=examples.column_names,
    )


def test_postprocess_finds_the_answer_in_the_second_feature(tokenizer, tmp_path):
    examples = datasets.Dataset.from_list([_record("ship", LONG_CONTEXT, "  Who commanded the ship?", ANSWER)])
    features = _validation_features(tokenizer, examples)
    start_char = LONG_CONTEXT.index(ANSWER)
    end_char = start_char + len(ANSWER)

    assert len(features) >= 3 and set(features["example_id"]) == {"ship"}
    assert all(len(ids) == MAX_LEN for ids in features["input_ids"])
    holding = []  # features whose context tokens cover the whole answer, with its token span there
    for f, offsets in enumerate(features["offset_mapping"]):
        starts = [k for k, o in enumerate(offsets) if o is not None and o[0] == start_char]
        ends = [k for k, o in enumerate(offsets) if o is not None and o[1] == end_char]
        if starts and ends:
            holding.append((f, starts[0], ends[0]))
    assert [f for f, _, _ in holding] == [1], "the test context must put the answer in the second feature only"
    _, tok_start, tok_end = holding[0]

    rng = np.random.default_rng(0)
    start_logits = rng.normal(size=(len(features), MAX_LEN)).astype(np.float32)
    end_logits = rng.normal(size=(len(features), MAX_LEN)).astype(np.float32)
    start_logits[1, tok_start] = end_logits[1, tok_end] = 10.0
    # A weaker decoy span in the first feature: the best span must be chosen over all the features.
    first_ctx = [k for k, o in enumerate(features[0]["offset_mapping"]) if o is not None]
    start_logits[0, first_ctx[2]] = end_logits[0, first_ctx[4]] = 8.0

    predictions = utils_qa.postprocess_qa_predictions(
        examples, features, (start_logits, end_logits), output_dir=tmp_path, prefix="eval"
    )
    assert predictions == {"ship": ANSWER}
    assert json.loads((tmp_path / "eval_predictions.json").read_text()) == {"ship": ANSWER}
    nbest = json.loads((tmp_path / "eval_nbest_predictions.json").read_text())["ship"]
    assert nbest[0]["text"] == ANSWER and nbest[0]["probability"] > 0.5 and len(nbest) <= 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval_nbest_predictions.json", "eval_predictions.json"]

    # SQuAD v2: when every feature prefers CLS by more than the threshold, the answer is null.
    start_logits[:, 0] = end_logits[:, 0] = 20.0
    null = utils_qa.postprocess_qa_predictions(examples, features, (start_logits, end_logits), True)
    assert null == {"ship": ""}


def test_postprocess_rejects_mismatched_predictions(tokenizer):
    examples = datasets.Dataset.from_list([_record("ship", LONG_CONTEXT, "Who?", ANSWER)])
    features = _validation_features(tokenizer, examples)
    logits = np.zeros((len(features) - 1, MAX_LEN), dtype=np.float32)
    with pytest.raises(ValueError, match="predictions"):
        utils_qa.postprocess_qa_predictions(examples, features, (logits, logits))


# --- training features ------------------------------------------------------------------------------------------


def test_train_features_positions_on_real_squad(tokenizer, squad_path):
    examples = utils_qa.load_squad_json(squad_path, slice(0, 1)).select(range(40))
    checked = later_window = 0
    for example in examples:
        start = example["answers"]["answer_start"][0]
        answer = example["answers"]["text"][0]
        context = example["context"]
        # Token positions can only reproduce an answer that starts and ends on word boundaries ("gold" in "golden").
        if (start > 0 and context[start - 1].isalnum()) or context[
            start + len(answer) : start + len(answer) + 1
        ].isalnum():
            continue
        feats = utils_qa.prepare_train_features(_one(example), tokenizer, MAX_LEN, STRIDE, pad_to_max_length=False)
        assert all(len(ids) <= MAX_LEN for ids in feats["input_ids"])
        labelled = [i for i, s in enumerate(feats["start_positions"]) if s != 0]  # 0 is CLS for BERT
        assert labelled, f"{example['id']}: no feature holds the answer"
        for i in labelled:
            s, e = feats["start_positions"][i], feats["end_positions"][i]
            assert 0 < s <= e < len(feats["input_ids"][i])
            assert _norm(tokenizer.decode(feats["input_ids"][i][s : e + 1])) == _norm(answer), example["id"]
        # Features not holding the answer point at CLS for both ends.
        assert all(feats["end_positions"][i] == 0 for i, s in enumerate(feats["start_positions"]) if s == 0)
        later_window += labelled[0] > 0
        checked += 1
    assert checked >= 30
    assert later_window >= 1, "no answer past the first window: the windows are not being exercised"

    padded = utils_qa.prepare_train_features(examples[:8], tokenizer, MAX_LEN, STRIDE)
    assert len(padded["input_ids"]) > 8 and all(len(ids) == MAX_LEN for ids in padded["input_ids"])
    assert len(padded["start_positions"]) == len(padded["end_positions"]) == len(padded["input_ids"])


def test_prepare_features_refuses_slow_tokenizers_and_overlong_questions(tokenizer):
    batch = _one(_record("q1", "some context here", "what?", "context"))
    slow = types.SimpleNamespace(is_fast=False, padding_side="right")
    with pytest.raises(ValueError, match="fast tokenizer"):
        utils_qa.prepare_train_features(batch, slow, MAX_LEN, STRIDE)
    batch["question"] = ["why " * 60]  # no room left for a context window longer than the stride
    with pytest.raises(ValueError, match="q1"):
        utils_qa.prepare_validation_features(batch, tokenizer, MAX_LEN, STRIDE)


# --- loader -----------------------------------------------------------------------------------------------------


def test_load_nested_articles_slice(squad_path):
    raw = json.loads(squad_path.read_text(encoding="utf-8"))["data"][34:40]
    expected_ids = [qa["id"] for article in raw for p in article["paragraphs"] for qa in p["qas"]]

    ds = utils_qa.load_squad_json(squad_path, articles=slice(34, 40))
    assert ds.column_names == ["id", "title", "context", "question", "answers"]
    assert len(ds) == len(expected_ids) and ds["id"] == expected_ids
    assert list(dict.fromkeys(ds["title"])) == [article["title"] for article in raw]
    first = raw[0]["paragraphs"][0]["qas"][0]
    assert ds[0]["answers"] == {
        "text": [a["text"] for a in first["answers"]],
        "answer_start": [a["answer_start"] for a in first["answers"]],
    }


def test_load_flat_jsonl_keeps_non_ascii_and_empty_contexts(tmp_path):
    records = [
        _record("zh", "Die Stadt Zürich liegt am Zürichsee; 東京 ist weit weg.", "Wo liegt Zürich?", "am Zürichsee"),
        _record("empty", "", "Is there anything here?", None),
    ]
    path = tmp_path / "flat.jsonl"
    _write_jsonl(path, records)
    ds = utils_qa.load_squad_json(path)
    assert ds.to_list() == records

    # The same records as a JSON document with a "data" list (the flat layout of the Hub's squad exports).
    doc = tmp_path / "flat.json"
    doc.write_text(json.dumps({"version": "x", "data": records}), encoding="utf-8")
    assert utils_qa.load_squad_json(doc).to_list() == records
    with pytest.raises(ValueError, match="articles"):
        utils_qa.load_squad_json(doc, articles=slice(0, 1))


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda r: r.pop("question"), r"'bad-1'.*'question'"),
        (lambda r: r.update(question=7), r"'bad-1'.*'question'"),
        (lambda r: r["answers"].update(answer_start=["3"]), r"'bad-1'.*answer_start"),
        (lambda r: r["answers"].update(answer_start=[0]), r"'bad-1'.*answers"),  # span not in the context
        (lambda r: r.pop("id"), r"record #1.*'id'"),
    ],
)
def test_load_flat_rejects_bad_records(tmp_path, mutate, match):
    good, bad = _record("ok-0", "alpha beta", "b?", "beta"), _record("bad-1", "gamma delta", "d?", "delta")
    mutate(bad)
    path = tmp_path / "bad.jsonl"
    _write_jsonl(path, [good, bad])
    with pytest.raises(ValueError, match=match):
        utils_qa.load_squad_json(path)


def test_load_nested_missing_question_names_the_id(tmp_path):
    qas = [{"id": "nq-1", "answers": [{"text": "beta", "answer_start": 6}]}]
    path = tmp_path / "nested.json"
    path.write_text(json.dumps({"data": [{"title": "A", "paragraphs": [{"context": "alpha beta", "qas": qas}]}]}))
    with pytest.raises(ValueError, match=r"'nq-1'.*'question'"):
        utils_qa.load_squad_json(path)


def test_empty_context_gives_cls_features(tokenizer, tmp_path):
    path = tmp_path / "empty.jsonl"
    _write_jsonl(path, [_record("empty", "", "Is there anything here?", None)])
    examples = utils_qa.load_squad_json(path)
    kwargs = {"tokenizer": tokenizer, "max_seq_length": MAX_LEN, "doc_stride": STRIDE}
    train = examples.map(utils_qa.prepare_train_features, fn_kwargs=kwargs, batched=True, remove_columns=["id"])
    assert len(train) == 1 and train[0]["start_positions"] == train[0]["end_positions"] == 0
    features = _validation_features(tokenizer, examples)
    assert all(o is None for o in features[0]["offset_mapping"])
    logits = np.zeros((len(features), MAX_LEN), dtype=np.float32)
    predictions = utils_qa.postprocess_qa_predictions(examples, features, (logits, logits))
    assert list(predictions) == ["empty"]  # no span to pick: HF's placeholder answer, but no crash
