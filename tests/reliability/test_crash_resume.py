"""Kill a training process with SIGKILL at a random moment; the resumed run ends with the uninterrupted weights."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from optimum_ipu import last_complete_checkpoint
from optimum_ipu.trainer.checkpoints import COMPLETE_MARKER

from ..conftest import PYTHON, REPO_ROOT

WORKER = str(REPO_ROOT / "tests" / "reliability" / "train_worker.py")
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}


def train(out, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, WORKER, str(out), *extra], capture_output=True, text=True, env=ENV, timeout=600)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    run = train(out)
    assert run.returncode == 0, run.stderr[-3000:]
    return load_file(out / "final.safetensors")


@pytest.mark.parametrize("seed", [0, 1])
def test_sigkill_at_a_random_moment_then_resume(tmp_path, uninterrupted, seed):
    rng = random.Random(seed)
    process = subprocess.Popen([PYTHON, WORKER, str(tmp_path)], env=ENV, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while not (tmp_path / "checkpoint-2").exists():  # training has started; kill somewhere after it
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 2.5))
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    assert not (tmp_path / "final.safetensors").exists()
    survivor = last_complete_checkpoint(str(tmp_path))
    assert survivor is not None
    # a save cut short in the middle: a newer folder with a model and no marker must be skipped
    half_written = tmp_path / "checkpoint-999"
    half_written.mkdir()
    shutil.copy(os.path.join(survivor, "model.safetensors"), half_written / "model.safetensors")
    assert last_complete_checkpoint(str(tmp_path)) == survivor

    resumed = train(tmp_path, "resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "skipping incomplete checkpoint(s) checkpoint-999" in resumed.stderr
    final = load_file(tmp_path / "final.safetensors")
    assert final.keys() == uninterrupted.keys()
    for key, value in uninterrupted.items():
        torch.testing.assert_close(final[key], value, atol=1e-6, rtol=0, msg=key)


def test_every_kept_checkpoint_is_marked_complete(tmp_path):
    run = train(tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    kept = sorted(p.name for p in tmp_path.glob("checkpoint-*"))
    assert kept == ["checkpoint-20", "checkpoint-22", "checkpoint-24"]  # save_total_limit=3
    assert all((tmp_path / name / COMPLETE_MARKER).is_file() for name in kept)
