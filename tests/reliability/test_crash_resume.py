"""SIGKILL a training process at a random moment and in the middle of a checkpoint save; every resumed run goes
on from the newest complete checkpoint and ends with the weights of an uninterrupted run."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers.trainer_pt_utils import safe_globals

from optimum_ipu import last_complete_checkpoint
from optimum_ipu.trainer.checkpoints import COMPLETE_MARKER, checkpoint_problem, is_complete

from ..conftest import PYTHON, REPO_ROOT

WORKER = str(REPO_ROOT / "tests" / "reliability" / "train_worker.py")
# One thread per process: on a small shared machine torch's default thread pool makes a tiny model 10x slower.
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
STEPS, SAVE_EVERY = 24, 2


def worker(out: Path, *extra: str) -> subprocess.Popen:
    # stdout (the loss logs) is dropped: nothing reads the pipes until the end, and a full pipe would block the run
    return subprocess.Popen(
        [PYTHON, WORKER, str(out), *extra], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def finish(process: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=timeout)
    return process.returncode, stderr


def step_of(checkpoint: str | Path) -> int:
    return int(re.fullmatch(r"checkpoint-(\d+)", Path(checkpoint).name).group(1))


def verify_checkpoint(checkpoint: str | Path, reliability) -> None:
    """A complete checkpoint is whole: the marker lists exactly the files there with their sizes and SHA-256
    (computed here, apart from the code under test), at the folder's step, and records the run (id and identity);
    the weights load with safetensors and every other tensor file with `torch.load(weights_only=True)`."""
    checkpoint = Path(checkpoint)
    marker = json.loads((checkpoint / COMPLETE_MARKER).read_text())
    files = sorted(p.name for p in checkpoint.iterdir() if p.name != COMPLETE_MARKER)
    assert marker["global_step"] == step_of(checkpoint) and sorted(marker["files"]) == files, checkpoint
    for name in files:
        data = (checkpoint / name).read_bytes()
        assert marker["files"][name] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    assert len(marker["run"]["id"]) == 12 and marker["run"]["identity"]["learning_rate"] == 1e-3, marker["run"]
    assert checkpoint_problem(str(checkpoint)) is None
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step_of(checkpoint)
    # weights in safetensors only (`training_args.bin` is transformers' pickled arguments record: never read back)
    assert "model.safetensors" in files and "pytorch_model.bin" not in files, files
    assert load_file(checkpoint / "model.safetensors")
    with safe_globals():  # transformers' allow-list of numpy types for the RNG states, as it resumes with
        for name in files:
            if name.endswith((".pt", ".pth")):
                torch.load(checkpoint / name, weights_only=True)
    reliability.checkpoint_verified()


class Uninterrupted:
    """The reference run (its weights and kept checkpoints)."""

    def __init__(self, out: Path) -> None:
        self.out, self.process, self._weights = out, worker(out), None

    def weights(self) -> dict[str, torch.Tensor]:
        if self._weights is None:
            code, stderr = finish(self.process)
            assert code == 0, stderr[-3000:]
            self._weights = load_file(self.out / "final.safetensors")
        return self._weights


@pytest.fixture(scope="module")
def background(tmp_path_factory) -> Iterator[dict]:
    """The runs that need no other, started together at once: they overlap the crash runs of the first test
    (on a small shared machine more processes also get a larger share of it)."""
    limit_1 = tmp_path_factory.mktemp("save-total-limit-1")
    runs = {
        "uninterrupted": Uninterrupted(tmp_path_factory.mktemp("uninterrupted")),
        "limit_1": (limit_1, worker(limit_1, "--kill-in-save", "2", "--save-total-limit", "1")),
    }
    yield runs
    for process in (runs["uninterrupted"].process, runs["limit_1"][1]):  # left running by a deselected test
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.fixture(scope="module")
def uninterrupted(background) -> Uninterrupted:
    return background["uninterrupted"]


def test_killed_mid_checkpoint_and_at_a_random_moment_resumes_as_uninterrupted(
    tmp_path, background, uninterrupted, reliability
):
    # 1. Killed inside its 2nd save (step 4): checkpoint-4 is fully written but not marked complete.
    code, stderr = finish(worker(tmp_path, "--kill-in-save", "2"))
    assert code == -signal.SIGKILL, stderr[-3000:]
    reliability.fault_injected()
    assert (tmp_path / "checkpoint-4").is_dir() and not is_complete(str(tmp_path / "checkpoint-4"))
    survivor = last_complete_checkpoint(str(tmp_path))
    assert survivor is not None and step_of(survivor) == 2
    verify_checkpoint(survivor, reliability)

    # 2. Resumed, then killed at a random moment after it made progress (saves included).
    delay = random.uniform(0.0, 2.5)
    process = worker(tmp_path, "--resume")
    deadline = time.monotonic() + 300
    while not is_complete(str(tmp_path / "checkpoint-6")):  # resumed from step 2 and trained on
        assert process.poll() is None and time.monotonic() < deadline, finish(process)[1][-3000:]
        time.sleep(0.01)
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    code, stderr = finish(process)
    assert code == -signal.SIGKILL, f"the run ended before the kill {delay:.2f} s in"
    reliability.fault_injected()
    assert "skipping checkpoint(s) that cannot be resumed from: checkpoint-4 (no completion marker" in stderr
    survivor = last_complete_checkpoint(str(tmp_path))
    assert survivor is not None and step_of(survivor) >= 6, (survivor, delay)
    verify_checkpoint(survivor, reliability)
    # a save cut short while the model file was written: a newer folder without marker must be skipped
    half_written = tmp_path / "checkpoint-999"
    half_written.mkdir()
    shutil.copy(os.path.join(survivor, "model.safetensors"), half_written / "model.safetensors")
    assert last_complete_checkpoint(str(tmp_path)) == survivor

    # 3. Resumed to the end: the weights of a run that was never interrupted.
    code, stderr = finish(worker(tmp_path, "--resume"))
    assert code == 0, stderr[-3000:]
    assert re.search(r"cannot be resumed from: [^\n]*checkpoint-999 \(no completion marker", stderr), stderr[-3000:]
    final, reference = load_file(tmp_path / "final.safetensors"), uninterrupted.weights()
    assert final.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(final[key], value, atol=1e-6, rtol=0, msg=f"{key} (killed {delay:.2f} s in)")
    reliability.fault_survived(2)  # both kills: the run went on from complete checkpoints to the same weights
    for checkpoint in sorted(tmp_path.glob("checkpoint-[0-9]*")):
        if checkpoint.name != "checkpoint-999":
            verify_checkpoint(checkpoint, reliability)


def test_every_kept_checkpoint_is_whole_and_marked_complete(uninterrupted, reliability):
    uninterrupted.weights()  # waits for the run
    kept = sorted(uninterrupted.out.glob("checkpoint-*"), key=step_of)
    assert [p.name for p in kept] == ["checkpoint-20", "checkpoint-22", "checkpoint-24"]  # save_total_limit=3
    for checkpoint in kept:
        verify_checkpoint(checkpoint, reliability)


def test_killed_mid_checkpoint_with_save_total_limit_1_keeps_a_complete_checkpoint(background, reliability):
    out, process = background["limit_1"]
    code, stderr = finish(process)
    assert code == -signal.SIGKILL, stderr[-3000:]
    survivor = last_complete_checkpoint(str(out))
    assert reliability.fault(survivor is not None), sorted(p.name for p in out.iterdir())
    verify_checkpoint(survivor, reliability)
