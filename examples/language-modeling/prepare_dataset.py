#!/usr/bin/env python
"""Turn a text corpus into BERT pretraining data for `run_pretraining.py`, saved with `Dataset.save_to_disk`.

Optimum Graphcore's `prepare_dataset.py` read the TFRecord files of Graphcore's own Wikipedia preprocessing (pairs
already made) with `--num_workers` processes and saved the result to `--cache_dir/--output_dataset_name`. TFRecords
need TensorFlow and that preprocessing, which are not here: this script starts from plain text instead (`.txt`,
`.tokens`, `.raw`: WikiText's files as they are) and makes the pairs itself, as Google's `create_pretraining_data.py`
(`example_utils.pretraining`): `input_ids` (`[CLS] A [SEP] B [SEP]`), `token_type_ids` and `next_sentence_label`.
With `--packing` the training pairs are packed, several to a row of `--max_seq_length` tokens (best-fit decreasing,
`optimum_ipu.packing`): `position_ids` restart for each pair and `labels` holds each pair's next-sentence label.
Masking is done by `run_pretraining.py`'s collator, a new draw every epoch.

    python train_tokenizer.py --family bert --vocab_size 8000 --model_max_length 128 \\
      --output_dir ./output/tokenizer-bert ../../../shared/data/wikitext2_tokens/wiki.valid.tokens
    python prepare_dataset.py --tokenizer_name ./output/tokenizer-bert --max_seq_length 128 --packing \\
      --train_file ../../../shared/data/wikitext2_tokens/wiki.valid.tokens \\
      --validation_file ../../../shared/data/wikitext2_tokens/wiki.test.tokens --output_dir ./output/wikitext2-bert-128

`--data_dir DIR` takes every text file of a folder instead (`--max_number_of_files N` the first N, sorted; each file
prepared by one of `--num_workers` processes), as Optimum Graphcore's did with its TFRecords.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import datasets
from example_utils.pretraining import make_pairs
from transformers import AutoTokenizer

from optimum_ipu.errors import run_script
from optimum_ipu.packing.pretraining import pack_pretraining_pairs

TEXT_SUFFIXES = (".txt", ".tokens", ".raw")


def prepare_file(path: str, tokenizer_name: str, max_seq_length: int, short_seq_prob: float, dupe: int, seed: int):
    """The pairs of one text file (one worker's share)."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    with open(path, encoding="utf-8") as f:
        return make_pairs(f.readlines(), tokenizer, max_seq_length, short_seq_prob, dupe, seed)


def prepare_files(paths: list[str], args: argparse.Namespace) -> datasets.Dataset:
    """The pairs of every file, `--num_workers` files at a time, concatenated in the files' order."""
    jobs = [(p, args.tokenizer_name, args.max_seq_length, args.short_seq_prob, args.dupe_factor, args.seed + i)
            for i, p in enumerate(paths)]  # fmt: skip
    if args.num_workers <= 1 or len(paths) == 1:
        parts = [prepare_file(*job) for job in jobs]
    else:
        with ProcessPoolExecutor(min(args.num_workers, len(paths))) as pool:
            parts = list(pool.map(prepare_file, *zip(*jobs, strict=True)))
    return datasets.concatenate_datasets(parts)


def packed(pairs: datasets.Dataset, args: argparse.Namespace) -> datasets.Dataset:
    """The training pairs packed into rows of `--max_seq_length` tokens, with what packing saved printed."""
    rows = datasets.Dataset.from_dict(
        pack_pretraining_pairs(pairs, args.max_seq_length, args.max_sequences_per_pack)
    ).shuffle(seed=args.seed)
    tokens = sum(len(ids) for ids in pairs["input_ids"])
    print(
        f"packing: {len(pairs):,} pairs ({tokens:,} tokens) in {len(rows):,} rows of {args.max_seq_length} "
        f"({len(pairs) / len(rows):.2f} pairs a row; padding {1 - tokens / (len(pairs) * args.max_seq_length):.1%} "
        f"of the tokens unpacked, {1 - tokens / (len(rows) * args.max_seq_length):.1%} packed)"
    )
    return rows


def input_files(args: argparse.Namespace) -> dict[str, list[str]]:
    """The text files of each split; one line naming the flag and the fix for a missing or unusable one."""
    if args.data_dir is not None:
        if not args.data_dir.is_dir():
            raise ValueError(f"--data_dir {args.data_dir}: no such folder; give a folder of {'/'.join(TEXT_SUFFIXES)}")
        train = sorted(str(p) for p in args.data_dir.iterdir() if p.suffix in TEXT_SUFFIXES)
        if args.max_number_of_files > 0:
            train = train[: args.max_number_of_files]
        if not train:
            raise ValueError(
                f"--data_dir {args.data_dir}: no {'/'.join(TEXT_SUFFIXES)} file in it (Optimum Graphcore's TFRecords "
                "are not read here: give the text they were made from)"
            )
        files = {"train": train}
    elif args.train_file is not None:
        files = {"train": [args.train_file]}
    else:
        raise ValueError("give --train_file FILE or --data_dir DIR (text files, one line per paragraph)")
    if args.validation_file is not None:
        files["validation"] = [args.validation_file]
    for path in (p for paths in files.values() for p in paths):
        if not os.path.isfile(path) or not path.endswith(TEXT_SUFFIXES):
            raise ValueError(f"{path}: expected an existing {'/'.join(TEXT_SUFFIXES)} text file")
    return files


def output_folder(args: argparse.Namespace) -> Path:
    if args.output_dir is not None:
        return Path(args.output_dir)
    cache_dir = args.cache_dir or os.environ.get("HF_DATASETS_CACHE")
    if cache_dir is None:
        raise ValueError("give --output_dir DIR (or Optimum Graphcore's --cache_dir with --output_dataset_name)")
    return Path(cache_dir) / (args.output_dataset_name or "pretraining-data")


def get_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer_name", required=True, help="a BERT tokenizer folder or id (train_tokenizer.py)")
    parser.add_argument("--train_file", help="the training text (.txt/.tokens/.raw)")
    parser.add_argument("--validation_file", help="the evaluation text (never packed)")
    parser.add_argument("--data_dir", type=Path, help="a folder of training text files (instead of --train_file)")
    parser.add_argument("--max_number_of_files", type=int, default=-1, help="at most this many files of --data_dir")
    parser.add_argument("--num_workers", type=int, default=1, help="processes preparing the files of --data_dir")
    parser.add_argument("--max_seq_length", type=int, default=128, help="tokens of a pair (and of a packed row)")
    parser.add_argument("--short_seq_prob", type=float, default=0.1, help="share of pairs with a shorter target")
    parser.add_argument("--dupe_factor", type=int, default=1, help="passes over the text, each with new pairs")
    parser.add_argument("--packing", action="store_true", help="pack the training pairs into full rows")
    parser.add_argument("--max_sequences_per_pack", type=int, default=3, help="at most this many pairs a row")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--output_dir", help="where the prepared DatasetDict is saved (save_to_disk)")
    parser.add_argument("--cache_dir", type=Path, help="Optimum Graphcore's: the output is CACHE_DIR/NAME")
    parser.add_argument("--output_dataset_name", help="Optimum Graphcore's: NAME of the output folder")
    args = parser.parse_args(argv)
    checks = (
        ("max_seq_length", args.max_seq_length >= 8, "at least 8 tokens, e.g. 128"),
        ("short_seq_prob", 0 <= args.short_seq_prob <= 1, "a share in [0, 1], e.g. 0.1"),
        ("dupe_factor", args.dupe_factor >= 1, "at least 1"),
        ("max_sequences_per_pack", args.max_sequences_per_pack >= 1, "at least 1, e.g. 3"),
        ("num_workers", args.num_workers >= 1, "at least 1"),
    )
    for flag, ok, fix in checks:
        if not ok:
            parser.error(f"--{flag} {getattr(args, flag)}: expected {fix}")  # one line, exit 2
    return args


def main(argv: list[str] | None = None) -> datasets.DatasetDict:
    args = get_args(argv)
    files, output = input_files(args), output_folder(args)
    start = time.time()
    prepared = datasets.DatasetDict({split: prepare_files(paths, args) for split, paths in files.items()})
    for split, pairs in prepared.items():
        share = sum(pairs["next_sentence_label"]) / len(pairs)
        print(f"{split}: {len(pairs):,} pairs from {len(files[split])} file(s), {share:.1%} with a random B")
    if args.packing:
        prepared["train"] = packed(prepared["train"], args)
    prepared.save_to_disk(str(output))
    print(f"Dataset generation completed after {time.time() - start:.1f}s; saved at {output}")
    return prepared


if __name__ == "__main__":
    run_script(main)  # a bad input: one line on stderr, exit code 2
