#!/usr/bin/env python
"""Fine-tune a sequence-to-sequence speech recognizer (Whisper) with `IPUSeq2SeqTrainer`, scored by word error rate
(`jiwer`) on transcriptions generated at static shapes.

The flags of the `transformers` example of the same name, plus `--ipu_config_name` and the other
`IPUSeq2SeqTrainingArguments`. From this folder, Whisper-tiny on Common Voice (2 stages: encoder, decoder):

    python run_speech_recognition_seq2seq.py --ipu_config_name Graphcore/whisper-tiny-ipu \\
      --model_name_or_path openai/whisper-tiny --dataset_name mozilla-foundation/common_voice_11_0 \\
      --dataset_config_name hi --language hindi --task transcribe --train_split_name train+validation \\
      --eval_split_name test --max_steps 5000 --output_dir ./output --per_device_train_batch_size 1 \\
      --learning_rate 1e-5 --warmup_steps 500 --do_train --do_eval --predict_with_generate \\
      --generation_max_length 225 --text_column_name sentence --do_lower_case

Data: `--dataset_name` (from the Hugging Face Hub or its local cache; audio decoded here), or `--train_dir` /
`--eval_dir`, `audiofolder` splits (a `metadata.csv` with `file_name` and `--text_column_name`). Audio is decoded with
`soundfile` and resampled to the feature extractor's rate; Whisper's feature extractor pads (or cuts) every clip to
its 30 s window, and every label sequence is padded to the longest transcription, so every batch has one shape. With
`--predict_with_generate`, evaluation generates through `optimum_ipu.models.generation.generate_static` (transformers'
static KV cache, the batch padded to its full size). Writes `train_results.json`, `eval_results.json` (`eval_wer`),
`all_results.json`, and the model with its processors and `ipu_config.json`.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import datasets
import jiwer
import numpy as np
import torch
import transformers
from example_utils import audio
from transformers import (
    AutoConfig,
    AutoFeatureExtractor,
    AutoModelForSpeechSeq2Seq,
    AutoTokenizer,
    EvalPrediction,
    set_seed,
)

from optimum_ipu import IPUSeq2SeqTrainer, IPUSeq2SeqTrainingArguments
from optimum_ipu.errors import run_script
from optimum_ipu.pipelines.audio import load_audio

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    """Which model, tokenizer and feature extractor to fine-tune."""

    model_name_or_path: str = field(
        metadata={"help": "Model id on the Hugging Face Hub (downloaded once, then cached) or a folder."}
    )
    config_name: str | None = field(default=None, metadata={"help": "Config folder or id, if not the model's."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer folder or id, if not the model's."})
    feature_extractor_name: str | None = field(
        default=None, metadata={"help": "Feature extractor, if not the model's."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where Hub downloads are cached."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the model."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face Hub token."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the model's repository."})
    freeze_encoder: bool = field(default=False, metadata={"help": "Train the decoder only."})
    apply_spec_augment: bool = field(default=False, metadata={"help": "SpecAugment on the input features."})


@dataclass
class DataTrainingArguments:
    """What speech to train and evaluate on."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Dataset id on the Hub, or a local dataset folder."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_dir: str | None = field(default=None, metadata={"help": "Training split: an audiofolder (metadata.csv)."})
    eval_dir: str | None = field(default=None, metadata={"help": "Evaluation split: an audiofolder."})
    train_split_name: str = field(default="train", metadata={"help": "Training split(s), '+'-joined."})
    eval_split_name: str = field(default="test", metadata={"help": "The evaluation split of --dataset_name."})
    audio_column_name: str = field(default="audio", metadata={"help": "The column of the audio."})
    text_column_name: str = field(default="text", metadata={"help": "The column of the transcriptions."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation examples."})
    do_lower_case: bool = field(default=False, metadata={"help": "Lower-case the transcriptions."})
    language: str | None = field(
        default=None, metadata={"help": "Whisper: the language, e.g. english (multilingual checkpoints)."}
    )
    task: str = field(default="transcribe", metadata={"help": "Whisper: transcribe or translate."})
    do_normalize_eval: bool = field(
        default=True,
        metadata={
            "help": "Score the word error rate on normalized text: Whisper's English normalizer for English (case, "
            "punctuation, numbers as digits: 'Seven.' and 'seven' are the same word), its basic one otherwise."
        },
    )

    def __post_init__(self) -> None:
        if self.dataset_name is None and self.train_dir is None and self.eval_dir is None:
            raise ValueError("give --dataset_name or --train_dir/--eval_dir (audiofolder splits with metadata.csv)")


def load_raw_datasets(data: DataTrainingArguments, model: ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / eval splits, from audiofolder folders or the Hugging Face Hub or its local cache (audio left
    undecoded)."""
    return audio.load_transcribed_splits(data, model)


def load_model(
    model_args: ModelArguments, data_args: DataTrainingArguments, training_args: Any
) -> tuple[Any, Any, Any]:
    """The model, its feature extractor and tokenizer, with Whisper's language and task set."""
    hub = example_utils.hub_kwargs(model_args)
    config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path, **hub)
    if getattr(config, "model_type", None) == "whisper":
        config.apply_spec_augment = model_args.apply_spec_augment
    extractor = AutoFeatureExtractor.from_pretrained(
        model_args.feature_extractor_name or model_args.model_name_or_path, **hub
    )
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path, **hub)
    model = example_utils.load_pretrained(
        AutoModelForSpeechSeq2Seq, model_args.model_name_or_path, training_args, config=config, **hub
    )
    if model.config.decoder_start_token_id is None:
        raise ValueError(f"{model_args.model_name_or_path}: the config has no decoder_start_token_id; set it")
    if model_args.freeze_encoder:
        model.freeze_encoder()
        model.model.encoder.gradient_checkpointing = False
    if data_args.language is not None:  # multilingual checkpoints: the prefix tokens of every label and generation
        tokenizer.set_prefix_tokens(language=data_args.language, task=data_args.task)
        model.generation_config.language, model.generation_config.task = data_args.language, data_args.task
    return model, extractor, tokenizer


def text_normalizer(tokenizer: Any, language: str | None) -> Callable[[str], str]:
    """Whisper's normalizer for scoring: the English one (with the tokenizer's spelling table where it has one) for
    English and English-only checkpoints, the basic one (case, punctuation, symbols) for other languages."""
    from transformers.models.whisper.english_normalizer import BasicTextNormalizer, EnglishTextNormalizer

    if language in (None, "en", "english"):
        return EnglishTextNormalizer(getattr(tokenizer, "english_spelling_normalizer", None) or {})
    return BasicTextNormalizer()


def word_error_rate(tokenizer: Any, normalize: Callable[[str], str] | None = None):
    """`compute_metrics`: the word error rate (`jiwer`) of the generated transcriptions, on `normalize`d text."""

    def compute(p: EvalPrediction) -> dict[str, float]:
        preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        pad = tokenizer.pad_token_id
        preds, labels = np.where(preds == -100, pad, preds), np.where(p.label_ids == -100, pad, p.label_ids)
        predicted = [t.strip() for t in tokenizer.batch_decode(preds, skip_special_tokens=True)]
        references = [t.strip() for t in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        if normalize is not None:
            predicted, references = [normalize(t) for t in predicted], [normalize(t) for t in references]
        # jiwer refuses empty references; a clip without words scores its predicted words as insertions
        pairs = [(r, h) for r, h in zip(references, predicted, strict=True) if r]
        return {"wer": float(jiwer.wer([r for r, _ in pairs], [h for _, h in pairs]))}

    return compute


def prepared_split(
    raw: datasets.Dataset,
    limit: int | None,
    args: DataTrainingArguments,
    extractor: Any,
    tokenizer: Any,
    label_length: int,
    decoder_start: int,
) -> datasets.Dataset:
    """Transcriptions tokenized (padded to `label_length` with -100, the decoder start token left to the model), and
    audio decoded and turned into log-mel features on the fly (30 s of features a clip are too many to store)."""
    if limit is not None:
        raw = raw.select(range(min(limit, len(raw))))
    rate, audio_column = extractor.sampling_rate, args.audio_column_name

    def transform(batch: dict[str, list]) -> dict[str, list]:
        clips = [load_audio(a, rate) for a in batch[audio_column]]
        out = dict(extractor(clips, sampling_rate=rate, return_attention_mask=True, return_tensors="np"))
        labels = []
        for text in batch[args.text_column_name]:
            ids = tokenizer(text.lower() if args.do_lower_case else text).input_ids
            ids = ids[1:] if ids and ids[0] == decoder_start else ids  # the model puts it back when shifting
            labels.append(torch.tensor(ids[:label_length] + [-100] * (label_length - len(ids))))
        out["labels"] = labels
        return {key: list(value) for key, value in out.items()}

    return raw.with_transform(transform)


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        ModelArguments, DataTrainingArguments, IPUSeq2SeqTrainingArguments
    )
    example_utils.setup_logging(training_args, logger)
    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)
    raw = load_raw_datasets(data_args, model_args)
    columns = {"--audio_column_name": data_args.audio_column_name, "--text_column_name": data_args.text_column_name}
    example_utils.check_columns(raw, columns)
    model, extractor, tokenizer = load_model(model_args, data_args, training_args)
    texts = [t for d in raw.values() for t in d[data_args.text_column_name]]
    label_length = max(len(tokenizer(t.lower() if data_args.do_lower_case else t).input_ids) for t in texts)
    start = model.config.decoder_start_token_id
    splits = {}
    for split, flag, limit in (
        ("train", training_args.do_train, data_args.max_train_samples),
        ("eval", training_args.do_eval, data_args.max_eval_samples),
    ):
        if flag:
            if split not in raw:
                raise ValueError(f"--do_{split} needs a {split} dataset: give --{split}_dir (or --dataset_name)")
            splits[split] = prepared_split(raw[split], limit, data_args, extractor, tokenizer, label_length, start)
    training_args.remove_unused_columns = False  # the transform reads the audio and text columns: keep them
    normalizer = text_normalizer(tokenizer, data_args.language) if data_args.do_normalize_eval else None
    trainer = IPUSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=splits.get("train"),
        eval_dataset=splits.get("eval"),
        processing_class=extractor,
        data_collator=transformers.default_data_collator,
        compute_metrics=word_error_rate(tokenizer, normalizer) if training_args.predict_with_generate else None,
    )
    if training_args.do_train:
        if not example_utils.train(trainer, training_args, last_checkpoint, len(splits["train"])):
            return
        tokenizer.save_pretrained(training_args.output_dir)
    if training_args.do_eval:
        max_length = training_args.generation_max_length
        example_utils.evaluate(trainer, len(splits["eval"]), metric_key_prefix="eval", max_length=max_length)
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
