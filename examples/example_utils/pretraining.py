"""What `prepare_dataset.py` and `run_pretraining.py` share: BERT's pretraining pairs made from a text corpus.

A corpus is cut into documents (WikiText: at its top-level headings ` = Title = `; other text: at blank lines) and
sentences (at ` . `, ` ? `, ` ! `), each sentence tokenized once without special tokens. Pairs are then made as
Google's `create_pretraining_data.py` makes them (the recipe behind Optimum Graphcore's `Graphcore/wikipedia-bert-*`
data sets): sentences of a document gathered up to a target length (`max_seq_length - 3` tokens, or with
`short_seq_prob` a random shorter one), split in two at a random sentence: half the time B is what follows A
(`next_sentence_label` 0), else B is taken from a random other document (`next_sentence_label` 1) and the unused
sentences go back; the longer side is cut (a token at its front or back, at random) until the pair fits. Each pair
is `[CLS] A [SEP] B [SEP]` with `token_type_ids` 0 for A and 1 for B. Masking is left to the collator (dynamic, a
new draw each epoch).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from typing import Any

import datasets

# WikiText's article titles are ` = Title = `; its section headings ` = = Section = = ` are dropped.
_TITLE = re.compile(r"^ ?= [^=].* = ?$")
_HEADING = re.compile(r"^ ?(= )+.*( =)+ ?$")
_SENTENCE_END = re.compile(r"(?<=[.!?]) (?=\S)")

PAIR_COLUMNS = ("input_ids", "token_type_ids", "next_sentence_label")


def documents_from_lines(lines: Iterable[str]) -> list[list[str]]:
    """Documents (lists of sentences) from the lines of a text: a WikiText title or a blank line after text
    starts a new document when the corpus has titles, else blank lines do; headings are dropped."""
    lines = [line.rstrip("\n") for line in lines]
    titled = any(_TITLE.match(line) for line in lines)
    documents: list[list[str]] = [[]]
    for line in lines:
        if (titled and _TITLE.match(line)) or (not titled and not line.strip()):
            if documents[-1]:
                documents.append([])
            continue
        if not line.strip() or _HEADING.match(line):
            continue
        documents[-1].extend(s.strip() for s in _SENTENCE_END.split(line.strip()) if s.strip())
    return [d for d in documents if d]


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        del longer[0 if rng.random() < 0.5 else -1]


def _random_b(documents: list, skip: int, target: int, rng: random.Random) -> list[int]:
    other = skip
    for _ in range(10):  # as Google's script: try for another document
        other = rng.randrange(len(documents))
        if other != skip:
            break
    document, b = documents[other], []
    for sentence in document[rng.randrange(len(document)) :]:
        b.extend(sentence)
        if len(b) >= target:
            break
    return b


def pairs_from_document(
    documents: list[list[list[int]]], index: int, max_seq_length: int, short_seq_prob: float, rng: random.Random
) -> list[tuple[list[int], list[int], int]]:
    """`(A, B, next_sentence_label)` pairs of one tokenized document (see the module's docstring)."""
    max_tokens = max_seq_length - 3  # [CLS], [SEP], [SEP]
    target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
    document, pairs, chunk, length, i = documents[index], [], [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            a = [t for s in chunk[:a_end] for t in s]
            if len(chunk) == 1 or (len(documents) > 1 and rng.random() < 0.5):
                b, label = _random_b(documents, index, max(target - len(a), 1), rng), 1
                i -= len(chunk) - a_end  # the sentences not used go back
            else:
                b, label = [t for s in chunk[a_end:] for t in s], 0
            _truncate_pair(a, b, max_tokens, rng)
            if a and b:
                pairs.append((a, b, label))
            chunk, length = [], 0
            target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
        i += 1
    return pairs


def make_pairs(
    texts: Sequence[str],
    tokenizer: Any,
    max_seq_length: int,
    short_seq_prob: float = 0.1,
    dupe_factor: int = 1,
    seed: int = 12345,
) -> datasets.Dataset:
    """BERT pretraining pairs of a corpus (`texts`: its lines), as a `datasets.Dataset` with `input_ids`,
    `token_type_ids` and `next_sentence_label`, shuffled.

    Args:
        texts (`Sequence[str]`): the corpus, one line per item (WikiText's `<unk>` becomes the tokenizer's own).
        tokenizer: a BERT-style tokenizer (`[CLS]`, `[SEP]`).
        max_seq_length (`int`): the most tokens of a pair, special tokens included.
        short_seq_prob (`float`, *optional*, defaults to 0.1): share of pairs given a random shorter target.
        dupe_factor (`int`, *optional*, defaults to 1): passes over the corpus, each with new random pairs.
        seed (`int`, *optional*, defaults to 12345): the pairs' random seed (Google's script's default).
    """
    if max_seq_length < 8:
        raise ValueError(f"--max_seq_length {max_seq_length}: too short for sentence pairs; use e.g. 128")
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
        raise ValueError(f"{type(tokenizer).__name__} has no [CLS]/[SEP] tokens; pass a BERT tokenizer")
    unk = tokenizer.unk_token or "<unk>"
    documents = documents_from_lines(t.replace("<unk>", unk) for t in texts)
    sentences = [s for d in documents for s in d]
    ids = iter(tokenizer(sentences, add_special_tokens=False, verbose=False)["input_ids"]) if sentences else iter([])
    tokenized = [[next(ids) for _ in d] for d in documents]
    tokenized = [[s for s in d if s] for d in tokenized]
    tokenized = [d for d in tokenized if d]
    rng = random.Random(seed)
    columns: dict[str, list] = {name: [] for name in PAIR_COLUMNS}
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for _ in range(dupe_factor):
        for index in range(len(tokenized)):
            for a, b, label in pairs_from_document(tokenized, index, max_seq_length, short_seq_prob, rng):
                columns["input_ids"].append([cls, *a, sep, *b, sep])
                columns["token_type_ids"].append([0] * (len(a) + 2) + [1] * (len(b) + 1))
                columns["next_sentence_label"].append(label)
    if not columns["input_ids"]:
        raise ValueError("the text gives no sentence pair: give more text (documents of two sentences or more)")
    return datasets.Dataset.from_dict(columns).shuffle(seed=seed)
