"""Tokenizers trained here, with `tokenizers`, on the shared text: no GPT-2, RoBERTa or T5 files can be downloaded.

Each builder returns a `transformers` fast tokenizer of the family's own class (GPT-2 and RoBERTa: byte-level
BPE; T5: Unigram with `</s>` appended), small (a few hundred to a few thousand tokens), so tiny random models
built on it train fast. `save_tiny_pretrained` writes a folder that `--model_name_or_path` accepts: a tiny
random model of a registered class plus its tokenizer. BERT-family tests use the real bert-base-uncased
WordPiece vocabulary of the MiniLM package instead (see `conftest.minilm_dir`).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from optimum_ipu.models.plans import plan_for_class


def shared_text(shared_data: Path, lines: int = 4000) -> Iterator[str]:
    """English WikiText-2 lines, SST-2 sentences and WMT16 en/ro sentences: enough for every script's data."""
    count = 0
    sources = [
        (shared_data / "wikitext2_tokens" / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines(),
        [row.split("\t")[0] for row in (shared_data / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:]],
    ]
    for lang in ("en", "ro"):
        with gzip.open(shared_data / "wmt16_en_ro" / f"newsdev2016-enro.{lang}.gz", "rt", encoding="utf-8") as f:
            sources.append(f.read().splitlines()[:1000])
    for source in sources:
        for line in source:
            if line.strip():
                yield line.strip()
                count += 1
                if count >= lines * len(sources):
                    return


def byte_level_bpe(shared_data: Path, family: str, vocab_size: int = 1000) -> transformers.PreTrainedTokenizerFast:
    """A GPT-2 (`family="gpt2"`), RoBERTa (`"roberta"`) or Llama (`"llama"`) tokenizer: byte-level BPE with the
    family's specials (Llama: `<unk>`, `<s>`, `</s>` as ids 0, 1, 2, and `<s>` starting every text)."""
    specials = {"gpt2": ["<|endoftext|>"], "llama": ["<unk>", "<s>", "</s>"]}.get(
        family, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(shared_text(shared_data), trainer=trainer)
    if family == "gpt2":
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
        return transformers.GPT2TokenizerFast(tokenizer_object=tokenizer, pad_token="<|endoftext|>")
    if family == "llama":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
        )
        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
        )
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>"))
    )
    return transformers.RobertaTokenizerFast(tokenizer_object=tokenizer)


def t5_unigram(shared_data: Path, vocab_size: int = 1000, extra_ids: int = 10) -> transformers.PreTrainedTokenizerFast:
    """A T5 tokenizer: SentencePiece-style Unigram (`▁` word starts), `</s>` appended, `<extra_id_*>` sentinels."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"
    )
    tokenizer.train_from_iterator(shared_text(shared_data), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", tokenizer.token_to_id("</s>"))]
    )
    sentinels = [f"<extra_id_{i}>" for i in range(extra_ids)]
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=sentinels,
    )


def save_tiny_pretrained(
    path: Path, class_name: str, tokenizer: transformers.PreTrainedTokenizerBase, seed: int = 0, **config: object
) -> Path:
    """Write a tiny random `class_name` model sized to `tokenizer`, and the tokenizer, to `path`.

    The config is that of `tests.tiny_models.tiny_config` for the family (4 layers, hidden 32), with the
    tokenizer's vocabulary size and special token ids, a 128-position table, and any `config` overrides.
    """
    from .tiny_models import tiny_config

    family = plan_for_class(class_name).family
    model_config = tiny_config(family)
    model_config.vocab_size = len(tokenizer)
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        if getattr(tokenizer, name, None) is not None:
            setattr(model_config, name, getattr(tokenizer, name))
    if family == "t5":
        model_config.decoder_start_token_id = tokenizer.pad_token_id
    for name in ("max_position_embeddings", "n_positions"):
        if hasattr(model_config, name):
            setattr(model_config, name, 128 + (2 if family == "roberta" else 0))
    for name, value in config.items():
        setattr(model_config, name, value)
    torch.manual_seed(seed)
    getattr(transformers, class_name)(model_config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
