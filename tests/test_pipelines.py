"""`optimum_ipu.pipelines`: encoder tasks equal `transformers`' own pipelines, static batching, question answering
with `run_qa.py`'s span selection, and the errors of `pipeline()`."""

from __future__ import annotations

import json
import sys

import datasets
import numpy as np
import pytest
import torch
import transformers

from optimum_ipu import IPUConfig
from optimum_ipu.errors import IncompatibleIPUConfigError
from optimum_ipu.pipelines import pipeline
from optimum_ipu.pipelines.question_answering import answer_span_candidates, nbest_with_probabilities

from .conftest import REPO_ROOT

TEXTS = [
    "the movie was a delight from start to finish",
    "I would not recommend this restaurant to anyone",
    "Paris is the capital of France and Berlin is the capital of Germany",
    "an unremarkable afternoon",
    "John Smith works for the United Nations in New York",
    "what a terrible, terrible idea",
    "ok",
]
# 2 rows per device x 2 inference device iterations: host batches of 4, so 7 inputs leave a last batch of 3.
CONFIG = IPUConfig(layers_per_ipu=[1, -1], inference_device_iterations=2)


def _load(auto_class: str, path):
    return getattr(transformers, auto_class).from_pretrained(path).eval(), transformers.AutoTokenizer.from_pretrained(
        path
    )


def _assert_same_results(ours, theirs, score_keys=("score",)):
    """Equal labels / words / offsets, scores equal within float tolerance (batches sum in another order)."""
    if isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            _assert_same_results(a, b, score_keys)
        return
    assert ours.keys() == theirs.keys()
    for key in theirs:
        if key in score_keys:
            torch.testing.assert_close(torch.tensor(ours[key]), torch.tensor(theirs[key]), rtol=1e-4, atol=1e-5)
        else:
            assert ours[key] == theirs[key], key


def _static_shapes(model):
    """Records the `input_ids` shape of every forward of `model`."""
    seen = []
    model.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return seen


def test_text_classification_equals_transformers_in_static_batches(tiny_pretrained):
    # 12 layers: the bundled Graphcore/bert-base-ipu layout [0, 4, 4, 4] fits, with its 5 inference iterations.
    model, tokenizer = _load(
        "AutoModelForSequenceClassification", tiny_pretrained("BertForSequenceClassification", num_hidden_layers=12)
    )
    theirs = transformers.pipeline("text-classification", model=model, tokenizer=tokenizer, device="cpu")
    # the eager engine at one bucket, the static length: every call the same shape
    ours = pipeline(
        "sentiment-analysis",
        model=model,
        tokenizer=tokenizer,
        ipu_config="Graphcore/bert-base-ipu",
        max_seq_length=24,
        backend="eager",
        buckets=[24],
    )
    assert ours.host_batch_rows() == 5 and ours.runner.backend == "eager"
    assert not ours.pipelined.training and ours.ipu_config.layers_per_ipu == [0, 4, 4, 4]
    seen = _static_shapes(model)
    batched = ours(TEXTS, top_k=None)
    assert set(seen) == {(1, 24)} and len(seen) == 10  # 2 host calls of 5 batches of one row
    _assert_same_results(batched, theirs(TEXTS, top_k=None))
    _assert_same_results(ours(TEXTS[0]), theirs(TEXTS[0]))  # a list of one dict, as transformers
    _assert_same_results(
        ours({"text": TEXTS[0], "text_pair": TEXTS[1]}), theirs({"text": TEXTS[0], "text_pair": TEXTS[1]})
    )

    small = pipeline(
        "text-classification", model=model, tokenizer=tokenizer, ipu_config=CONFIG, max_seq_length=32, backend="eager"
    )
    seen.clear()
    in_fours = small(TEXTS, batch_size=2, top_k=None)
    # 2 host calls of 2 batches of 2 rows, each padded to its bucket (the default buckets of 32: 16 and 32)
    assert small.runner.buckets == [16, 32] and {s[0] for s in seen} == {2} and len(seen) == 4
    assert {s[1] for s in seen} == {16}  # these texts are all short
    _assert_same_results(in_fours, [small(t, top_k=None) for t in TEXTS])
    streamed = small((t for t in TEXTS), batch_size=2, top_k=None)  # a generator in, an iterator out
    assert not isinstance(streamed, list)
    _assert_same_results(list(streamed), in_fours)
    _assert_same_results(in_fours, batched)
    with pytest.raises(ValueError, match="140 tokens, more than max_seq_length=24"):
        ours("word " * 138)


def test_token_classification_and_fill_mask_equal_transformers(tiny_pretrained):
    model, tokenizer = _load("AutoModelForTokenClassification", tiny_pretrained("BertForTokenClassification"))
    model.config.id2label = {0: "O", 1: "B-PER", 2: "I-PER"}
    model.config.label2id = {v: k for k, v in model.config.id2label.items()}
    theirs = transformers.pipeline("ner", model=model, tokenizer=tokenizer, device="cpu")
    ours = pipeline("ner", model=model, tokenizer=tokenizer, ipu_config=CONFIG, max_seq_length=24, batch_size=2)
    for strategy in ("none", "simple", "first"):
        _assert_same_results(ours(TEXTS, aggregation_strategy=strategy), theirs(TEXTS, aggregation_strategy=strategy))
    assert any(ours(TEXTS, aggregation_strategy="simple")), "the random model should tag something"

    model, tokenizer = _load("AutoModelForMaskedLM", tiny_pretrained("BertForMaskedLM"))
    theirs = transformers.pipeline("fill-mask", model=model, tokenizer=tokenizer, device="cpu")
    ours = pipeline("fill-mask", model=model, tokenizer=tokenizer, ipu_config=CONFIG, max_seq_length=24, batch_size=2)
    masked = [t.replace(" ", " [MASK] ", 1) for t in TEXTS[:5]]
    _assert_same_results(ours(masked, top_k=3), theirs(masked, top_k=3))
    _assert_same_results(ours(masked[0], targets=["paris", "city"]), theirs(masked[0], targets=["paris", "city"]))


def test_token_classification_takes_optimum_graphcores_tokenizer_keywords(tiny_pretrained):
    """`pipeline("ner", padding="max_length", max_length=N)` (Optimum Graphcore's NER notebook): inputs cut to N
    tokens, the same results as `max_seq_length=N`."""
    model, tokenizer = _load("AutoModelForTokenClassification", tiny_pretrained("BertForTokenClassification"))
    theirs = pipeline("ner", model=model, tokenizer=tokenizer, ipu_config=CONFIG, max_seq_length=24)
    ours = pipeline("ner", model=model, tokenizer=tokenizer, ipu_config=CONFIG, padding="max_length", max_length=24)
    assert ours.max_seq_length == 24
    _assert_same_results(ours(TEXTS), theirs(TEXTS))


def test_zero_shot_classification_equals_transformers(tiny_pretrained):
    model, tokenizer = _load("AutoModelForSequenceClassification", tiny_pretrained("RobertaForSequenceClassification"))
    model.config.id2label = {0: "contradiction", 1: "neutral", 2: "entailment"}
    model.config.label2id = {v: k for k, v in model.config.id2label.items()}
    theirs = transformers.pipeline("zero-shot-classification", model=model, tokenizer=tokenizer, device="cpu")
    ours = pipeline("zero-shot-classification", model=model, tokenizer=tokenizer, ipu_config=CONFIG, max_seq_length=48)
    labels = ["food", "travel", "politics"]
    for multi_label in (False, True):
        expected = theirs(TEXTS, candidate_labels=labels, multi_label=multi_label)
        _assert_same_results(ours(TEXTS, candidate_labels=labels, multi_label=multi_label), expected, ("scores",))
    # 3 labels per text: the 21 (text, label) pairs run in host batches of 4, the last one of 1 real row
    _assert_same_results(ours(TEXTS[2], labels), theirs(TEXTS[2], labels), ("scores",))


# --- question answering ------------------------------------------------------------------------------------------

sys.path.insert(0, str(REPO_ROOT / "examples" / "question-answering"))
import utils_qa  # noqa: E402

FILLER = "the quick brown fox jumps over the lazy dog near the river bank. "
QA_EXAMPLES = [
    {
        "id": "ship",
        "question": "Who commanded the ship?",
        "context": FILLER * 4 + "Captain Amelia Hartwell commanded the ship during the storm. " + FILLER * 6,
    },
    {"id": "short", "question": "Where is the Eiffel tower?", "context": "The Eiffel tower is in Paris, in France."},
    {"id": "empty", "question": "Is there anything here?", "context": ""},
    {"id": "year", "question": "When was it built?", "context": "It was built in 1889 for the World's Fair in Paris."},
]
MAX_LEN, STRIDE = 64, 16  # several windows for the long context


def _run_qa_postprocess(model_dir, version_2: bool, tmp_path):
    """run_qa.py's path: utils_qa features, the stock model's logits on them, postprocess_qa_predictions."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(model_dir).eval()
    examples = datasets.Dataset.from_list(
        [{**e, "title": "", "answers": {"text": [], "answer_start": []}} for e in QA_EXAMPLES]
    )
    features = examples.map(
        utils_qa.prepare_validation_features,
        fn_kwargs={"tokenizer": tokenizer, "max_seq_length": MAX_LEN, "doc_stride": STRIDE},
        batched=True,
        remove_columns=examples.column_names,
    )
    with torch.no_grad():
        out = model(**{k: torch.tensor(features[k]) for k in ("input_ids", "attention_mask", "token_type_ids")})
    # The padding of run_qa's features out of the n-best ranking, as in the pipeline, whose answers do not depend on
    # the length a batch is padded to (its bucket).
    padding = torch.tensor(features["attention_mask"]) == 0
    start, end = (logits.masked_fill(padding, -1e4).numpy() for logits in (out.start_logits, out.end_logits))
    predictions = utils_qa.postprocess_qa_predictions(
        examples, features, (start, end), version_2, 20, 15, 0.0, tmp_path
    )
    nbest = json.loads((tmp_path / "nbest_predictions.json").read_text())
    return predictions, nbest, len(features)


def test_question_answering_selects_the_spans_of_run_qa(tiny_qa_model_dir, tmp_path):
    qa = pipeline("question-answering", model=str(tiny_qa_model_dir), ipu_config=CONFIG, max_seq_length=MAX_LEN)
    inputs = [{"question": e["question"], "context": e["context"]} for e in QA_EXAMPLES]
    predictions, nbest, n_features = _run_qa_postprocess(tiny_qa_model_dir, False, tmp_path)
    assert n_features >= len(QA_EXAMPLES) + 3  # the long context spans several windows
    results = qa(inputs, top_k=3, doc_stride=STRIDE, batch_size=2)
    answered = 0
    for example, answers in zip(QA_EXAMPLES, results, strict=True):
        expected = [p for p in nbest[example["id"]] if p["text"] != "empty"]
        if not expected:  # no span at all (the empty context): run_qa's placeholder, the pipeline's empty answer
            assert predictions[example["id"]] == "empty"
            assert answers == [{"score": 0.0, "start": 0, "end": 0, "answer": ""}]
            continue
        answered += 1
        assert answers[0]["answer"] == predictions[example["id"]]
        assert [a["answer"] for a in answers] == [p["text"] for p in expected[:3]]
        torch.testing.assert_close([a["score"] for a in answers], [p["probability"] for p in expected[:3]])
        assert all(example["context"][a["start"] : a["end"]] == a["answer"] for a in answers)
    assert answered >= 2 and len(results[0]) == 3
    # One at a time (host batches of 3 filler rows) and the v4 call forms give the same answers.
    one = qa(question=QA_EXAMPLES[0]["question"], context=QA_EXAMPLES[0]["context"], doc_stride=STRIDE)
    assert one.keys() == {"score", "start", "end", "answer"} and one["answer"] == results[0][0]["answer"]
    torch.testing.assert_close(one["score"], results[0][0]["score"])
    assert qa(inputs[1], doc_stride=STRIDE)["answer"] == results[1][0]["answer"]
    questions, contexts = [i["question"] for i in inputs[1:]], [i["context"] for i in inputs[1:]]
    assert [r["answer"] for r in qa(question=questions, context=contexts, doc_stride=STRIDE)] == [
        r[0]["answer"] for r in results[1:]
    ]

    # handle_impossible_answer is SQuAD v2's null answer: the same choice as run_qa with version_2_with_negative.
    v2_predictions, _, _ = _run_qa_postprocess(tiny_qa_model_dir, True, tmp_path)
    v2 = qa(inputs, handle_impossible_answer=True, doc_stride=STRIDE)
    # (where no span exists, run_qa's placeholder "empty" is the pipeline's empty answer)
    assert [r["answer"] or "empty" for r in v2] == [v2_predictions[e["id"]] or "empty" for e in QA_EXAMPLES]
    # saved with its ipu_config.json, the pipeline comes back with the same layout and answers
    qa.save_pretrained(tmp_path / "saved")
    again = pipeline("question-answering", model=str(tmp_path / "saved"), max_seq_length=MAX_LEN)
    assert again.ipu_config == qa.ipu_config and again(inputs[0], doc_stride=STRIDE) == one
    with pytest.raises(ValueError, match="doc_stride=60"):
        qa(inputs[0], doc_stride=60)
    with pytest.raises(ValueError, match="max_seq_len"):
        qa(inputs[0], max_seq_len=384)


def test_answer_span_candidates_on_handcrafted_logits():
    context = "abc defgh ijklm nopq rstuv wxy"
    # Two overlapping features of one example; tokens 0-1 are CLS and the question (offset None), 6 is SEP.
    offsets = [
        [None, None, (0, 3), (4, 9), (10, 15), (16, 20), None],
        [None, None, (10, 15), (16, 20), (21, 26), (27, 30), None],
    ]
    background = -5.0 - 0.1 * np.arange(7)  # distinct low logits: no ties in the ordering
    start, end = np.tile(background, (2, 1)), np.tile(background, (2, 1))
    start[0, 6] = end[0, 6] = 9.0  # the highest logits, on a token outside the context: never a span end
    start[0, 2], end[0, 3] = 2.0, 8.0  # "abc defgh": 10
    start[0, 5] = 8.0  # with end[0, 3]: the end before the start, not a span
    start[1, 3], end[1, 4] = 7.0, 6.0  # "nopq rstuv": 13, the best, in the second feature
    start[:, 0] = end[:, 0] = [1.0, -1.0]  # CLS: the null answer takes the lowest over the features

    nbest, null = answer_span_candidates(start, end, offsets, n_best_size=20, max_answer_length=4)
    assert [c["offsets"] for c in nbest[:3]] == [(16, 26), (0, 9), (4, 9)]  # "defgh": end[0, 3] + start[0, 3]
    assert [c["score"] for c in nbest[:3]] == pytest.approx([13.0, 10.0, 8.0 - 5.3])
    assert null == {"offsets": (0, 0), "score": -2.0, "start_logit": -1.0, "end_logit": -1.0}
    assert all(c["offsets"] != (0, 0) for c in nbest) and len(nbest) <= 20
    one_token, _ = answer_span_candidates(start, end, offsets, n_best_size=20, max_answer_length=1)
    assert {c["offsets"] for c in one_token} <= {o for feature in offsets for o in feature if o is not None}
    # Only the n best positions of each end are tried: with 2, start 2 of "abc defgh" is not.
    two, _ = answer_span_candidates(start, end, offsets, n_best_size=2, with_null=True)
    assert [c["offsets"] for c in two] == [(16, 26), (0, 0)]
    one, _ = answer_span_candidates(start, end, offsets, n_best_size=1, with_null=True)
    assert [c["offsets"] for c in one] == [(16, 26), (0, 0)]  # the null answer is kept though out of the n best

    answers = nbest_with_probabilities(nbest[:3], context)
    assert [a["text"] for a in answers] == ["nopq rstuv", "abc defgh", "defgh"]
    assert sum(a["probability"] for a in answers) == pytest.approx(1.0) and "offsets" not in answers[0]
    assert answers[0]["probability"] == pytest.approx(1 / (1 + np.exp(-3.0) + np.exp(-(13.0 - 2.7))))
    assert nbest_with_probabilities([], "")[0]["text"] == "empty"


# --- pipeline() ----------------------------------------------------------------------------------------------------


def test_pipeline_errors_name_the_fix(tiny_pretrained, tiny_qa_model_dir):
    with pytest.raises(KeyError, match="did you mean 'text-classification'"):
        pipeline("text-clasification", model=str(tiny_qa_model_dir))
    with pytest.raises(KeyError, match="zero-shot-classification"):
        pipeline("image-to-text", model=str(tiny_qa_model_dir))
    with pytest.raises(ValueError, match="pass model="):
        pipeline("question-answering")
    with pytest.raises(IncompatibleIPUConfigError, match="'gpt2' model.*BertForMaskedLM"):
        pipeline("fill-mask", model=str(tiny_pretrained("GPT2LMHeadModel")))
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(tiny_qa_model_dir)
    with pytest.raises(IncompatibleIPUConfigError, match="text-classification.*BertForQuestionAnswering.*use one of"):
        pipeline("text-classification", model=model, tokenizer=str(tiny_qa_model_dir))
    with pytest.raises(ValueError, match="max_seq_length=1000.*512 positions"):
        pipeline("question-answering", model=model, max_seq_length=1000)
    with pytest.raises(ValueError, match="precision"):
        pipeline("question-answering", model=model, precision="fp8")
    with pytest.raises(IncompatibleIPUConfigError, match="layers_per_ipu"):
        pipeline("question-answering", model=model, ipu_config={"layers_per_ipu": [1, 1, 1]})
    # defaults: the tokenizer of the folder the model object came from; v4's 384-token windows, one row per batch
    default = pipeline("question-answering", model=model)
    assert default.max_seq_length == 384 and default.host_batch_rows() == 1 and default.engine.precision == "fp32"
    qa = pipeline("question-answering", model=model, max_seq_length=48, bf16=True)
    assert qa.engine.precision == "bf16" and qa(question="Who?", context="Ann and Bob.")["answer"] in "Ann and Bob."


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_question_windows_are_the_tokenizers_own(tokenizer_for, shared_data, family):
    """`encode_windows` (the pipeline's encoding through the `tokenizers` backend) gives exactly the windows of
    `tokenizer(..., return_overflowing_tokens=True)`: ids, type ids, masks, offsets and sequence ids, on real SQuAD
    pairs whose long contexts overflow, context first too; and the tokenizer's later calls are unchanged by it."""
    from optimum_ipu.pipelines.question_answering import _encodes_as_transformers, encode_windows

    tokenizer = tokenizer_for(family)
    assert _encodes_as_transformers(type(tokenizer))  # the backend path is the one under test
    data = json.loads((shared_data / "squad" / "squad-v1.1-dev-articles-00-39.json").read_text())["data"][:2]
    pairs = [(qa["question"], p["context"]) for a in data for p in a["paragraphs"] for qa in p["qas"][:2]]
    overflowed = 0
    for question, context in pairs[:40]:
        for pair, truncation in (((question, context), "only_second"), ((context, question), "only_first")):
            expected = tokenizer(
                *pair,
                truncation=truncation,
                max_length=96,
                stride=32,
                return_overflowing_tokens=True,
                return_offsets_mapping=True,
            )
            windows = encode_windows(tokenizer, pair, truncation, 96, 32)
            assert len(windows) == len(expected["input_ids"])
            overflowed += len(windows) > 1
            for i, window in enumerate(windows):
                assert window.ids == expected["input_ids"][i]
                assert window.attention_mask == expected["attention_mask"][i]
                assert [tuple(o) for o in window.offsets] == [tuple(o) for o in expected["offset_mapping"][i]]
                assert window.sequence_ids == expected.sequence_ids(i)
                if "token_type_ids" in expected:
                    assert window.type_ids == expected["token_type_ids"][i]
    assert overflowed > 10
    # the backend is left as transformers' own call leaves it: a plain call after it is not truncated
    long_text = " ".join(pairs[0][1] for _ in range(3))
    assert len(tokenizer(long_text)["input_ids"]) > 96


def test_question_windows_fall_back_to_the_call_of_a_tokenizer_that_encodes_its_own_way(tokenizer_for):
    from optimum_ipu.pipelines.question_answering import _encodes_as_transformers, encode_windows

    base = type(tokenizer_for("bert"))
    calls = []

    class Traced(base):
        def _encode_plus(self, *args, **kwargs):
            calls.append(kwargs.get("truncation_strategy"))
            return super()._encode_plus(*args, **kwargs)

    assert not _encodes_as_transformers(Traced)
    tokenizer = Traced.from_pretrained(tokenizer_for("bert").name_or_path)
    windows = encode_windows(tokenizer, ("who?", "a context " * 80), "only_second", 64, 16)
    assert calls and len(windows) > 1 and all(len(w.ids) <= 64 for w in windows)


def test_config_argument_is_the_models_config_as_in_transformers(tiny_pretrained, tmp_path):
    """`pipeline(..., config=...)` (transformers' argument, which Optimum Graphcore passed on to it: its text
    summarization notebook gives `config="facebook/bart-large-cnn"`): the model is loaded with that config (an id or
    folder, or a config object), never handed to the task's calls."""
    folder = str(tiny_pretrained("BertForSequenceClassification"))
    labelled = transformers.AutoConfig.from_pretrained(folder, id2label={0: "NO", 1: "YES", 2: "MAYBE"})
    labelled.save_pretrained(tmp_path)
    for config in (labelled, str(tmp_path)):
        classifier = pipeline("text-classification", model=folder, config=config, backend="eager")
        assert classifier("ok")[0]["label"] in ("NO", "YES", "MAYBE")
