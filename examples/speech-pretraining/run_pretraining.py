#!/usr/bin/env python
"""Pretrain a Wav2Vec2 model (`Wav2Vec2ForPreTraining`, from random weights) on unlabelled audio with `IPUTrainer`.

Optimum Graphcore's `examples/speech-pretraining/run_pretraining.py`, with its flags: the model is built from a config
(`--model_name_or_path`, whose config and feature extractor are read, its weights not; or `--model_type wav2vec2
--config_overrides ...`), trained on Wav2Vec2's contrastive loss plus its codebook diversity loss (the model's own,
summed over the masked frames, as Optimum Graphcore trained it), with the Gumbel softmax temperature of the quantizer
decayed each optimizer step as `transformers`' `run_wav2vec2_pretraining_no_trainer.py` decays it:
`max(--max_gumbel_temperature * --gumbel_temperature_decay**step, --min_gumbel_temperature)`. The collator pads every
clip to `--max_duration_in_seconds` (static shapes) and draws the masked frames and the sampled negatives with
`transformers`' `_compute_mask_indices` and `_sample_negative_indices`, so a pipeline of stages on separate processes
(`torchrun`, `ipus_per_replica` > 1) feeds the same to every stage. Each training log gives the contrastive and
diversity losses per masked frame, the codevector perplexity and the temperature, as upstream logs them.

Data: `--train_dir` (and `--eval_dir`), `audiofolder` folders (audio files and a `metadata.csv` naming them in
`file_name`), or `--dataset_name` (the Hub or its local cache). Audio is decoded with `soundfile` (no FFmpeg), made
mono and resampled to the feature extractor's rate. From the project's root, on the FSDD digits:

    cd examples/speech-pretraining && python run_pretraining.py --ipu_config_name ./ \\
      --model_type wav2vec2 --config_overrides '{"hidden_size": 96, "num_hidden_layers": 3, ...}' \\
      --train_dir ../../../shared/data/audio/fsdd/train --max_duration_in_seconds 1.0 \\
      --do_train --output_dir ./output --per_device_train_batch_size 8 --learning_rate 5e-4

`--crop_aggression` (Optimum Graphcore's: how much of the unmasked frames to cut before the loss, to fit the IPU's
memory) has no effect here: the stock model computes its loss on every frame, said once at run time. Writes
`train_results.json`, `eval_results.json` (with `--do_eval`: `eval_loss`, the model's loss on `--eval_dir` with the
quantizer's argmax codes), `all_results.json`, the model with its feature extractor and `ipu_config.json`,
`training_curves.png` and `pretraining_curves.png` (the loss, its two parts and the temperature).
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import io
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import soundfile
import torch
from example_utils import audio
from example_utils.speech_pretraining import DataCollatorForWav2Vec2Pretraining, PretrainingTrainer
from transformers import AutoConfig, AutoFeatureExtractor, Wav2Vec2FeatureExtractor, Wav2Vec2ForPreTraining, set_seed

from optimum_ipu import IPUTrainingArguments
from optimum_ipu.errors import run_script
from optimum_ipu.pipelines.audio import load_audio

logger = logging.getLogger(__name__)

CURVES = "pretraining_curves.png"


@dataclass
class ModelArguments:
    """The config to pretrain from (its weights are not read), and Optimum Graphcore's pretraining knobs."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Config (and feature extractor) id on the Hub or folder; weights not read."}
    )
    model_type: str | None = field(default=None, metadata={"help": "From scratch without a config: wav2vec2."})
    config_overrides: str | None = field(
        default=None, metadata={"help": "Config values: 'key=value,...' or a JSON object (lists too)."}
    )
    feature_extractor_name: str | None = field(default=None, metadata={"help": "Feature extractor folder or id."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where Hub downloads are cached."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the config."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face Hub token."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the model's repository."})
    attention_dropout: float = field(default=0.0, metadata={"help": "Dropout of the attention probabilities."})
    activation_dropout: float = field(default=0.0, metadata={"help": "Dropout inside the feed-forward layers."})
    feat_proj_dropout: float = field(default=0.0, metadata={"help": "Dropout of the projected features."})
    hidden_dropout: float = field(default=0.0, metadata={"help": "Dropout of the fully connected layers."})
    final_dropout: float = field(default=0.0, metadata={"help": "Dropout of the final projection."})
    mask_time_prob: float = field(default=0.65, metadata={"help": "Share of frames that start a masked span."})
    mask_time_length: int = field(default=10, metadata={"help": "Frames per masked span."})
    mask_feature_prob: float = field(default=0.0, metadata={"help": "Share of feature channels masked (0: none)."})
    mask_feature_length: int = field(default=10, metadata={"help": "Channels per masked feature span."})
    layerdrop: float = field(default=0.0, metadata={"help": "Probability of skipping a layer (one stage only)."})
    max_gumbel_temperature: float = field(default=2.0, metadata={"help": "Gumbel softmax temperature at step 0."})
    min_gumbel_temperature: float = field(default=0.5, metadata={"help": "The temperature's floor."})
    gumbel_temperature_decay: float = field(default=0.9, metadata={"help": "The temperature's factor per step."})
    crop_aggression: float = field(
        default=0.0, metadata={"help": "Optimum Graphcore's IPU memory knob (no effect here)."}
    )

    def __post_init__(self) -> None:
        if self.model_name_or_path is None and self.model_type is None:
            raise ValueError("give --model_name_or_path (a config to pretrain) or --model_type wav2vec2")
        if self.model_type not in (None, "wav2vec2"):
            raise ValueError(f"--model_type {self.model_type}: pretraining here is Wav2Vec2's; pass wav2vec2")
        for name in ("max_gumbel_temperature", "min_gumbel_temperature", "gumbel_temperature_decay"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name} {getattr(self, name)}: expected a positive number")
        if self.min_gumbel_temperature > self.max_gumbel_temperature:
            raise ValueError(
                f"--min_gumbel_temperature {self.min_gumbel_temperature} is above --max_gumbel_temperature "
                f"{self.max_gumbel_temperature}; give a floor below the start"
            )


@dataclass
class DataTrainingArguments:
    """What audio to pretrain on."""

    dataset_name: str | None = field(default=None, metadata={"help": "Dataset id on the Hub, or a local folder."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_dir: str | None = field(default=None, metadata={"help": "Training audio: an audiofolder (metadata.csv)."})
    eval_dir: str | None = field(default=None, metadata={"help": "Evaluation audio: an audiofolder."})
    train_split_name: str = field(default="train+validation", metadata={"help": "Split(s) of --dataset_name."})
    eval_split_name: str = field(default="test", metadata={"help": "Evaluation split of --dataset_name."})
    audio_column_name: str = field(default="audio", metadata={"help": "The column of the audio."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training clips."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many evaluation clips."})
    max_duration_in_seconds: float = field(default=20.0, metadata={"help": "Clips are cut and padded to this."})
    min_duration_in_seconds: float = field(default=0.0, metadata={"help": "Shorter clips are left out."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes decoding the audio."})
    preprocessing_only: bool = field(default=False, metadata={"help": "Decode the audio, then stop."})

    def __post_init__(self) -> None:
        if self.dataset_name is None and self.train_dir is None:
            raise ValueError("give --train_dir (an audiofolder with metadata.csv) or --dataset_name")
        if self.max_duration_in_seconds <= 0:
            raise ValueError(f"--max_duration_in_seconds {self.max_duration_in_seconds}: expected a positive duration")


def load_splits(data_args: DataTrainingArguments, model_args: ModelArguments) -> dict[str, datasets.Dataset]:
    """The `train` / `eval` splits, from `audiofolder` folders or the Hub or its local cache (`--train_split_name`:
    one split or several joined by `+`), the audio left undecoded (decoded here by `soundfile`)."""
    if data_args.dataset_name is None:
        return audio.read_audio_dirs(data_args)
    out = {}
    for split, names in (("train", data_args.train_split_name), ("eval", data_args.eval_split_name)):
        parts = [
            example_utils.load_hub_dataset(
                data_args.dataset_name,
                data_args.dataset_config_name,
                local_files_hint="--train_dir (an audiofolder: audio files and a metadata.csv with file_name)",
                split=name,
                cache_dir=model_args.cache_dir,
                token=model_args.token,
            )
            for name in names.split("+")
        ]
        out[split] = audio.undecoded(datasets.concatenate_datasets(parts), data_args.audio_column_name)
    return out


def build_model(model_args: ModelArguments, training_args: IPUTrainingArguments) -> tuple[Wav2Vec2ForPreTraining, Any]:
    """A `Wav2Vec2ForPreTraining` with random weights from the config (with the flags' values), and its extractor."""
    hub = example_utils.hub_kwargs(model_args)
    if model_args.model_name_or_path:
        config = AutoConfig.from_pretrained(model_args.model_name_or_path, **hub)
        if model_args.config_overrides:
            config.update_from_string(model_args.config_overrides)
    else:
        config = example_utils.new_config("wav2vec2", model_args.config_overrides)
    if not config.do_stable_layer_norm or config.feat_extract_norm != "layer":
        # as upstream's and Optimum Graphcore's scripts: the other architecture does not pretrain stably
        raise ValueError(
            f"config do_stable_layer_norm={config.do_stable_layer_norm}, "
            f"feat_extract_norm={config.feat_extract_norm!r}: "
            'pretraining needs do_stable_layer_norm=true and feat_extract_norm="layer"; set them in --config_overrides'
        )
    names = ("attention_dropout", "activation_dropout", "feat_proj_dropout", "hidden_dropout", "final_dropout")
    names += ("mask_time_prob", "mask_time_length", "mask_feature_prob", "mask_feature_length", "layerdrop")
    config.update({name: getattr(model_args, name) for name in names})
    config.update({"gradient_checkpointing": training_args.gradient_checkpointing})
    model = Wav2Vec2ForPreTraining(config)
    source = model_args.feature_extractor_name or model_args.model_name_or_path
    if source:
        extractor = AutoFeatureExtractor.from_pretrained(source, return_attention_mask=True, **hub)
    else:
        extractor = Wav2Vec2FeatureExtractor(do_normalize=True, return_attention_mask=True)
    if not extractor.do_normalize:
        raise ValueError(f"{source}: its feature extractor has do_normalize=false; pretraining needs normalized inputs")
    if model_args.crop_aggression:
        logger.warning(
            "--crop_aggression %s has no effect here: it cut unmasked frames before the loss to fit an IPU's memory; "
            "the stock model computes its loss on every frame",
            model_args.crop_aggression,
        )
    return model, extractor


def clip_seconds(value: Any) -> float:
    """The duration of an undecoded clip (a path, or `datasets`' `{"path", "bytes"}`), read from its header."""
    if isinstance(value, dict):
        value = io.BytesIO(value["bytes"]) if value.get("bytes") else value["path"]
    return float(soundfile.info(value).duration)


def shortest_clip(model: Wav2Vec2ForPreTraining, rate: int) -> int:
    """The fewest samples whose frames hold one masked span (`mask_time_length` frames, 2 at least): a shorter clip
    gets no masked frame, and no negatives can be drawn for it (transformers' `_sample_negative_indices` fails)."""
    needed = max(model.config.mask_time_length, 2)
    frames = model._get_feat_extract_output_lengths(torch.arange(1, 30 * rate))
    return int(torch.nonzero(frames >= needed)[0]) + 1


def prepare_split(
    raw: datasets.Dataset, data_args: DataTrainingArguments, extractor: Any, limit: int | None, shortest: int
) -> datasets.Dataset:
    """Clips at least `--min_duration_in_seconds` long, decoded, resampled, cut to `--max_duration_in_seconds`
    and normalized: one `input_values` column (the collator pads). Clips under `shortest` samples are left out, said
    once with their count."""
    column, rate = data_args.audio_column_name, extractor.sampling_rate
    if limit is not None:
        raw = raw.select(range(min(limit, len(raw))))
    if data_args.min_duration_in_seconds > 0:
        shortest = data_args.min_duration_in_seconds
        raw = raw.filter(lambda value: clip_seconds(value) >= shortest, input_columns=[column])
    max_length = int(data_args.max_duration_in_seconds * rate)

    def decode(batch: dict[str, list]) -> dict[str, list]:
        clips = [load_audio(value, rate) for value in batch[column]]
        values = extractor(clips, sampling_rate=rate, max_length=max_length, truncation=True).input_values
        return {"input_values": [list(v) for v in values]}

    decoded = raw.map(
        decode,
        batched=True,
        remove_columns=raw.column_names,
        num_proc=data_args.preprocessing_num_workers,
        desc="decoding audio",
    )
    kept = decoded.filter(lambda values: len(values) >= shortest, input_columns=["input_values"])
    if len(kept) < len(decoded):
        logger.warning(
            "%d of %d clips are under %.3f s, too short for one masked span of --mask_time_length frames: left out "
            "(raise --min_duration_in_seconds to say so, or lower --mask_time_length)",
            len(decoded) - len(kept),
            len(decoded),
            shortest / rate,
        )
    return kept


def draw_curves(log_history: list[dict[str, Any]], path: Path) -> Path | None:
    """`pretraining_curves.png`: the loss, the contrastive and diversity losses per masked frame, the temperature."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("loss", "contrastive_loss", "diversity_loss", "gumbel_temperature")
    series = {k: [(e["step"], e[k]) for e in log_history if k in e and "step" in e] for k in keys}
    if not series["loss"]:
        return None
    figure, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    for axis, key in zip(axes, keys, strict=True):
        steps, values = zip(*series[key], strict=True) if series[key] else ((), ())
        axis.plot(steps, values)
        axis.set_title(key if key != "loss" else "loss (sum over masked frames)", fontsize=9)
        axis.set_xlabel("optimizer step")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        ModelArguments, DataTrainingArguments, IPUTrainingArguments
    )
    example_utils.setup_logging(training_args, logger)
    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)

    raw = load_splits(data_args, model_args)
    example_utils.check_columns(raw, {"--audio_column_name": data_args.audio_column_name})
    model, extractor = build_model(model_args, training_args)
    limits = {"train": data_args.max_train_samples, "eval": data_args.max_eval_samples}
    with training_args.main_process_first():
        shortest = shortest_clip(model, extractor.sampling_rate)
        splits = {split: prepare_split(raw[split], data_args, extractor, limits[split], shortest) for split in raw}
    if data_args.preprocessing_only:
        logger.info("--preprocessing_only: %s decoded; nothing trained", {k: len(v) for k, v in splits.items()})
        return
    if training_args.do_train and len(splits.get("train", ())) == 0:
        raise ValueError("no training clip left: give --train_dir or --dataset_name, and check the duration flags")
    max_length = int(data_args.max_duration_in_seconds * extractor.sampling_rate)
    trainer = PretrainingTrainer(
        model,
        args=training_args,
        data_collator=DataCollatorForWav2Vec2Pretraining(model, extractor, max_length=max_length),
        train_dataset=splits.get("train") if training_args.do_train else None,
        eval_dataset=splits.get("eval") if training_args.do_eval else None,
        processing_class=extractor,
        gumbel=(
            model_args.max_gumbel_temperature,
            model_args.min_gumbel_temperature,
            model_args.gumbel_temperature_decay,
        ),
    )
    if training_args.do_train:
        if not example_utils.train(trainer, training_args, last_checkpoint, len(splits["train"])):
            return
        if trainer.is_world_process_zero():
            drawn = draw_curves(trainer.state.log_history, Path(training_args.output_dir) / CURVES)
            if drawn is not None:
                logger.info("Pretraining curves drawn in %s", drawn)
    if training_args.do_eval:
        example_utils.evaluate(trainer, len(splits["eval"]))
    example_utils.finish(trainer, training_args, model_args, data_args)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
