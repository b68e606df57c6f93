#!/usr/bin/env python
"""Train a tokenizer (GPT-2 or RoBERTa byte-level BPE, or BERT WordPiece) on local text files, with `tokenizers`.

With a network, `--tokenizer_name gpt2` downloads GPT-2's own tokenizer; without one, this builds one of the same
kind from the training text, so that `run_clm.py` / `run_mlm.py` can train a model from scratch (`--model_type gpt2
--tokenizer_name DIR`):

    python train_tokenizer.py --family gpt2 --vocab_size 8000 --output_dir ./tokenizer-gpt2 wiki.train.tokens

`--family gpt2` gives a `GPT2TokenizerFast` with `<|endoftext|>` as its only special token (also used for padding);
`--family roberta` a `RobertaTokenizerFast` with `<s> <pad> </s> <unk> <mask>` and `<s> ... </s>` around each text;
`--family bert` a lower-casing WordPiece `BertTokenizerFast` with `[PAD] [UNK] [CLS] [SEP] [MASK]` and
`[CLS] A [SEP] B [SEP]` for a pair (`run_pretraining.py`).
Blank lines are skipped. The folder loads with `AutoTokenizer.from_pretrained(DIR)`; its size is printed, to pass
as `vocab_size` in `--config_overrides`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertTokenizerFast, GPT2TokenizerFast, PreTrainedTokenizerFast, RobertaTokenizerFast

SPECIAL_TOKENS = {
    "gpt2": ["<|endoftext|>"],
    "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    "bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
}


def read_lines(paths: list[str]) -> Iterator[str]:
    """The non-blank lines of the files, stripped."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield line.strip()


def train_tokenizer(
    paths: list[str], family: str, vocab_size: int, model_max_length: int | None = None
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of `family` (`"gpt2"` or `"roberta"`) trained on the lines of `paths`.

    Args:
        paths (`list[str]`): text files, one text per line.
        family (`str`): `"gpt2"` or `"roberta"`: which special tokens and post-processing the tokenizer has.
        vocab_size (`int`): the vocabulary size, special tokens and the 256 byte symbols included.
        model_max_length (`int`, *optional*): the longest sequence the model takes (saved with the tokenizer).

    Returns:
        `PreTrainedTokenizerFast`: a `GPT2TokenizerFast` or a `RobertaTokenizerFast`.
    """
    if family not in SPECIAL_TOKENS:
        raise ValueError(f"--family {family}: expected one of {', '.join(SPECIAL_TOKENS)}")
    specials = SPECIAL_TOKENS[family]
    extra = {"model_max_length": model_max_length} if model_max_length else {}
    if family == "bert":
        return _train_wordpiece(paths, vocab_size, extra)
    if vocab_size < 256 + len(specials):
        raise ValueError(f"--vocab_size {vocab_size}: must hold the 256 byte symbols and {len(specials)} specials")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(read_lines(paths), trainer=trainer)
    if family == "gpt2":
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
        return GPT2TokenizerFast(tokenizer_object=tokenizer, pad_token="<|endoftext|>", **extra)
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>"))
    )
    return RobertaTokenizerFast(tokenizer_object=tokenizer, **extra)


def _train_wordpiece(paths: list[str], vocab_size: int, extra: dict) -> PreTrainedTokenizerFast:
    """BERT's uncased WordPiece tokenizer (normalizer, pre-tokenizer, `[CLS] A [SEP] B [SEP]`), trained here."""
    specials = SPECIAL_TOKENS["bert"]
    if vocab_size < 100 + len(specials):
        raise ValueError(f"--vocab_size {vocab_size}: too small for a WordPiece vocabulary; use e.g. 8000")
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
    tokenizer.train_from_iterator(read_lines(paths), trainer=trainer)
    cls, sep = ("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[cls, sep]
    )
    return BertTokenizerFast(tokenizer_object=tokenizer, **extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="text files to train on, one text per line")
    parser.add_argument("--family", default="gpt2", choices=sorted(SPECIAL_TOKENS))
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--model_max_length", type=int, default=None, help="longest sequence of the model")
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args()
    tokenizer = train_tokenizer(args.files, args.family, args.vocab_size, args.model_max_length)
    tokenizer.save_pretrained(args.output_dir)
    ids = {name: getattr(tokenizer, f"{name}_token_id") for name in ("bos", "eos", "pad", "mask")}
    print(f"{type(tokenizer).__name__}: {len(tokenizer)} tokens, special ids {ids}, saved to {args.output_dir}")


if __name__ == "__main__":
    main()
