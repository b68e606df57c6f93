#!/usr/bin/env python
"""Fine-tune (or train from scratch) an audio classifier (Wav2Vec2, HuBERT, Whisper's encoder, ...) with `IPUTrainer`.

The flags of the `transformers` example of the same name, plus `--ipu_config_name` and the other
`IPUTrainingArguments`. From this folder (it reads `./ipu_config.json`), the recipe of Optimum Graphcore:

    python run_audio_classification.py --ipu_config_name=./ --model_name_or_path facebook/wav2vec2-base \\
      --dataset_name superb --dataset_config_name ks --output_dir ./output --remove_unused_columns False \\
      --do_train --do_eval --learning_rate 3e-5 --max_length_seconds 1 --attention_mask False \\
      --num_train_epochs 5 --per_device_train_batch_size 1 --per_device_eval_batch_size 1

Data: `--dataset_name` (from the Hugging Face Hub or its local cache; its audio is decoded here, not by `datasets`),
or `--train_dir` / `--eval_dir`, `audiofolder` splits (audio files with a `metadata.csv` naming them in `file_name`
and giving the labels). Audio is decoded with `soundfile` (WAV, FLAC, OGG; no FFmpeg), made mono and resampled to
the feature extractor's rate. Every clip becomes `--max_length_seconds` of audio, so every batch has one shape:
training clips are cut at a random offset (as `transformers`' script does), evaluation clips keep their start;
shorter clips are padded (with an attention mask where the feature extractor returns one). Without pretrained
weights, train from scratch: `--model_type wav2vec2 --config_overrides "hidden_size=64,..."` (the family's feature
extractor at 16 kHz). Writes `train_results.json`, `eval_results.json` (`eval_accuracy`, from `torchmetrics`),
`all_results.json`, and the model with its feature extractor and `ipu_config.json`.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import logging
from dataclasses import dataclass, field
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from example_utils import audio, classification
from transformers import AutoFeatureExtractor, AutoModelForAudioClassification, set_seed
from transformers.models.auto.feature_extraction_auto import feature_extractor_class_from_name

from optimum_ipu import IPUTrainingArguments
from optimum_ipu.errors import run_script
from optimum_ipu.pipelines.audio import load_audio

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    """Which model, config and feature extractor to fine-tune (or which family to train from scratch)."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Model id on the Hugging Face Hub (downloaded once, then cached) or a folder; leave "
            "out to train from scratch (--model_type or --config_name)."
        },
    )
    model_type: str | None = field(default=None, metadata={"help": "Family to train from scratch, e.g. wav2vec2."})
    config_overrides: str | None = field(
        default=None, metadata={"help": "From scratch: config values, e.g. 'hidden_size=64,num_hidden_layers=2'."}
    )
    config_name: str | None = field(default=None, metadata={"help": "Config folder or id, if not the model's."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where Hub downloads are cached."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the model."})
    feature_extractor_name: str | None = field(default=None, metadata={"help": "Feature extractor folder or id."})
    freeze_feature_encoder: bool = field(
        default=True, metadata={"help": "Do not train the convolutional feature encoder (a pretrained one)."}
    )
    freeze_encoder: bool = field(
        default=False,
        metadata={"help": "Whisper: do not train the pretrained encoder, only the projector and classifier."},
    )
    attention_mask: bool = field(
        default=True, metadata={"help": "Give the model an attention mask over the padding (if the extractor can)."}
    )
    token: str | None = field(default=None, metadata={"help": "Hugging Face Hub token."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the model's repository."})
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Load a model whose classification head has another number of labels."}
    )

    def __post_init__(self) -> None:
        classification.check_model_arguments(self, "wav2vec2, hubert")
        if self.model_name_or_path is None and self.model_type is None and self.config_name is None:
            raise ValueError(
                "give --model_name_or_path, or --model_type (e.g. wav2vec2) / --config_name to train from scratch"
            )


@dataclass
class DataTrainingArguments:
    """What audio to train and evaluate on."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Dataset id on the Hub, or a local dataset folder."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_dir: str | None = field(default=None, metadata={"help": "Training split: an audiofolder (metadata.csv)."})
    eval_dir: str | None = field(default=None, metadata={"help": "Evaluation split: an audiofolder."})
    train_split_name: str = field(default="train", metadata={"help": "The training split of --dataset_name."})
    eval_split_name: str = field(default="validation", metadata={"help": "The evaluation split of --dataset_name."})
    audio_column_name: str = field(default="audio", metadata={"help": "The column of the audio."})
    label_column_name: str = field(default="label", metadata={"help": "The column of the labels."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})
    max_length_seconds: float = field(default=20.0, metadata={"help": "Seconds of audio per clip (cut or padded)."})

    def __post_init__(self) -> None:
        if self.dataset_name is None and self.train_dir is None and self.eval_dir is None:
            raise ValueError("give --dataset_name or --train_dir/--eval_dir (audiofolder splits with metadata.csv)")
        if self.max_length_seconds <= 0:
            raise ValueError(f"--max_length_seconds {self.max_length_seconds}: expected a positive duration")


def load_raw_datasets(data: DataTrainingArguments, model: ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / eval splits, from audiofolder folders or the local `datasets` cache (audio left undecoded)."""
    if data.dataset_name is None:
        return audio.read_audio_dirs(data)
    raw = example_utils.load_hub_dataset(
        data.dataset_name,
        data.dataset_config_name,
        local_files_hint=(
            "--train_dir train --eval_dir test (audiofolder layout: WAV/FLAC files, metadata.csv with file_name, label)"
        ),
        cache_dir=model.cache_dir,
        token=model.token,
    )
    splits = {"train": data.train_split_name, "eval": data.eval_split_name}
    return {split: audio.undecoded(raw[name], data.audio_column_name) for split, name in splits.items() if name in raw}


def build_model(
    model_args: ModelArguments, labels: list[str], training_args: IPUTrainingArguments
) -> tuple[transformers.PreTrainedModel, transformers.FeatureExtractionMixin]:
    """The classifier (pretrained, or new from `--model_type` / `--config_name`) and its feature extractor."""
    model, config = classification.load_classifier(
        AutoModelForAudioClassification, model_args, labels, "audio-classification", training_args
    )
    source = model_args.feature_extractor_name or model_args.model_name_or_path
    if source:
        hub = example_utils.hub_kwargs(model_args)
        extractor = AutoFeatureExtractor.from_pretrained(source, return_attention_mask=model_args.attention_mask, **hub)
    else:
        extractor = family_feature_extractor(config)
    if model_args.freeze_feature_encoder and hasattr(model, "freeze_feature_encoder"):
        model.freeze_feature_encoder()
    if model_args.freeze_encoder:
        if not hasattr(model, "freeze_encoder"):
            raise ValueError(f"--freeze_encoder: {type(model).__name__} has no encoder to freeze; leave it out")
        model.freeze_encoder()
    return model, extractor


def family_feature_extractor(config: transformers.PretrainedConfig) -> transformers.FeatureExtractionMixin:
    """The default feature extractor of a config's family (16 kHz, normalized), with an attention mask when the
    model's feature encoder normalizes each frame alone (`feat_extract_norm="layer"`), as its checkpoints have."""
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES

    name = FEATURE_EXTRACTOR_MAPPING_NAMES.get(config.model_type)
    if not name:
        raise ValueError(
            f"--model_type {config.model_type}: transformers has no feature extractor for it; pass "
            "--feature_extractor_name"
        )
    masked = getattr(config, "feat_extract_norm", "layer") == "layer"
    return feature_extractor_class_from_name(name)(do_normalize=True, return_attention_mask=masked)


def fixed_length(waveform: np.ndarray, length: int, rng: np.random.Generator | None) -> np.ndarray:
    """`waveform` cut to `length` samples (at a random offset with `rng`, else from the start)."""
    if len(waveform) <= length:
        return waveform
    start = int(rng.integers(0, len(waveform) - length + 1)) if rng is not None else 0
    return waveform[start : start + length]


def collate_fn(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack the fixed-length clips (and masks) and their labels."""
    batch = {key: torch.stack([torch.as_tensor(e[key]) for e in examples]) for key in examples[0] if key != "labels"}
    batch["labels"] = torch.tensor([e["labels"] for e in examples], dtype=torch.long)
    return batch


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        ModelArguments, DataTrainingArguments, IPUTrainingArguments
    )
    example_utils.setup_logging(training_args, logger)

    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)

    raw = load_raw_datasets(data_args, model_args)
    audio_column, label_column = data_args.audio_column_name, data_args.label_column_name
    example_utils.check_columns(raw, {"--audio_column_name": audio_column, "--label_column_name": label_column})
    labels = classification.label_names(raw, label_column, "eval")
    model, feature_extractor = build_model(model_args, labels, training_args)
    rate = feature_extractor.sampling_rate
    length = int(round(data_args.max_length_seconds * rate))
    label_ids = classification.label_encoder(raw, label_column, labels)
    rng = np.random.default_rng(training_args.seed)
    whisper_window = getattr(feature_extractor, "n_samples", None)

    def transform(batch: dict[str, list], train: bool) -> dict[str, list]:
        """Decode, resample, cut to `length` samples, and run the feature extractor padding to `length`."""
        clips = [fixed_length(load_audio(a, rate), length, rng if train else None) for a in batch[audio_column]]
        # Whisper's extractor makes its fixed window of features (30 s) whatever the clip; others pad to `length`
        padding = {} if whisper_window else {"padding": "max_length", "max_length": length, "truncation": True}
        features = feature_extractor(clips, sampling_rate=rate, return_tensors="np", **padding)
        out = {key: list(value) for key, value in features.items()}
        out["labels"] = label_ids(batch[label_column])
        return out

    def prepared(split: str, limit: int | None, flag: str) -> datasets.Dataset:
        train = split == "train"
        return classification.transformed_split(
            raw, split, limit, flag, training_args.seed, lambda batch: transform(batch, train=train)
        )

    splits = {
        "train": lambda: prepared("train", data_args.max_train_samples, "--do_train"),
        "eval": lambda: prepared("eval", data_args.max_eval_samples, "--do_eval"),
    }
    classification.train_and_evaluate(
        model, training_args, splits, len(labels), feature_extractor, collate_fn, last_checkpoint, model_args, data_args
    )


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
