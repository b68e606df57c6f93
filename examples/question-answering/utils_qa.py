# Copyright 2020 The HuggingFace Team, adapted for optimum-ipu. Licensed under the Apache License, Version 2.0.
"""Data utilities for extractive question answering (SQuAD-style), used by ``run_qa.py``.

Adapted from the Hugging Face ``transformers`` examples (``run_qa.py`` + ``utils_qa.py``) for transformers 5 and
datasets 5: loading SQuAD JSON files without the Hub, turning examples into model features, turning start/end logits
back into answer strings, and scoring them with ``torchmetrics``' SQuAD metric.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import datasets
import numpy as np

# Not `torchmetrics.functional.squad`: that top-level alias is deprecated in torchmetrics 1.x.
from squad_v2_metric import squad_v2_scores
from torchmetrics.functional.text.squad import squad as tm_squad
from tqdm.auto import tqdm

from optimum_ipu.pipelines.question_answering import answer_span_candidates, nbest_with_probabilities

logger = logging.getLogger(__name__)

# Explicit schema, identical to the Hub's `squad` dataset, so that an all-impossible split (empty answer lists)
# still gets typed columns instead of `null` ones that break `Dataset.map` later on.
# `datasets.List` appeared in datasets 4; `Sequence` is its older spelling (a dict of `Sequence`s reads as lists).
_List = getattr(datasets, "List", datasets.Sequence)
_STR = datasets.Value("string")
_ANSWERS = {"text": _List(_STR), "answer_start": _List(datasets.Value("int32"))}
SQUAD_FEATURES = datasets.Features({"id": _STR, "title": _STR, "context": _STR, "question": _STR, "answers": _ANSWERS})


def _where(record: Mapping[str, Any], index: int) -> str:
    """Names a record in error messages: by its id when it has a usable one, by its position otherwise."""
    rid = record.get("id") if isinstance(record, Mapping) else None
    return f"record id {rid!r}" if isinstance(rid, str) and rid else f"record #{index}"


def _require_str(record: Mapping[str, Any], field: str, where: str) -> str:
    if field not in record:
        raise ValueError(f"{where}: field {field!r} is missing")
    value = record[field]
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {field!r} must be a string, got {type(value).__name__}")
    return value


def _check_answers(texts: Any, starts: Any, context: str, where: str) -> dict[str, list]:
    """Validates one record's answers (parallel lists) and that each span really is in the context."""
    if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
        raise ValueError(f"{where}: field 'answers' must hold two lists of equal length ('text', 'answer_start')")
    for text, start in zip(texts, starts, strict=True):
        if not isinstance(text, str):
            raise ValueError(f"{where}: field 'answers.text' must hold strings, got {type(text).__name__}")
        # bool is an int subclass; True as an offset is certainly a data error.
        if not isinstance(start, int) or isinstance(start, bool):
            raise ValueError(f"{where}: field 'answers.answer_start' must hold integers, got {type(start).__name__}")
        # A span that does not match the context would silently train the model on wrong labels.
        if start < 0 or context[start : start + len(text)] != text:
            raise ValueError(f"{where}: field 'answers' has {text!r} at {start}, which is not that span of the context")
    return {"text": list(texts), "answer_start": list(starts)}


def _nested_records(articles: list[Any]) -> list[Any]:
    """Flattens the official nested layout (article -> paragraphs -> qas) into flat records, validated later."""
    records = []
    for a_idx, article in enumerate(articles):
        if not isinstance(article, Mapping) or not isinstance(article.get("paragraphs"), list):
            raise ValueError(f"article #{a_idx}: field 'paragraphs' is missing or not a list")
        for p_idx, paragraph in enumerate(article["paragraphs"]):
            if not isinstance(paragraph, Mapping) or not isinstance(paragraph.get("qas"), list):
                raise ValueError(f"article #{a_idx} paragraph #{p_idx}: field 'qas' is missing or not a list")
            for qa in paragraph["qas"]:
                if not isinstance(qa, Mapping):
                    records.append(qa)  # reported by the record checks
                    continue
                record = {**qa, "title": article.get("title", "")}
                if "context" in paragraph:
                    record["context"] = paragraph["context"]
                answers = qa.get("answers")
                if isinstance(answers, list) and all(isinstance(x, Mapping) for x in answers):
                    # A missing key becomes None, which the answer checks report as mistyped.
                    record["answers"] = {
                        "text": [x.get("text") for x in answers],
                        "answer_start": [x.get("answer_start") for x in answers],
                    }
                impossible = qa.get("is_impossible", not answers)
                if not isinstance(impossible, bool) or impossible == bool(answers):
                    where = _where(qa, len(records))
                    raise ValueError(f"{where}: field 'is_impossible' disagrees with 'answers' (or is not a bool)")
                records.append(record)
    return records


def _read_json_or_lines(path: str) -> Any:
    """Parses a JSON document, or JSON Lines (one record per line) when the file is not a single document."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}: not UTF-8 text (byte {exc.start}); JSON files are UTF-8: re-encode it, e.g. "
            f"iconv -f latin1 -t utf-8"
        ) from exc
    document_error = None
    if not str(path).endswith(".jsonl"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:  # maybe JSON Lines under a .json name, as `datasets` accepts too
            document_error = exc
    if document_error is not None and ("\n" not in text.strip() or _first_line_opens_a_document(text)):
        # one line (as the nested SQuAD files are), or a first line that is no record by itself: a document cut
        # short or broken, so say where it broke, not "line 1 is not valid JSON"
        raise ValueError(
            f"{path}: not valid JSON ({document_error.msg} at line {document_error.lineno} column "
            f"{document_error.colno}; truncated?)"
        ) from None
    records = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {line_no} is not valid JSON ({exc.msg})") from exc
    return records


def _first_line_opens_a_document(text: str) -> bool:
    """Whether the first line is the start of a multi-line JSON document rather than one JSON Lines record."""
    first = text.strip().splitlines()[0]
    try:
        json.loads(first)
    except json.JSONDecodeError:
        return True
    return False


def load_squad_json(path: str | os.PathLike, articles: slice | None = None) -> datasets.Dataset:
    """
    Loads a SQuAD-style JSON file into a `datasets.Dataset` without the Hugging Face Hub.

    Two layouts are accepted:
        - the official nested one, `{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
          "answers": [{"text", "answer_start"}], "is_impossible"?}]}]}]}`;
        - flat records (a JSON list, `{"data": [...]}` or JSON Lines) with `id, title?, context, question,
          answers{"text": [...], "answer_start": [...]}`, as the Hub's `squad` dataset.

    Args:
        path (`str` or `os.PathLike`): The file to read (UTF-8).
        articles (`slice`, *optional*): Articles of the nested layout to keep, e.g. `slice(0, 34)`, so that one file
            splits by article into train and eval parts without one paragraph's questions on both sides.

    Returns:
        `datasets.Dataset`: columns `id, title, context, question, answers` (answers: dict of lists `text`,
        `answer_start`; empty lists for unanswerable questions).

    Raises:
        `ValueError`: on a missing or mistyped field (naming the record id, or its index, and the field), an answer
        span that is not in its context, a duplicate id, or a selection with no record at all.
    """
    path = os.fspath(path)
    raw = _read_json_or_lines(path)
    if isinstance(raw, Mapping):
        # A single flat record read as one JSON document (a one-line JSON Lines file) has no "data" key.
        raw = raw["data"] if "data" in raw else [raw]
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a 'data' list or a list of records, got {type(raw).__name__}")
    nested = any(isinstance(x, Mapping) and "paragraphs" in x for x in raw)
    if nested:
        records = _nested_records(raw if articles is None else raw[articles])
    elif articles is not None:
        raise ValueError(
            f"{path}: `articles` selects articles of the nested SQuAD layout; this file holds flat records"
        )
    else:
        records = raw

    rows: dict[str, list] = {name: [] for name in SQUAD_FEATURES}
    seen: set[str] = set()
    for index, record in enumerate(records):
        where = _where(record, index)
        if not isinstance(record, Mapping):
            raise ValueError(f"{where}: expected an object, got {type(record).__name__}")
        rid = _require_str(record, "id", where)
        if rid in seen:
            # Post-processing keys predictions by id: a duplicate would silently overwrite another answer.
            raise ValueError(f"{where}: field 'id' is duplicated")
        seen.add(rid)
        context = _require_str(record, "context", where)
        answers = record.get("answers")
        if not isinstance(answers, Mapping) or "text" not in answers or "answer_start" not in answers:
            raise ValueError(f"{where}: field 'answers' must be an object with lists 'text' and 'answer_start'")
        rows["id"].append(rid)
        rows["title"].append(_require_str(record, "title", where) if "title" in record else "")
        rows["context"].append(context)
        rows["question"].append(_require_str(record, "question", where))
        rows["answers"].append(_check_answers(answers["text"], answers["answer_start"], context, where))
    if not rows["id"]:
        raise ValueError(f"{path}: no question selected (articles={articles})")
    return datasets.Dataset.from_dict(rows, features=SQUAD_FEATURES)


def _tokenize(
    examples: Mapping[str, Sequence],
    tokenizer: Any,
    max_seq_length: int,
    doc_stride: int,
    pad_to_max_length: bool,
    pad_on_right: bool | None,
) -> tuple[Any, list[int], int]:
    """Shared part of `prepare_*_features`: returns the windows, their example indexes and the context's sequence id."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"{type(tokenizer).__name__} is not a fast tokenizer: QA pre-processing needs offset mappings and "
            "overflow-to-sample mappings, which only `tokenizers`-backed (fast) tokenizers provide."
        )
    # Models padded on the left (e.g. XLNet) take the context first, the question second.
    pad_on_right = tokenizer.padding_side == "right" if pad_on_right is None else pad_on_right
    # Long questions with leading spaces waste room in the window (and break some tokenizers' truncation).
    questions = [q.lstrip() for q in examples["question"]]
    contexts = list(examples["context"])
    # The window left for the context must be longer than the stride, or `tokenizers` panics (an exception that
    # `except Exception` cannot catch); check first to fail with a message naming the example.
    q_lens = [len(ids) for ids in tokenizer(questions, add_special_tokens=False)["input_ids"]]
    n_special = tokenizer.num_special_tokens_to_add(pair=True)
    for rid, q_len in zip(examples["id"], q_lens, strict=True):
        if max_seq_length - n_special - q_len <= doc_stride:
            raise ValueError(
                f"example {rid!r}: its question takes {q_len} tokens, which leaves no context window longer than "
                f"doc_stride={doc_stride} in max_seq_length={max_seq_length}; raise max_seq_length or lower doc_stride"
            )
    tokenized = tokenizer(
        questions if pad_on_right else contexts,
        contexts if pad_on_right else questions,
        truncation="only_second" if pad_on_right else "only_first",
        max_length=max_seq_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length" if pad_to_max_length else False,
    )
    return tokenized, tokenized.pop("overflow_to_sample_mapping"), 1 if pad_on_right else 0


def prepare_train_features(
    examples: Mapping[str, Sequence],
    tokenizer: Any,
    max_seq_length: int,
    doc_stride: int,
    pad_to_max_length: bool = True,
    pad_on_right: bool | None = None,
) -> dict[str, list]:
    """
    Tokenizes a batch of examples into training features with answer start/end token positions.

    A long context is split into several features of at most `max_seq_length` tokens overlapping by `doc_stride`
    tokens. A feature that does not contain the whole (first) answer, or an unanswerable example, is labelled with
    the index of the CLS token, as in the Hugging Face `run_qa.py`. Meant for `Dataset.map(..., batched=True,
    remove_columns=...)`.

    Args:
        examples (`Mapping[str, Sequence]`): A batch with columns `id`, `question`, `context`, `answers` (not modified).
        tokenizer (`PreTrainedTokenizerBase`): A fast tokenizer (`tokenizer.is_fast`).
        max_seq_length (`int`): The maximum number of tokens of a feature.
        doc_stride (`int`): The number of tokens shared by two consecutive windows of one context.
        pad_to_max_length (`bool`, *optional*, defaults to `True`): Pad every feature to `max_seq_length` (fixed
            shapes); `False` leaves padding to a data collator.
        pad_on_right (`bool`, *optional*): Whether the question comes first and the context second; defaults to
            `tokenizer.padding_side == "right"`.

    Returns:
        `dict[str, list]`: the tokenizer outputs (`input_ids`, `attention_mask`, ...) plus `start_positions` and
        `end_positions`, one entry per feature.

    Raises:
        `ValueError`: if the tokenizer is not fast, or a question leaves no room for a context window.
    """
    tokenized, sample_mapping, context_index = _tokenize(
        examples, tokenizer, max_seq_length, doc_stride, pad_to_max_length, pad_on_right
    )
    offset_mapping = tokenized.pop("offset_mapping")
    all_answers = examples["answers"]  # read once: a `LazyBatch` column access is not free
    tokenized["start_positions"] = []
    tokenized["end_positions"] = []
    for i, offsets in enumerate(offset_mapping):
        input_ids = tokenized["input_ids"][i]
        if tokenizer.cls_token_id in input_ids:
            cls_index = input_ids.index(tokenizer.cls_token_id)
        elif tokenizer.bos_token_id is not None and tokenizer.bos_token_id in input_ids:
            cls_index = input_ids.index(tokenizer.bos_token_id)
        else:
            cls_index = 0
        sequence_ids = tokenized.sequence_ids(i)
        answers = all_answers[sample_mapping[i]]
        # HF walks inwards from both ends to find the context tokens; an empty context has none, so look them up.
        context_tokens = [k for k, s in enumerate(sequence_ids) if s == context_index]
        start, end = cls_index, cls_index
        if len(answers["answer_start"]) > 0 and context_tokens:
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            first, last = context_tokens[0], context_tokens[-1]
            # Label only features holding the whole answer; others teach the model "not in this window" (CLS).
            if offsets[first][0] <= start_char and offsets[last][1] >= end_char:
                start = first
                while start <= last and offsets[start][0] <= start_char:
                    start += 1
                start -= 1
                end = last
                while end >= first and offsets[end][1] >= end_char:
                    end -= 1
                end += 1
        tokenized["start_positions"].append(start)
        tokenized["end_positions"].append(end)
    return dict(tokenized)


def prepare_validation_features(
    examples: Mapping[str, Sequence],
    tokenizer: Any,
    max_seq_length: int,
    doc_stride: int,
    pad_to_max_length: bool = True,
    pad_on_right: bool | None = None,
) -> dict[str, list]:
    """
    Tokenizes a batch of examples into evaluation features, keeping what post-processing needs.

    Each feature records the `example_id` it comes from and its `offset_mapping`, where the offsets of tokens that
    are not part of the context (question, special and padding tokens) are set to `None` so that no predicted span
    can start or end there. Arguments are those of [`prepare_train_features`].

    Returns:
        `dict[str, list]`: the tokenizer outputs plus `example_id` and `offset_mapping`, one entry per feature.

    Raises:
        `ValueError`: if the tokenizer is not fast, or a question leaves no room for a context window.
    """
    tokenized, sample_mapping, context_index = _tokenize(
        examples, tokenizer, max_seq_length, doc_stride, pad_to_max_length, pad_on_right
    )
    ids = examples["id"]
    tokenized["example_id"] = []
    for i in range(len(tokenized["input_ids"])):
        sequence_ids = tokenized.sequence_ids(i)
        tokenized["example_id"].append(ids[sample_mapping[i]])
        tokenized["offset_mapping"][i] = [
            (o if sequence_ids[k] == context_index else None) for k, o in enumerate(tokenized["offset_mapping"][i])
        ]
    return dict(tokenized)


def _column(data: Any, name: str) -> list:
    """One column as a list, from a `datasets.Dataset`, a dict of lists or a list of row dicts."""
    if isinstance(data, Mapping) or hasattr(data, "column_names"):
        return list(data[name])
    return [row[name] for row in data]


def _write_json_atomic(path: str, obj: Any) -> None:
    """Writes JSON via a temporary file and `os.replace`, so a crash never leaves a truncated file behind."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(obj, indent=4, ensure_ascii=False) + "\n")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600 files; predictions are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def postprocess_qa_predictions(
    examples: Any,
    features: Any,
    predictions: tuple[np.ndarray, np.ndarray],
    version_2_with_negative: bool = False,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    null_score_diff_threshold: float = 0.0,
    output_dir: str | os.PathLike | None = None,
    prefix: str | None = None,
) -> collections.OrderedDict[str, str]:
    """
    Turns start/end logits of a question-answering model into answer strings taken from the original contexts.

    For each example, the `n_best_size` best start and end logits of every one of its features are combined into
    spans within the context; the best span over all its features wins, mapped back to context characters.

    Args:
        examples: The examples (`datasets.Dataset`, dict of lists or list of rows) with `id` and `context`.
        features: The features from [`prepare_validation_features`] (`example_id`, `offset_mapping`).
        predictions (`tuple[np.ndarray, np.ndarray]`): Start and end logits, `len(features)` rows each (rows may be
            padded past a feature's length).
        version_2_with_negative (`bool`, *optional*, defaults to `False`): Whether examples may have no answer
            (SQuAD v2): the null answer (CLS) is then a candidate.
        n_best_size (`int`, *optional*, defaults to 20): Best start and end logits combined, and n-best answers kept.
        max_answer_length (`int`, *optional*, defaults to 30): The longest answer, in tokens.
        null_score_diff_threshold (`float`, *optional*, defaults to 0.0): With `version_2_with_negative`, the null
            answer wins when its score (the lowest over the example's features) beats the best span's by more.
        output_dir (`str` or `os.PathLike`, *optional*): Where to write `predictions.json`, `nbest_predictions.json`
            (and `null_odds.json` for v2), atomically.
        prefix (`str`, *optional*): Prefix of those file names (`{prefix}_predictions.json`).

    Returns:
        `collections.OrderedDict[str, str]`: example id -> predicted answer text (`""` for a null answer).

    Raises:
        `ValueError`: if `predictions` is not a pair of arrays with one row per feature, or `n_best_size` or
            `max_answer_length` is below 1.
    """
    if len(predictions) != 2:
        raise ValueError(f"`predictions` should be a tuple (start_logits, end_logits), got {len(predictions)} items")
    for flag, value in (("n_best_size", n_best_size), ("max_answer_length", max_answer_length)):
        if value < 1:  # no candidate span at all: every answer empty, EM/F1 0.0 without a word
            raise ValueError(f"--{flag} {value}: expected an integer >= 1")
    all_start_logits, all_end_logits = predictions
    feature_example_ids = _column(features, "example_id")
    feature_offsets = _column(features, "offset_mapping")
    if len(all_start_logits) != len(feature_offsets) or len(all_end_logits) != len(feature_offsets):
        raise ValueError(f"Got {len(all_start_logits)} predictions and {len(feature_offsets)} features.")

    example_ids = _column(examples, "id")
    contexts = _column(examples, "context")
    example_id_to_index = {k: i for i, k in enumerate(example_ids)}
    features_per_example = collections.defaultdict(list)
    for i, example_id in enumerate(feature_example_ids):
        features_per_example[example_id_to_index[example_id]].append(i)
    logger.info(f"Post-processing {len(example_ids)} example predictions split into {len(feature_offsets)} features.")

    all_predictions: collections.OrderedDict[str, str] = collections.OrderedDict()
    all_nbest_json: collections.OrderedDict[str, list] = collections.OrderedDict()
    scores_diff_json: collections.OrderedDict[str, float] = collections.OrderedDict()
    progress = tqdm(example_ids, desc="Post-processing predictions", unit="example", mininterval=2.0)
    for example_index, example_id in enumerate(progress):
        feature_indexes = features_per_example[example_index]
        # The span selection of optimum_ipu's question-answering pipeline: the same answers from the same logits.
        nbest, min_null_prediction = answer_span_candidates(
            [np.asarray(all_start_logits[i]) for i in feature_indexes],
            [np.asarray(all_end_logits[i]) for i in feature_indexes],
            [feature_offsets[i] for i in feature_indexes],
            n_best_size=n_best_size,
            max_answer_length=max_answer_length,
            with_null=version_2_with_negative,
        )
        # Read now: the scores are popped from the n-best dicts (the null one included) for the softmax below.
        null_score = min_null_prediction["score"] if version_2_with_negative and min_null_prediction else 0.0
        nbest = nbest_with_probabilities(nbest, contexts[example_index])

        if not version_2_with_negative:
            all_predictions[example_id] = nbest[0]["text"]
        else:
            placeholder = {"text": "", "start_logit": 0.0, "end_logit": 0.0}
            best_non_null = next((p for p in nbest if p["text"] != ""), placeholder)
            score_diff = null_score - best_non_null["start_logit"] - best_non_null["end_logit"]
            scores_diff_json[example_id] = float(score_diff)
            all_predictions[example_id] = "" if score_diff > null_score_diff_threshold else best_non_null["text"]
        all_nbest_json[example_id] = nbest

    if output_dir is not None:
        output_dir = os.fspath(output_dir)
        os.makedirs(output_dir, exist_ok=True)
        stem = "" if prefix is None else f"{prefix}_"
        logger.info(f"Saving predictions to {output_dir}.")
        _write_json_atomic(os.path.join(output_dir, f"{stem}predictions.json"), all_predictions)
        _write_json_atomic(os.path.join(output_dir, f"{stem}nbest_predictions.json"), all_nbest_json)
        if version_2_with_negative:
            _write_json_atomic(os.path.join(output_dir, f"{stem}null_odds.json"), scores_diff_json)
    return all_predictions


def squad_metrics(predictions: Mapping[str, str], examples: Any) -> dict[str, float]:
    """
    Computes SQuAD exact match and F1 (percentages) with `torchmetrics`' SQuAD metric.

    Answers are normalised (lower case, no punctuation, no articles, single spaces) and each prediction is scored
    against the best-matching reference answer, as the official SQuAD script does. An unanswerable example (empty
    answer list) counts as the reference `""`, as in the SQuAD v2 metric, so an empty prediction gets full marks.

    Args:
        predictions (`Mapping[str, str]`): Example id -> answer text, e.g. from [`postprocess_qa_predictions`].
        examples: The reference examples (`datasets.Dataset`, dict of lists or list of rows): `id`, `answers`.

    Returns:
        `dict[str, float]`: `{"exact_match": ..., "f1": ...}`, between 0 and 100. An example without a prediction
        scores 0 (torchmetrics warns about it).

    Raises:
        `ValueError`: if there is no example, or a prediction is for an id that is not among the examples.
    """
    ids = _column(examples, "id")
    answers = _column(examples, "answers")
    if not ids:
        raise ValueError("squad_metrics needs at least one example")
    unknown = set(predictions) - set(ids)
    if unknown:
        # Most likely predictions from another split or another preprocessing run: scoring them would mislead.
        raise ValueError(f"{len(unknown)} predictions are for ids not among the examples, e.g. {sorted(unknown)[:3]}")
    # torchmetrics wants lists of {"id", "prediction_text"} and {"id", "answers": {"text": [...], ...}}; it takes
    # the max over reference texts, which fails on an empty list, hence [""] for unanswerable questions.
    preds = [{"id": k, "prediction_text": v} for k, v in predictions.items()]
    target = [
        {"id": i, "answers": {"text": list(a["text"]) or [""], "answer_start": list(a["answer_start"]) or [-1]}}
        for i, a in zip(ids, answers, strict=True)
    ]
    scores = tm_squad(preds, target)
    return {"exact_match": float(scores["exact_match"]), "f1": float(scores["f1"])}


def squad_v2_metrics(predictions: Mapping[str, str], examples: Any) -> dict[str, Any]:
    """
    The official SQuAD v2.0 scores (percentages), as `evaluate`'s `squad_v2` metric gives them to the upstream
    `run_qa.py --version_2_with_negative`: `exact`, `f1`, `total`, `HasAns_*`, `NoAns_*`, `best_exact`,
    `best_exact_thresh`, `best_f1`, `best_f1_thresh` (see `squad_v2_metric.py`).

    Args:
        predictions (`Mapping[str, str]`): Example id -> answer text (`""`: no answer), from
            [`postprocess_qa_predictions`] with `version_2_with_negative=True`.
        examples: The reference examples (`datasets.Dataset`, dict of lists or list of rows): `id`, `answers`.

    Raises:
        `ValueError`: if there is no example, an example has no prediction, or a prediction is for an unknown id.
    """
    ids = _column(examples, "id")
    unknown = set(predictions) - set(ids)
    if unknown:
        raise ValueError(f"{len(unknown)} predictions are for ids not among the examples, e.g. {sorted(unknown)[:3]}")
    gold = {i: list(a["text"]) for i, a in zip(ids, _column(examples, "answers"), strict=True)}
    # no_answer_probability 0.0 for every question, as the upstream script passes
    return squad_v2_scores(predictions, gold)
