#!/usr/bin/env python
"""Fine-tune a sequence-to-sequence model (T5, ...) for translation with `IPUSeq2SeqTrainer`, scored by sacreBLEU.

The flags of the `transformers` example of the same name, plus `--ipu_config_name`. From this folder (it reads
`./ipu_config.json`), T5 on WMT16 English-Romanian:

    python run_translation.py --ipu_config_name=./ --model_name_or_path t5-small --do_train --do_eval \\
      --source_lang en --target_lang ro --source_prefix "translate English to Romanian: " \\
      --dataset_name wmt16 --dataset_config_name ro-en --output_dir output --overwrite_output_dir \\
      --per_device_train_batch_size 1 --per_device_eval_batch_size 1 --pad_to_max_length \\
      --max_source_length 128 --max_target_length 128 --predict_with_generate

Data: `--dataset_name` (downloaded from the Hugging Face Hub, then read from the local `datasets` cache), or for
each of `--train_file`, `--validation_file` and `--test_file` either JSON lines in the Hugging Face layout,
`{"translation": {"en": "...", "ro": "..."}}` (`.json` or `.jsonl`), or a pair of aligned plain-text files (one
sentence a line, optionally gzipped) named by their common prefix: `--train_file data/newsdev2016-enro` reads
`data/newsdev2016-enro.en[.gz]` and `data/newsdev2016-enro.ro[.gz]` (the WMT/Moses layout, languages from
`--source_lang` / `--target_lang`). Scored by sacreBLEU, as the upstream recipe.
Writes `train_results.json`, `eval_results.json` (`eval_bleu`, `eval_gen_len`, ...), `all_results.json` and, with
`--do_predict --predict_with_generate`, `generated_predictions.txt`; after training, `training_curves.png`.
"""

from __future__ import annotations

try:
    import example_utils
except ModuleNotFoundError as err:  # a source checkout run without installing the examples' shared module
    fix = "pip install -e '.[examples]' in the checkout, or pip install 'optimum-ipu[examples]'"
    raise SystemExit(f"{err}. To fix: {fix}") from None

import gzip
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import sacrebleu
from example_utils import seq2seq
from transformers import set_seed

from optimum_ipu import IPUSeq2SeqTrainingArguments
from optimum_ipu.errors import run_script

logger = logging.getLogger(__name__)

LOCAL_FILES_HINT = (
    "--train_file PREFIX --validation_file PREFIX (aligned PREFIX.en[.gz] / PREFIX.ro[.gz] text files, e.g. WMT16's "
    'newsdev2016-enro and newstest2016-enro) or JSON lines {"translation": {"en": ..., "ro": ...}}'
)


@dataclass
class DataTrainingArguments(seq2seq.Seq2SeqDataArguments):
    """What data to train and evaluate on, and how to tokenize it."""

    source_lang: str | None = field(default=None, metadata={"help": "Source language id, e.g. en."})
    target_lang: str | None = field(default=None, metadata={"help": "Target language id, e.g. ro."})
    train_file: str | None = field(
        default=None, metadata={"help": "JSON lines {'translation': {...}}, or the prefix of aligned files."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dataset_name is None and self.train_file is None and self.validation_file is None:
            raise ValueError("give --dataset_name or --train_file/--validation_file (JSON lines or aligned files)")
        if self.source_lang is None or self.target_lang is None:
            raise ValueError("give --source_lang and --target_lang, e.g. --source_lang en --target_lang ro")


def _read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _language_file(prefix: str, lang: str) -> Path | None:
    for candidate in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if candidate.is_file():
            return candidate
    return None


def load_translation_file(path: str, source_lang: str, target_lang: str) -> datasets.Dataset:
    """Examples `{"translation": {source_lang: ..., target_lang: ...}}` from JSON lines or aligned files.

    Args:
        path: a `.json` / `.jsonl` file of JSON lines in the Hugging Face layout, or the common prefix of two
            aligned text files `{path}.{source_lang}[.gz]` and `{path}.{target_lang}[.gz]`.
    """
    if os.path.isfile(path):
        if not path.endswith((".json", ".jsonl")):
            raise ValueError(
                f"{path}: expected JSON lines (.json or .jsonl) with a 'translation' field, or the prefix of aligned "
                f"files {Path(path).name}.{source_lang}[.gz] / .{target_lang}[.gz]"
            )
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for number, row in enumerate(rows, 1):
            pair = row.get("translation") if isinstance(row, dict) else None
            if not isinstance(pair, dict) or source_lang not in pair or target_lang not in pair:
                raise ValueError(
                    f"{path}, line {number}: expected {{'translation': {{'{source_lang}': ..., '{target_lang}': ...}}}}"
                    f"; got keys {sorted(pair) if isinstance(pair, dict) else sorted(row)}"
                )
        return datasets.Dataset.from_list([{"translation": row["translation"]} for row in rows])
    source, target = _language_file(path, source_lang), _language_file(path, target_lang)
    if source is None or target is None:
        raise FileNotFoundError(
            f"{path}: no such file, nor the prefix of aligned files {path}.{source_lang}[.gz] and "
            f"{path}.{target_lang}[.gz]"
        )
    sources, targets = _read_lines(source), _read_lines(target)
    if len(sources) != len(targets):
        raise ValueError(f"{source} has {len(sources)} lines but {target} has {len(targets)}: they must be aligned")
    return datasets.Dataset.from_dict(
        {"translation": [{source_lang: s, target_lang: t} for s, t in zip(sources, targets, strict=True)]}
    )


def load_raw_datasets(data: DataTrainingArguments, model: example_utils.ModelArguments) -> dict[str, datasets.Dataset]:
    """The train / validation / test examples, from local files or the Hugging Face Hub (or its local cache)."""
    files = {"train": data.train_file, "validation": data.validation_file, "test": data.test_file}
    if any(files.values()):
        loaded = {}
        for split, path in files.items():
            try:
                loaded[split] = load_translation_file(path, data.source_lang, data.target_lang) if path else None
            except FileNotFoundError as err:
                raise FileNotFoundError(f"--{split}_file {err}") from None  # the flag that named the path
        return {split: dataset for split, dataset in loaded.items() if dataset is not None}
    return dict(
        example_utils.load_hub_dataset(
            data.dataset_name,
            data.dataset_config_name,
            local_files_hint=LOCAL_FILES_HINT,
            cache_dir=model.cache_dir,
            token=model.token,
        )
    )


def bleu(predictions: list[str], references: list[str]) -> dict[str, float]:
    """sacreBLEU's corpus BLEU, one reference a sentence (what `evaluate`'s `sacrebleu` metric computes)."""
    return {"bleu": sacrebleu.corpus_bleu(predictions, [references]).score}


def main() -> None:
    model_args, data_args, training_args = example_utils.parse_args(
        example_utils.ModelArguments, DataTrainingArguments, IPUSeq2SeqTrainingArguments
    )
    example_utils.setup_logging(training_args, logger)
    seq2seq.warn_missing_t5_prefix(model_args, data_args, "translate English to Romanian: ")
    last_checkpoint = example_utils.start_run(training_args)
    set_seed(training_args.seed)
    raw = load_raw_datasets(data_args, model_args)
    source_lang, target_lang = data_args.source_lang.split("_")[0], data_args.target_lang.split("_")[0]

    def pairs(examples: dict[str, list]) -> tuple[list[str], list[str]]:
        translations = examples["translation"]
        return [pair[source_lang] for pair in translations], [pair[target_lang] for pair in translations]

    seq2seq.run(model_args, data_args, training_args, raw, pairs, bleu, last_checkpoint)


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2 (OPTIMUM_IPU_DEBUG=1 for the traceback)
