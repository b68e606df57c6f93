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
    processor: str | None = None  # a preprocessor of `PROCESSORS` saved beside a model without a tokenizer family


# a checkpoint that names no labels: transformers' default of 2 (a question-answering head's start and end)
NO_LABELS = {"num_labels": 2}
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
    "roberta-base": StandIn("RobertaForMaskedLM", "roberta", {"num_hidden_layers": 12, **NO_LABELS}),
    "openai/whisper-tiny.en": StandIn("WhisperForConditionalGeneration", "", shared="whisper-tiny.en"),
}

# Stable Diffusion folders: latents of 64 x 64 under a VAE that scales by 8, as the real ones at 512 pixels (SD 2's
# 768 pixels: 96 x 96); a UNet of 4 and 8 channels
DIFFUSION_PIPELINES = ("StableDiffusionPipeline",)
SD = {"in_channels": 4, "sample_size": 64, "vae_blocks": 4}
MODELS.update(
    {
        "runwayml/stable-diffusion-v1-5": StandIn("StableDiffusionPipeline", "", SD, revision="fp16"),
        "stabilityai/stable-diffusion-2": StandIn(
            "StableDiffusionPipeline", "", {**SD, "sample_size": 96}, revision="fp16"
        ),
        "runwayml/stable-diffusion-inpainting": StandIn(
            "StableDiffusionPipeline", "", {**SD, "in_channels": 9}, revision="fp16"
        ),
    }
)


def write_hub_cache(cache: Path, ids: list[str], tokenizer_for, shared_models: Path) -> Path:
    """Write the stand-ins of `ids` into the Hub cache folder `cache` (once each) and return `cache`."""
    for repo_id in ids:
        stand_in = MODELS[repo_id]
        repo = cache / f"models--{repo_id.replace('/', '--')}"
        snapshot = repo / "snapshots" / stand_in.revision
        if snapshot.is_dir():
            continue
        if stand_in.class_name in DIFFUSION_PIPELINES:  # a diffusers folder: no transformers class, no tokenizer family
            from ..tiny_diffusion import save_tiny_stable_diffusion

            save_tiny_stable_diffusion(snapshot, **stand_in.config)
        elif stand_in.shared:  # the files linked, as the Hub cache links its snapshots to blobs
            snapshot.mkdir(parents=True)
            for file in (shared_models / stand_in.shared).iterdir():
                (snapshot / file.name).symlink_to(file)
        elif not stand_in.tokenizer:  # vision and speech: the family's tiny config, no tokenizer
            save_tiny_model(snapshot, stand_in.class_name, **stand_in.config)
        else:
            save_tiny_pretrained(snapshot, stand_in.class_name, tokenizer_for(stand_in.tokenizer), **stand_in.config)
        if stand_in.processor:
            PROCESSORS[stand_in.processor](snapshot, shared_models)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        for ref in {"main", stand_in.revision}:  # a branch (`revision="fp16"`) is looked up by its ref
            (repo / "refs" / ref).write_text(stand_in.revision)
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
    """Audio as `datasets` returns it decoded: a float32 array and an `int` rate (its lists, otherwise); a mapped
    copy of the set keeps the transform but may have dropped the column."""
    if "audio" not in batch:
        return batch
    audio = [
        {"array": np.asarray(a["array"], np.float32), "sampling_rate": int(a["sampling_rate"])} for a in batch["audio"]
    ]
    return {**batch, "audio": audio}


def inpainting_image(url: str):
    """The stand-in of the inpainting notebook's `download_image(url)`: the COCO photo of the shared data for its
    picture, and a white rectangle over the middle of a black image for its mask (the `..._mask.png` url)."""
    from PIL import Image, ImageDraw

    photo = Image.open(SHARED_DATA / "fixtures" / "images" / "coco-000000039769.png").convert("RGB")
    if not url.endswith("_mask.png"):
        return photo
    mask = Image.new("RGB", photo.size)
    width, height = photo.size
    ImageDraw.Draw(mask).rectangle((width // 4, height // 4, 3 * width // 4, 3 * height // 4), fill="white")
    return mask


# ------------------------------------------ the text training notebooks (test_text_training_notebooks.py)
CONLL_NER = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")  # CoNLL-2003's ner_tags
NER_HRL = ("O", "B-DATE", "I-DATE", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")
BIOMEDICAL = ("O", "B-Age", "I-Age", "B-Sign_symptom", "I-Sign_symptom", "B-Disease_disorder", "I-Disease_disorder")
MNLI = ("CONTRADICTION", "NEUTRAL", "ENTAILMENT")


def _labels(names: tuple[str, ...]) -> dict:
    return {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}


MODELS.update(
    {
        "bert-base-uncased": StandIn("BertForMaskedLM", "bert", {"num_hidden_layers": 12, **NO_LABELS}),
        "bert-base-cased": StandIn("BertForMaskedLM", "bert", {"num_hidden_layers": 12, **NO_LABELS}),
        "gpt2": StandIn("GPT2LMHeadModel", "gpt2", {"n_layer": 12, **NO_LABELS}),
        # tokenizer repositories: their tokenizer is what the notebook reads (the tiny model beside it is unused)
        "sgugger/gpt2-like-tokenizer": StandIn("GPT2LMHeadModel", "gpt2"),
        "sgugger/bert-like-tokenizer": StandIn("BertForMaskedLM", "bert"),
        # the introduction pads SQuAD features to 384 tokens (its squad_preprocessing.py): a 512-position table
        "Graphcore/bert-large-uncased": StandIn(
            "BertForPreTraining", "bert", {"num_hidden_layers": 24, "max_position_embeddings": 512, **NO_LABELS}
        ),
        # the NER notebook pads to 256 tokens: a 512-position table, as the real ones
        "dbmdz/bert-large-cased-finetuned-conll03-english": StandIn(
            "BertForTokenClassification",
            "bert",
            {"num_hidden_layers": 24, "max_position_embeddings": 512, **_labels(CONLL_NER)},
            revision="f2482bf",
        ),
        "Davlan/bert-base-multilingual-cased-ner-hrl": StandIn(
            "BertForTokenClassification",
            "bert",
            {"num_hidden_layers": 12, "max_position_embeddings": 512, **_labels(NER_HRL)},
        ),
        "d4data/biomedical-ner-all": StandIn(
            "DistilBertForTokenClassification",
            "distilbert",
            {"n_layers": 6, "max_position_embeddings": 512, **_labels(BIOMEDICAL)},
        ),
        "microsoft/deberta-base-mnli": StandIn(
            "DebertaForSequenceClassification", "roberta", {"num_hidden_layers": 12, **_labels(MNLI)}
        ),
        "Palak/microsoft_deberta-base_squad": StandIn(
            "DebertaForQuestionAnswering", "roberta", {"num_hidden_layers": 12, **NO_LABELS}
        ),
    }
)


def glue_sst2(rows: int) -> datasets.DatasetDict:
    """The stand-in of `load_dataset("glue", "sst2")`: GLUE SST-2 of `../shared/data` (its `sentence`, `label`,
    `idx` columns, `label` a `ClassLabel` of negative/positive), the first `rows` of each split (its test split is
    the dev set with its labels hidden, -1, as GLUE's)."""
    features = datasets.Features(
        {
            "sentence": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["negative", "positive"]),
            "idx": datasets.Value("int32"),
        }
    )
    splits = {}
    for split, file in (("train", "train.tsv"), ("validation", "dev.tsv"), ("test", "dev.tsv")):
        lines = (SHARED_DATA / "glue" / "SST-2" / file).read_text(encoding="utf-8").splitlines()[1 : rows + 1]
        pairs = [line.rsplit("\t", 1) for line in lines]
        table = {
            "sentence": [s.strip() for s, _ in pairs],
            "label": [int(label) if split != "test" else -1 for _, label in pairs],
            "idx": list(range(len(pairs))),
        }
        splits[split] = datasets.Dataset.from_dict(table, features=features)
    return datasets.DatasetDict(splits)


SQUAD_FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "title": datasets.Value("string"),
        "context": datasets.Value("string"),
        "question": datasets.Value("string"),
        "answers": datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}),
    }
)


def squad(train_rows: int, validation_rows: int) -> datasets.DatasetDict:
    """The stand-in of `load_dataset("squad")`: SQuAD v1.1 dev articles of `../shared/data` (the train set is not
    to be had), flattened as `datasets` flattens SQuAD; articles 0-33 are `train`, 34-39 `validation` (split by
    article: questions of one paragraph share their context), the first rows of each."""
    import json

    articles = json.loads((SHARED_DATA / "squad" / "squad-v1.1-dev-articles-00-39.json").read_text())["data"]
    splits = {}
    for split, part, rows in (("train", articles[:34], train_rows), ("validation", articles[34:], validation_rows)):
        table = []
        for article in part:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    answers = {
                        "text": [a["text"] for a in qa["answers"]],
                        "answer_start": [a["answer_start"] for a in qa["answers"]],
                    }
                    table.append(
                        {
                            "id": qa["id"],
                            "title": article["title"],
                            "context": paragraph["context"],
                            "question": qa["question"],
                            "answers": answers,
                        }
                    )
        splits[split] = datasets.Dataset.from_list(table[:rows], features=SQUAD_FEATURES)
    return datasets.DatasetDict(splits)


def _fixture_rows(name: str) -> list[dict]:
    import json

    text = (SHARED_DATA / "fixtures" / name / "sample.json").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def swag(train_copies: int = 4) -> datasets.DatasetDict:
    """The stand-in of `load_dataset("swag", "regular")`: the SWAG rows of transformers' test fixtures
    (`../shared/data/fixtures/swag`: real SWAG rows), with SWAG's columns (`video-id`, `fold-ind`, `startphrase`,
    `gold-source` filled from them), `label` a `ClassLabel` of 4; `train` repeats them `train_copies` times so that
    a step of the notebook's 32 rows has its rows, `validation` holds them once."""
    rows = [
        {
            "video-id": f"fixture-{i}",
            "fold-ind": str(i),
            "startphrase": f"{r['sent1']} {r['sent2']}",
            "sent1": r["sent1"],
            "sent2": r["sent2"],
            "gold-source": "gold",
            **{f"ending{k}": r[f"ending{k}"] for k in range(4)},
            "label": r["label"],
        }
        for i, r in enumerate(_fixture_rows("swag"))
    ]
    features = datasets.Features(
        {
            **{name: datasets.Value("string") for name in rows[0] if name != "label"},
            "label": datasets.ClassLabel(names=["0", "1", "2", "3"]),
        }
    )
    return datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(rows * train_copies, features=features),
            "validation": datasets.Dataset.from_list(rows, features=features),
        }
    )


def conll2003(train_copies: int = 4) -> datasets.DatasetDict:
    """The stand-in of `load_dataset("conll2003")`: the CoNLL-2003 sentences of transformers' test fixtures
    (`../shared/data/fixtures/conll`: real rows with their NER tags), as `id`, `tokens` and `ner_tags` (a `Sequence`
    of CoNLL's 9 `ClassLabel` names); the fixture has no POS or chunk tags, so `pos_tags`/`chunk_tags` are left out
    (the notebook's task is `ner`). `train` repeats the rows `train_copies` times, `validation` holds them once."""
    rows = [
        {"id": str(i), "tokens": r["words"], "ner_tags": [CONLL_NER.index(tag) for tag in r["ner"]]}
        for i, r in enumerate(_fixture_rows("conll"))
    ]
    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "tokens": datasets.Sequence(datasets.Value("string")),
            "ner_tags": datasets.Sequence(datasets.ClassLabel(names=list(CONLL_NER))),
        }
    )
    return datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(rows * train_copies, features=features),
            "validation": datasets.Dataset.from_list(rows, features=features),
        }
    )


def wikitext2(rows: int) -> datasets.DatasetDict:
    """The stand-in of `load_dataset("wikitext", "wikitext-2-raw-v1")`: WikiText-2's lines of `../shared/data`
    (`wiki.valid.tokens` as `train`, `wiki.test.tokens` as `validation`: the train file is not there; tokenised
    text, `<unk>` included, where the raw set has the original words), read by `load_dataset("text")` as the
    notebook's own comment suggests, the first `rows` lines of each."""
    folder = SHARED_DATA / "wikitext2_tokens"
    files = {"train": str(folder / "wiki.valid.tokens"), "validation": str(folder / "wiki.test.tokens")}
    loaded = datasets.load_dataset("text", data_files=files)
    return datasets.DatasetDict({split: part.select(range(rows)) for split, part in loaded.items()})


class LocalMetric:
    """A metric of `evaluate` computed here: `evaluate.load(name)` (the successor of `datasets.load_metric`, gone
    in datasets 3) fetches the metric's script from the Hub. Same `compute(predictions=, references=)` results:
    GLUE's (accuracy; F1 for MRPC/QQP; Matthews for CoLA), seqeval's, SQuAD v1.1's (exact match and F1), ROUGE
    (`rouge_score`, with the bootstrap aggregation `load_metric("rouge")` returned: `low`/`mid`/`high`), sacreBLEU,
    WER (`jiwer`) and accuracy."""

    NAMES = ("glue", "seqeval", "squad", "rouge", "sacrebleu", "wer", "accuracy")

    def __init__(self, name: str, config_name: str | None = None) -> None:
        if name not in self.NAMES:
            raise ValueError(f"no local stand-in for the metric {name!r}")
        self.name, self.config_name = name, config_name

    def __repr__(self) -> str:
        return f"LocalMetric(name={self.name!r}, config_name={self.config_name!r})"

    def compute(self, *, predictions, references, **kwargs) -> dict:
        return getattr(self, f"_{self.name}")(predictions, references, **kwargs)

    def _glue(self, predictions, references) -> dict:
        from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

        if self.config_name == "cola":
            return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}
        scores = {"accuracy": float(accuracy_score(references, predictions))}
        if self.config_name in ("mrpc", "qqp"):
            scores["f1"] = float(f1_score(references, predictions))
        return scores

    @staticmethod
    def _seqeval(predictions, references) -> dict:
        from seqeval.metrics import accuracy_score, classification_report

        report = classification_report(references, predictions, output_dict=True, zero_division=0)
        for average in ("macro avg", "weighted avg"):
            report.pop(average)
        overall = report.pop("micro avg")
        scores = {
            kind: {"precision": s["precision"], "recall": s["recall"], "f1": s["f1-score"], "number": s["support"]}
            for kind, s in report.items()
        }
        scores["overall_precision"] = overall["precision"]
        scores["overall_recall"] = overall["recall"]
        scores["overall_f1"] = overall["f1-score"]
        scores["overall_accuracy"] = accuracy_score(references, predictions)
        return scores

    @staticmethod
    def _squad(predictions, references) -> dict:
        """SQuAD v1.1's exact match and F1 (percent), by torchmetrics' SQuAD metric as `utils_qa.squad_metrics`."""
        from torchmetrics.functional.text import squad

        scores = squad(list(predictions), list(references))
        return {"exact_match": float(scores["exact_match"]), "f1": float(scores["f1"])}

    @staticmethod
    def _rouge(predictions, references, rouge_types=None, use_stemmer=False):
        from rouge_score import rouge_scorer, scoring

        rouge_types = rouge_types or ["rouge1", "rouge2", "rougeL", "rougeLsum"]
        scorer = rouge_scorer.RougeScorer(rouge_types=rouge_types, use_stemmer=use_stemmer)
        aggregator = scoring.BootstrapAggregator()
        for reference, prediction in zip(references, predictions, strict=True):
            aggregator.add_scores(scorer.score(reference, prediction))
        return aggregator.aggregate()

    @staticmethod
    def _sacrebleu(predictions, references):
        import sacrebleu

        transposed = [list(group) for group in zip(*references, strict=True)]  # one list per reference position
        bleu = sacrebleu.corpus_bleu(predictions, transposed)
        return {
            "score": bleu.score,
            "counts": bleu.counts,
            "totals": bleu.totals,
            "precisions": bleu.precisions,
            "bp": bleu.bp,
            "sys_len": bleu.sys_len,
            "ref_len": bleu.ref_len,
        }

    @staticmethod
    def _wer(predictions, references):
        import jiwer

        return float(jiwer.wer(references, predictions))

    @staticmethod
    def _accuracy(predictions, references):
        return {"accuracy": float(np.mean(np.asarray(predictions) == np.asarray(references)))}


def load_metric(name: str, config_name: str | None = None) -> LocalMetric:
    """`datasets.load_metric(name, config_name)` (removed in datasets 3) and `evaluate.load(name)` for the metrics
    these notebooks load."""
    return LocalMetric(name, config_name)


local_metric = load_metric  # the name the generation and speech notebooks' stand-ins import


# --- seq2seq, vision and audio notebooks (summarization, translation, mT5, Flan-T5, image/audio classification,
# Whisper fine-tuning, Wav2Vec2 CTC fine-tuning): their models, preprocessors, data sets and metrics
WHISPER_TINY_EN_VOCAB = 50363  # the tokenizer of ../shared/models/whisper-tiny.en, which the Whisper stand-ins share
MODELS.update(
    {
        # the layer counts of the IPU configs the notebooks name: t5-small / bart-base 6 + 6, mt5-small 8 + 8,
        # t5-large and mt5-large 24 + 24 (encoder on the first four slots)
        "t5-small": StandIn("T5ForConditionalGeneration", "t5", {"num_layers": 6, "num_decoder_layers": 6}),
        "facebook/bart-base": StandIn(
            "BartForConditionalGeneration", "roberta", {"encoder_layers": 6, "decoder_layers": 6}
        ),
        "google/mt5-small": StandIn("MT5ForConditionalGeneration", "t5", {"num_layers": 8, "num_decoder_layers": 8}),
        "google/flan-t5-large": StandIn(
            "T5ForConditionalGeneration", "t5", {"num_layers": 24, "num_decoder_layers": 24}
        ),
        "alan-turing-institute/mt5-large-finetuned-mnli-xtreme-xnli": StandIn(
            "MT5ForConditionalGeneration", "t5", {"num_layers": 24, "num_decoder_layers": 24}
        ),
        # the notebook's IPU config: layers_per_ipu [12, 12]; its pipeline truncates to 1,024 tokens
        "facebook/bart-large-cnn": StandIn(
            "BartForConditionalGeneration",
            "roberta",
            {"encoder_layers": 12, "decoder_layers": 12, "max_position_embeddings": 1024},
        ),
        # vision and speech: no tokenizer family; the preprocessor of `PROCESSORS` saved beside the model
        "google/vit-base-patch16-224-in21k": StandIn("ViTModel", "", {"num_hidden_layers": 12}, processor="vit"),
        "facebook/hubert-base-ls960": StandIn(
            "HubertModel",
            "",
            {"num_hidden_layers": 12, "conv_kernel": (10, 4), "conv_stride": (5, 4)},
            processor="audio",
        ),
        "facebook/wav2vec2-base": StandIn(
            "Wav2Vec2Model",
            "",
            {"num_hidden_layers": 12, "conv_kernel": (10, 4), "conv_stride": (5, 4)},
            processor="audio",
        ),
        # Whisper small's 12 + 12 layers (the notebook's layers_per_ipu [5, 7, 5, 7]) and 30 s windows of 80 mel
        # bins, with whisper-tiny.en's tokenizer (Whisper's multilingual special tokens) and feature extractor
        "openai/whisper-small": StandIn(
            "WhisperForConditionalGeneration",
            "",
            {
                "encoder_layers": 12,
                "decoder_layers": 12,
                "num_mel_bins": 80,
                "max_source_positions": 1500,
                "max_target_positions": 448,
                "vocab_size": WHISPER_TINY_EN_VOCAB,
                "pad_token_id": 50256,
                "bos_token_id": 50256,
                "eos_token_id": 50256,
                "decoder_start_token_id": 50257,
            },
            processor="whisper",
        ),
    }
)


def save_tiny_model(path: Path, class_name: str, **config: object) -> Path:
    """A tiny random `class_name` model of a family without a tokenizer (vision, speech), with `config` overrides:
    the config of `tests/tiny_models_vision_speech.py` (or `tests/tiny_models.py` for ViT)."""
    import torch
    import transformers

    from optimum_ipu.models.plans import plan_for_class

    from .. import tiny_models, tiny_models_vision_speech

    family = plan_for_class(class_name).family
    try:
        model_config = tiny_models_vision_speech.tiny_config(family)
    except KeyError:
        model_config = tiny_models.tiny_config(family)
    model_config.update(dict(config))
    torch.manual_seed(0)
    getattr(transformers, class_name)(model_config).save_pretrained(path)
    return path


def _vit_processor(path: Path, shared_models: Path) -> None:
    import transformers

    transformers.ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(path)  # the tiny ViT's images


def _audio_processor(path: Path, shared_models: Path) -> None:
    import transformers

    transformers.Wav2Vec2FeatureExtractor(sampling_rate=16_000, return_attention_mask=True).save_pretrained(path)


def _whisper_processor(path: Path, shared_models: Path) -> None:
    """whisper-tiny.en's tokenizer and feature extractor; a multilingual generation config (its language tokens)."""
    import transformers

    processor = transformers.WhisperProcessor.from_pretrained(shared_models / "whisper-tiny.en")
    processor.save_pretrained(path)
    tokenizer = processor.tokenizer
    generation = transformers.GenerationConfig.from_pretrained(shared_models / "whisper-tiny.en")
    languages = transformers.models.whisper.tokenization_whisper.LANGUAGES
    generation.is_multilingual = True
    generation.lang_to_id = {f"<|{code}|>": tokenizer.convert_tokens_to_ids(f"<|{code}|>") for code in languages}
    generation.task_to_id = {t: tokenizer.convert_tokens_to_ids(f"<|{t}|>") for t in ("transcribe", "translate")}
    generation.save_pretrained(path)


PROCESSORS = {"vit": _vit_processor, "audio": _audio_processor, "whisper": _whisper_processor}


def xsum() -> datasets.DatasetDict:
    """The stand-in of `load_dataset("xsum")`: the 10 real XSum rows of transformers' test fixtures
    (`../shared/data/fixtures/xsum`), as `document`, `summary`, `id`; rows 0-5 `train`, 6-7 `validation`, 8-9 `test`."""
    rows = [
        {"document": r["document"], "summary": r["summary"], "id": str(i)} for i, r in enumerate(_fixture_rows("xsum"))
    ]
    parts = {"train": rows[:6], "validation": rows[6:8], "test": rows[8:]}
    return datasets.DatasetDict({split: datasets.Dataset.from_list(part) for split, part in parts.items()})


def wmt16_ro_en(train_rows: int, eval_rows: int = 8) -> datasets.DatasetDict:
    """The stand-in of `load_dataset("wmt16", "ro-en")`: WMT16's English-Romanian newsdev2016 (as `train`: the
    train set is not in `../shared/data`) and newstest2016 (`validation`, `test`), the first `rows` aligned lines of
    each, in its `translation` column (`{"ro": ..., "en": ...}`)."""
    import gzip

    def lines(name: str, lang: str) -> list[str]:
        with gzip.open(SHARED_DATA / "wmt16_en_ro" / f"{name}-enro.{lang}.gz", "rt", encoding="utf-8") as f:
            return f.read().splitlines()[: train_rows if name == "newsdev2016" else eval_rows]

    features = datasets.Features({"translation": datasets.Translation(languages=["ro", "en"])})
    splits = {}
    for split, name in (("train", "newsdev2016"), ("validation", "newstest2016"), ("test", "newstest2016")):
        aligned = zip(lines(name, "ro"), lines(name, "en"), strict=True)
        pairs = [{"translation": {"ro": ro, "en": en}} for ro, en in aligned]
        splits[split] = datasets.Dataset.from_list(pairs, features=features)
    return datasets.DatasetDict(splits)


def _wikitext_articles() -> list[tuple[str, str]]:
    """WikiText-2's validation articles: (title, text) with its ` = Title = ` headings as they are in the file."""
    articles: list[tuple[str, list[str]]] = []
    for line in (SHARED_DATA / "wikitext2_tokens" / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("= ") and not line.startswith("= =") and line.endswith(" ="):
            articles.append((line.strip("= "), []))
        elif line and articles:
            articles[-1][1].append(line)
    return [(title, "\n".join(text)) for title, text in articles]


class _WikipediaPage:
    def __init__(self, title: str, content: str) -> None:
        self.title, self.content = title, content


class wikipedia:  # noqa: N801 - stands in for the `wikipedia` package in the notebook's own code
    """`wikipedia.page(title).content` (a live download): WikiText-2's first validation article (a Wikipedia
    article, tokenised) whatever the title."""

    @staticmethod
    def page(title: str) -> _WikipediaPage:
        name, text = _wikitext_articles()[0]
        return _WikipediaPage(name, text)


def wikitext_documents(rows: int = 8) -> datasets.DatasetDict:
    """The stand-in of a data set of documents to summarize (`rungalileo/medical_transcription_40`: `text` and
    `label`): the first `rows` WikiText-2 validation articles as `train`."""
    articles = _wikitext_articles()[:rows]
    table = {"text": [text for _, text in articles], "label": [0] * len(articles)}
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict(table)})


FSDD_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _fsdd(split: str, rows: int) -> list[dict]:
    """`rows` FSDD recordings of `split` spread evenly over it (its digits and speakers vary), at 16 kHz."""
    import csv

    from optimum_ipu.pipelines.audio import load_audio

    folder = SHARED_DATA / "audio" / "fsdd" / split
    with open(folder / "metadata.csv", newline="") as f:
        table = list(csv.DictReader(f))
    table = table[:: max(1, len(table) // rows)][:rows]
    return [
        {
            "file": str(folder / r["file_name"]),
            "audio": {"array": load_audio(str(folder / r["file_name"]), 16_000), "sampling_rate": 16_000},
            "label": int(r["label"]),
            "text": r["transcription"],
            "speaker": r["speaker"],
        }
        for r in table
    ]


def _audio_split(rows: list[dict], columns: dict[str, str]) -> datasets.Dataset:
    """`rows` with their columns renamed as `columns` says (`"audio"` kept), decoded as `datasets` decodes audio."""
    table = [{new: r[old] for old, new in columns.items()} for r in rows]
    return datasets.Dataset.from_list(table).with_transform(_decoded)


def keyword_spotting(train_rows: int = 16, eval_rows: int = 16) -> datasets.DatasetDict:
    """The stand-in of `load_dataset("superb", "ks")` (spoken keywords, `file`, `audio` at 16 kHz, `label` a
    `ClassLabel`): Free Spoken Digit recordings of `../shared/data` resampled to 16 kHz, `label` the digit (names
    `zero` ... `nine`); FSDD's train split as `train`, its test split as `validation` and `test`."""
    names = datasets.ClassLabel(names=list(FSDD_WORDS))
    splits = {}
    for split, source, rows in (
        ("train", "train", train_rows),
        ("validation", "test", eval_rows),
        ("test", "test", eval_rows),
    ):
        part = _audio_split(
            _fsdd(source, rows),
            {"file": "file", "audio": "audio", "label": "label"},
        )
        splits[split] = part.cast_column("label", names).with_transform(_decoded)
    return datasets.DatasetDict(splits)


def spoken_sentences(rows: int, columns: dict[str, str], split: str = "train") -> datasets.Dataset:
    """Recordings with their transcription (a speech recognition set: LibriSpeech's `audio`, `text`; OpenSLR's
    `path`, `audio`, `sentence`): FSDD's spoken digits of `split` at 16 kHz, its columns named as `columns` maps
    FSDD's (`file`, `audio`, `text`, `speaker`)."""
    return _audio_split(_fsdd(split, rows), columns)


def nltk_sentences(text: str, language: str = "english") -> list[str]:
    """`nltk.sent_tokenize` without its punkt model (a download): sentences end at `.`, `!` or `?` and a space."""
    import re

    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]
