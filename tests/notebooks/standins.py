"""Local stand-ins for what Optimum Graphcore's notebooks download: tiny random models under the Hub ids the
notebooks name, written into a Hugging Face cache folder (`huggingface_hub`'s layout), which the offline run
reads as it would read a real download. Nothing in the notebook's code changes for them.

Each stand-in is a tiny random model of the class the notebook loads, with the id's layer count where an IPU config
of the notebook splits its layers (a `Graphcore/*-ipu` config counts 12 or 24 layers), hidden size 32, and a
tokenizer of its family trained on the shared text (BERT's: the real bert-base-uncased WordPiece vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np

from ..conftest import SHARED_DATA
from ..local_tokenizers import save_tiny_pretrained

JFK = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."


@dataclass(frozen=True)
class StandIn:
    """A tiny model saved under a Hub id: its `transformers` class, its tokenizer's family and config overrides."""

    class_name: str
    tokenizer: str
    config: dict = field(default_factory=dict)
    revision: str = "main"
    shared: str | None = None  # a real model of `../shared/models` served as it is, in place of a tiny one


LABELS_2 = {"id2label": {0: "NEGATIVE", 1: "POSITIVE"}, "label2id": {"NEGATIVE": 0, "POSITIVE": 1}}
LABELS_3 = {"id2label": {0: "negative", 1: "neutral", 2: "positive"}, "num_labels": 3}
LABELS_5 = {"id2label": {i: f"{i + 1} stars" for i in range(5)}, "num_labels": 5}
EMOTIONS = ("sadness", "joy", "love", "anger", "fear", "surprise")
LABELS_6 = {"id2label": dict(enumerate(EMOTIONS)), "num_labels": 6}

MODELS: dict[str, StandIn] = {
    "distilbert-base-uncased-finetuned-sst-2-english": StandIn(
        "DistilBertForSequenceClassification", "bert", {"n_layers": 6, **LABELS_2}, revision="af0f99b"
    ),
    "finiteautomata/bertweet-base-sentiment-analysis": StandIn(
        "RobertaForSequenceClassification", "roberta", {"num_hidden_layers": 12, **LABELS_3}
    ),
    "cardiffnlp/twitter-roberta-base-sentiment-latest": StandIn(
        "RobertaForSequenceClassification", "roberta", {"num_hidden_layers": 12, **LABELS_3}
    ),
    "nlptown/bert-base-multilingual-uncased-sentiment": StandIn(
        "BertForSequenceClassification", "bert", {"num_hidden_layers": 12, **LABELS_5}
    ),
    "bhadresh-savani/distilbert-base-uncased-emotion": StandIn(
        "DistilBertForSequenceClassification", "bert", {"n_layers": 6, **LABELS_6}
    ),
    "j-hartmann/sentiment-roberta-large-english-3-classes": StandIn(
        "RobertaForSequenceClassification", "roberta", {"num_hidden_layers": 24, **LABELS_3}
    ),
    "roberta-base": StandIn("RobertaForMaskedLM", "roberta", {"num_hidden_layers": 12}),
    "openai/whisper-tiny.en": StandIn("WhisperForConditionalGeneration", "", shared="whisper-tiny.en"),
}


def write_hub_cache(cache: Path, ids: list[str], tokenizer_for, shared_models: Path) -> Path:
    """Write the stand-ins of `ids` into the Hub cache folder `cache` (once each) and return `cache`."""
    for repo_id in ids:
        stand_in = MODELS[repo_id]
        repo = cache / f"models--{repo_id.replace('/', '--')}"
        snapshot = repo / "snapshots" / stand_in.revision
        if snapshot.is_dir():
            continue
        if stand_in.shared:  # the files linked, as the Hub cache links its snapshots to blobs
            snapshot.mkdir(parents=True)
            for file in (shared_models / stand_in.shared).iterdir():
                (snapshot / file.name).symlink_to(file)
        else:
            save_tiny_pretrained(snapshot, stand_in.class_name, tokenizer_for(stand_in.tokenizer), **stand_in.config)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(stand_in.revision)
    return cache


def speech_samples() -> datasets.Dataset:
    """The stand-in of `hf-internal-testing/librispeech_asr_dummy` (its `audio` and `text` columns at 16 kHz):
    the JFK clip as row 2 (the sample the Whisper notebooks transcribe) among FSDD test recordings, decoded with
    `soundfile` (`datasets`' own audio decoding needs FFmpeg)."""
    import csv

    from optimum_ipu.pipelines.audio import load_audio

    data = SHARED_DATA
    with open(data / "audio" / "fsdd" / "test" / "metadata.csv", newline="") as f:
        fsdd = [(data / "audio" / "fsdd" / "test" / r["file_name"], r["transcription"]) for r in csv.DictReader(f)]
    jfk = (data / "fixtures" / "audio" / "jfk.flac", JFK)
    rows = [*fsdd[:2], jfk, *fsdd[2:4]]
    rows = [{"audio": {"array": load_audio(str(path), 16_000), "sampling_rate": 16_000}, "text": t} for path, t in rows]
    return datasets.Dataset.from_list(rows).with_transform(_decoded)


def _decoded(batch: dict) -> dict:
    """Audio as `datasets` returns it decoded: a float32 array and an `int` rate (its lists, otherwise)."""
    audio = [
        {"array": np.asarray(a["array"], np.float32), "sampling_rate": int(a["sampling_rate"])} for a in batch["audio"]
    ]
    return {**batch, "audio": audio}
