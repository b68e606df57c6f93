#!/usr/bin/env python
"""Fine-tune (or train from scratch) a CTC speech recognizer (Wav2Vec2, HuBERT) with `IPUTrainer`, scored by word and
character error rates (`jiwer`).

The flags of the `transformers` example of the same name, plus `--ipu_config_name` and the other
`IPUTrainingArguments`. From this folder, the recipe of Optimum Graphcore (LibriSpeech, 4 stages):

    python run_speech_recognition_ctc.py --ipu_config_name Graphcore/wav2vec2-ctc-base-ipu \\
      --model_name_or_path facebook/wav2vec2-base --dataset_name librispeech_asr --dataset_config_name clean \\
      --train_split_name train.100 --eval_split_name validation --output_dir ./output --overwrite_output_dir \\
      --num_train_epochs 10 --per_device_train_batch_size 1 --learning_rate 3e-4 --warmup_ratio 0.1 \\
      --text_column_name text --max_duration_in_seconds 15 --do_train --do_eval

Data: `--dataset_name` (from the Hugging Face Hub or its local cache; audio decoded here), or `--train_dir` /
`--eval_dir`, `audiofolder` splits (a `metadata.csv` with `file_name` and `--text_column_name`). Transcriptions are
lower-cased and stripped of `--chars_to_ignore`; the vocabulary is built from their characters (`|` between words,
`[UNK]`, `[PAD]` as the CTC blank) and saved as `vocab.json` beside the model. Audio is decoded with `soundfile`,
resampled to 16 kHz, and every clip padded to `--max_duration_in_seconds` (longer ones, and those under
`--min_duration_in_seconds`, left out), every label sequence to the longest transcription: one shape for every batch.
Writes `train_results.json`, `eval_results.json` (`eval_wer`, `eval_cer`), `all_results.json`, the model, its feature
extractor and tokenizer, and `ipu_config.json`.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any

import datasets
import jiwer
import numpy as np
import torch
import transformers
from example_utils import audio
from transformers import (
    CONFIG_MAPPING,
    AutoConfig,
    AutoFeatureExtractor,
    AutoModelForCTC,
    EvalPrediction,
    Wav2Vec2CTCTokenizer,
    Wav2Vec2FeatureExtractor,
    set_seed,
)

from optimum_ipu import IPUTrainer, IPUTrainingArguments
from optimum_ipu.errors import run_script
from optimum_ipu.pipelines.audio import load_audio

logger = logging.getLogger(__name__)

METRICS = ("wer", "cer")


@dataclass
class ModelArguments:
    """Which model to fine-tune (or which family to train from scratch), and its regularisation."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Model id on the Hugging Face Hub (downloaded once, then cached) or a folder; leave "
            "out to train from scratch (--model_type)."
        },
    )
    model_type: str | None = field(default=None, metadata={"help": "Family to train from scratch: wav2vec2, hubert."})
    config_overrides: str | None = field(
        default=None, metadata={"help": "From scratch: config values, e.g. 'hidden_size=64,num_hidden_layers=2'."}
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "A CTC tokenizer folder; by default a vocabulary is built from the data."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where Hub downloads are cached."})
    freeze_feature_encoder: bool = field(default=True, metadata={"help": "Do not train the feature encoder."})
    attention_dropout: float = field(default=0.0, metadata={"help": "Dropout of the attention probabilities."})
    activation_dropout: float = field(default=0.0, metadata={"help": "Dropout inside the feed-forward layers."})
    feat_proj_dropout: float = field(default=0.0, metadata={"help": "Dropout of the feature projection."})
    hidden_dropout: float = field(default=0.0, metadata={"help": "Dropout of the hidden states."})
    final_dropout: float = field(default=0.0, metadata={"help": "Dropout before the CTC head."})
    mask_time_prob: float = field(default=0.05, metadata={"help": "SpecAugment: share of frames masked in time."})
    mask_time_length: int = field(default=10, metadata={"help": "SpecAugment: frames per time mask."})
    mask_feature_prob: float = field(default=0.0, metadata={"help": "SpecAugment: share of features masked."})
    mask_feature_length: int = field(default=10, metadata={"help": "SpecAugment: features per feature mask."})
    layerdrop: float = field(default=0.0, metadata={"help": "Probability of skipping a layer in training."})
    ctc_loss_reduction: str = field(default="mean", metadata={"help": "CTC loss reduction: mean or sum."})
    ctc_zero_infinity: bool = field(default=False, metadata={"help": "Zero infinite CTC losses (too-short inputs)."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face Hub token."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the model's repository."})

    def __post_init__(self) -> None:
        if self.model_type is not None and self.model_type not in CONFIG_MAPPING:
            raise ValueError(f"--model_type {self.model_type}: unknown to transformers; e.g. wav2vec2, hubert")
        if self.config_overrides is not None and self.model_name_or_path is not None:
            raise ValueError(
                "--config_overrides changes the config of a model trained from scratch; leave out --model_name_or_path"
            )
        if self.model_name_or_path is None and self.model_type is None:
            raise ValueError("give --model_name_or_path, or --model_type (e.g. wav2vec2) to train from scratch")
        if self.ctc_loss_reduction not in ("mean", "sum"):
            raise ValueError(f"--ctc_loss_reduction {self.ctc_loss_reduction}: expected mean or sum")


@dataclass
class DataTrainingArguments:
    """What speech to train and evaluate on, and how its transcriptions are normalized."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Dataset id on the Hub, or a local dataset folder."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_dir: str | None = field(default=None, metadata={"help": "Training split: an audiofolder (metadata.csv)."})
    eval_dir: str | None = field(default=None, metadata={"help": "Evaluation split: an audiofolder."})
    train_split_name: str = field(default="train+validation", metadata={"help": "Training split(s), '+'-joined."})
    eval_split_name: str = field(default="test", metadata={"help": "The evaluation split of --dataset_name."})
    audio_column_name: str = field(default="audio", metadata={"help": "The column of the audio."})
    text_column_name: str = field(default="text", metadata={"help": "The column of the transcriptions."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes that decode the clips and tokenize the transcriptions."}
    )
    chars_to_ignore: list[str] | None = field(default=None, metadata={"help": "Characters removed from the text."})
    eval_metrics: list[str] = field(default_factory=lambda: list(METRICS), metadata={"help": "wer and/or cer."})
    max_duration_in_seconds: float = field(
        default=20.0, metadata={"help": "Clips are padded to this; longer ones are left out."}
    )
    min_duration_in_seconds: float = field(default=0.0, metadata={"help": "Shorter clips are left out."})
    unk_token: str = field(default="[UNK]", metadata={"help": "The unknown token of a built vocabulary."})
    pad_token: str = field(default="[PAD]", metadata={"help": "The padding token (CTC blank) of a built vocabulary."})
    word_delimiter_token: str = field(default="|", metadata={"help": "The word delimiter of a built vocabulary."})

    def __post_init__(self) -> None:
        if self.dataset_name is None and self.train_dir is None and self.eval_dir is None:
            raise ValueError("give --dataset_name or --train_dir/--eval_dir (audiofolder splits with metadata.csv)")
        unknown = [m for m in self.eval_metrics if m not in METRICS]
        if unknown:
            raise ValueError(f"--eval_metrics {' '.join(unknown)}: unknown; choose from {', '.join(METRICS)}")
        if self.max_duration_in_seconds <= self.min_duration_in_seconds:
            raise ValueError(
                f"--max_duration_in_seconds {self.max_duration_in_seconds} must be more than "
                f"--min_duration_in_seconds {self.min_duration_in_seconds}"
            )


def load_raw_datasets(data: DataTrainingArguments, model: ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / eval splits, from audiofolder folders or the Hugging Face Hub or its local cache (audio left
    undecoded)."""
    return audio.load_transcribed_splits(data, model)


def normalizer(chars_to_ignore: list[str] | None):
    """Lower-case a transcription and remove `chars_to_ignore` (as `transformers`' script does)."""
    pattern = re.compile(f"[{re.escape(''.join(chars_to_ignore))}]") if chars_to_ignore else None

    def normalize(text: str) -> str:
        text = text.lower()
        return pattern.sub("", text) if pattern else text

    return normalize


def build_vocabulary(texts: list[str], data: DataTrainingArguments) -> dict[str, int]:
    """Every character of the transcriptions, sorted, with `|` for the space (there even if no text has two words),
    then the unknown and padding tokens."""
    chars = sorted(set("".join(texts)) | {" "})
    vocab = {(data.word_delimiter_token if c == " " else c): i for i, c in enumerate(chars)}
    for token in (data.unk_token, data.pad_token):
        vocab.setdefault(token, len(vocab))
    return vocab


def build_model(
    model_args: ModelArguments, tokenizer: Wav2Vec2CTCTokenizer, training_args: IPUTrainingArguments
) -> tuple[transformers.PreTrainedModel, Wav2Vec2FeatureExtractor]:
    """The CTC model with a head over the tokenizer's vocabulary, and its feature extractor."""
    overrides = {
        key: getattr(model_args, key)
        for key in (
            "attention_dropout",
            "activation_dropout",
            "feat_proj_dropout",
            "hidden_dropout",
            "final_dropout",
            "mask_time_prob",
            "mask_time_length",
            "mask_feature_prob",
            "mask_feature_length",
            "layerdrop",
            "ctc_loss_reduction",
            "ctc_zero_infinity",
        )
    }
    overrides |= {"pad_token_id": tokenizer.pad_token_id, "vocab_size": len(tokenizer)}
    hub = example_utils.hub_kwargs(model_args)
    if model_args.model_name_or_path:
        config = AutoConfig.from_pretrained(model_args.model_name_or_path, **hub)
        config.update(overrides)
        model = example_utils.load_pretrained(
            AutoModelForCTC,
            model_args.model_name_or_path,
            training_args,
            config=config,
            ignore_mismatched_sizes=True,
            **hub,
        )
        extractor = AutoFeatureExtractor.from_pretrained(model_args.model_name_or_path, **hub)
    else:
        config = example_utils.new_config(model_args.model_type, model_args.config_overrides)
        config.update(overrides)
        logger.info("Training a new %s model from scratch", config.model_type)
        model = AutoModelForCTC.from_config(config, trust_remote_code=model_args.trust_remote_code)
        # an attention mask only for feature encoders that normalize each frame alone, as the checkpoints have it
        masked = getattr(config, "feat_extract_norm", "group") == "layer"
        extractor = Wav2Vec2FeatureExtractor(do_normalize=True, return_attention_mask=masked)
    if model_args.freeze_feature_encoder and hasattr(model, "freeze_feature_encoder"):
        model.freeze_feature_encoder()
    return model, extractor


def error_rates(tokenizer: Wav2Vec2CTCTokenizer, metrics: list[str], frames: list[int] | None = None):
    """`compute_metrics`: word and character error rates (`jiwer`) of the greedy CTC transcriptions.

    `frames`: each evaluation clip's number of output frames (the model's frames of its own samples, in the
    dataset's order). Clips are padded to the longest duration, and the frames of that padding would be decoded
    too, as letters the clip never held: they are blanks here, as `pipeline()` and a clip run alone leave them out.
    """

    def compute(p: EvalPrediction) -> dict[str, float]:
        pred_ids = np.array(p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions)
        if frames is not None:
            if len(frames) != len(pred_ids):
                raise ValueError(f"{len(pred_ids)} predictions for {len(frames)} evaluation clips")
            pred_ids[np.arange(pred_ids.shape[1])[None, :] >= np.asarray(frames)[:, None]] = tokenizer.pad_token_id
        labels = np.where(p.label_ids == -100, tokenizer.pad_token_id, p.label_ids)
        predicted = tokenizer.batch_decode(pred_ids)
        # labels are the characters themselves: no grouping of repeated ones ("ll" stays "ll")
        references = tokenizer.batch_decode(labels, group_tokens=False)
        scores = {"wer": jiwer.wer, "cer": jiwer.cer}
        return {name: float(scores[name](references, predicted)) for name in metrics}

    return compute


def make_tokenizer(
    model_args: ModelArguments, data_args: DataTrainingArguments, texts: dict[str, list[str]], output_dir: str
) -> Wav2Vec2CTCTokenizer:
    """The given tokenizer, or one over the characters of the transcriptions (its vocab.json in `output_dir`)."""
    if model_args.tokenizer_name_or_path:
        return Wav2Vec2CTCTokenizer.from_pretrained(model_args.tokenizer_name_or_path)
    os.makedirs(output_dir, exist_ok=True)
    vocab_file = os.path.join(output_dir, "vocab.json")
    with open(vocab_file, "w", encoding="utf-8") as f:
        json.dump(build_vocabulary(texts.get("train", []) + texts.get("eval", []), data_args), f)
    return Wav2Vec2CTCTokenizer(
        vocab_file,
        unk_token=data_args.unk_token,
        pad_token=data_args.pad_token,
        word_delimiter_token=data_args.word_delimiter_token,
    )


def prepare_split(
    split: str,
    dataset: datasets.Dataset,
    texts: list[str],
    limit: int | None,
    feature_extractor: Any,
    tokenizer: Wav2Vec2CTCTokenizer,
    label_length: int,
    data_args: DataTrainingArguments,
    training_args: IPUTrainingArguments,
) -> datasets.Dataset:
    """Decode, resample and pad every clip to the longest duration; tokenize and pad every transcription; leave
    out the clips outside the durations."""
    rate = feature_extractor.sampling_rate
    max_samples = int(round(data_args.max_duration_in_seconds * rate))
    min_samples = int(round(data_args.min_duration_in_seconds * rate))
    dataset = dataset.add_column("_text", texts)
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))

    def features(batch: dict[str, list]) -> dict[str, list]:
        clips = [load_audio(a, rate) for a in batch[data_args.audio_column_name]]
        out = dict(
            feature_extractor(clips, sampling_rate=rate, padding="max_length", max_length=max_samples, truncation=True)
        )
        out["input_length"] = [len(c) for c in clips]
        ids = tokenizer(batch["_text"]).input_ids
        out["labels"] = [seq + [-100] * (label_length - len(seq)) for seq in ids]
        return out

    with training_args.main_process_first(desc=f"decode {split}"):
        dataset = dataset.map(
            features,
            batched=True,
            remove_columns=dataset.column_names,
            num_proc=data_args.preprocessing_num_workers,
            desc=f"decode {split}",
        )
    kept = dataset.filter(
        lambda n: min_samples <= n <= max_samples,
        input_columns="input_length",
        num_proc=data_args.preprocessing_num_workers,
    )
    if len(kept) < len(dataset):
        bounds = (data_args.min_duration_in_seconds, data_args.max_duration_in_seconds)
        left_out = len(dataset) - len(kept)
        logger.warning("%s: %d of %d clips are outside %s s and left out", split, left_out, len(dataset), bounds)
    return kept.with_format("torch")  # input_length: the clips' own samples (the evaluation's frames)


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        ModelArguments, DataTrainingArguments, IPUTrainingArguments
    )
    example_utils.setup_logging(training_args, logger)
    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)
    raw = load_raw_datasets(data_args, model_args)
    columns = {"--audio_column_name": data_args.audio_column_name, "--text_column_name": data_args.text_column_name}
    example_utils.check_columns(raw, columns)
    normalize = normalizer(data_args.chars_to_ignore)
    texts = {split: [normalize(str(t)) for t in dataset[data_args.text_column_name]] for split, dataset in raw.items()}
    tokenizer = make_tokenizer(model_args, data_args, texts, training_args.output_dir)
    model, feature_extractor = build_model(model_args, tokenizer, training_args)
    label_length = max(len(tokenizer(t).input_ids) for split_texts in texts.values() for t in split_texts)

    def prepared(split: str, limit: int | None, flag: str) -> datasets.Dataset:
        if split not in raw:
            raise ValueError(f"{flag} needs a {split} dataset: give --{split}_dir (or --dataset_name with one)")
        args = (feature_extractor, tokenizer, label_length, data_args, training_args)
        return prepare_split(split, raw[split], texts[split], limit, *args)

    train_dataset = prepared("train", data_args.max_train_samples, "--do_train") if training_args.do_train else None
    eval_dataset = prepared("eval", data_args.max_eval_samples, "--do_eval") if training_args.do_eval else None
    eval_frames = None
    if eval_dataset is not None:  # each clip's frames of its own samples: the padding's are not decoded
        samples = torch.as_tensor(eval_dataset.with_format(None)["input_length"])
        eval_frames = model._get_feat_extract_output_lengths(samples).tolist()
    train_dataset, eval_dataset = (
        d.remove_columns("input_length") if d is not None else None for d in (train_dataset, eval_dataset)
    )
    feature_extractor.save_pretrained(training_args.output_dir)
    tokenizer.save_pretrained(training_args.output_dir)
    trainer = IPUTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        compute_metrics=error_rates(tokenizer, data_args.eval_metrics, eval_frames),
        preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(dim=-1),
        processing_class=feature_extractor,
    )
    if training_args.do_train:
        if not example_utils.train(trainer, training_args, last_checkpoint, len(train_dataset)):
            return
        tokenizer.save_pretrained(training_args.output_dir)
    if training_args.do_eval:
        example_utils.evaluate(trainer, len(eval_dataset))
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
