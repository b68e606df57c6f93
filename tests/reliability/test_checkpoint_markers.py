"""Checkpoint markers cannot vouch for files they do not check (issue 28, item 2).

A marker of any earlier format (names only, sizes only, checksums missing for some files) counts as no marker: the
folder resumes only when its files load, as a plain `Trainer` checkpoint, said in one line; a file damaged under
such a marker is named and refused. A pickled file that holds more than tensor data (a poisoned `optimizer.pt`,
`rng_state.pth`, `scheduler.pt`... behind a recomputed marker) is refused by name, with a word not to load it,
instead of `torch.load`'s unpickling error that suggests `weights_only=False`.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path

import pytest
import torch

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.trainer.checkpoints import COMPLETE_MARKER, checkpoint_problem, resolve_resume, write_marker

from ..helpers import SHORT_RUN, TRAINER_CLASS, classification_dataset
from ..tiny_models import tiny_model

OPTIONS = {**SHORT_RUN, "per_device_train_batch_size": 4, "num_train_epochs": 1, "save_strategy": "steps"}
OPTIONS["save_steps"] = 4
NO_CHECKSUMS = "records no checksums and counts as no marker"


def _older_formats(files: dict[str, dict]) -> dict[str, object]:
    """The `files` entry of markers that record no (or not every) checksum."""
    some = dict(files)
    dropped = sorted(some)[len(some) // 2]
    some[dropped] = {"size": files[dropped]["size"]}
    return {
        "v1 names": sorted(files),
        "sizes only": {name: {"size": e["size"]} for name, e in files.items()},
        "one checksum missing": some,
        "checksums null": {name: {"size": e["size"], "sha256": None} for name, e in files.items()},
    }


FORMATS = ["v1 names", "sizes only", "one checksum missing", "checksums null"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """An IPUTrainer run of 8 steps, checkpoints at steps 4 and 8 (marked with checksums)."""
    out = tmp_path_factory.mktemp("run")
    args = IPUTrainingArguments(str(out), **OPTIONS)
    IPUTrainer(tiny_model(TRAINER_CLASS), IPUConfig(), args, train_dataset=classification_dataset(32)).train()
    assert {p.name for p in out.glob("checkpoint-*")} == {"checkpoint-4", "checkpoint-8"}
    return out


@pytest.fixture
def run(saved, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(saved, out)
    return out


def _remark(checkpoint: Path, fmt: str, version: int = 1) -> None:
    marker = json.loads((checkpoint / COMPLETE_MARKER).read_text())
    marker["files"], marker["version"] = _older_formats(marker["files"])[fmt], version
    (checkpoint / COMPLETE_MARKER).write_text(json.dumps(marker))


def _damage(path: Path, rng: random.Random) -> None:
    """Truncated anywhere before its last 2 bytes (any format), or one byte of a zip record changed (`torch.save`'s
    files: a changed tensor byte in a safetensors file loads, and without checksums it cannot be told)."""
    data = bytearray(path.read_bytes())
    if path.suffix in (".pt", ".pth") and rng.random() < 0.5:
        data[rng.randrange(len(data) // 4, 3 * len(data) // 4)] ^= 0xFF
    else:
        del data[rng.randrange(1, len(data) - 2) :]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_older_marker_counts_as_no_marker(run, reliability, caplog, fmt):
    """Whole files: resumed as a `Trainer` checkpoint would be, said in one line; a damaged (loadable-format) file:
    named and refused, whichever file it is."""
    checkpoint = run / "checkpoint-8"
    _remark(checkpoint, fmt)
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        assert resolve_resume(str(checkpoint), str(run)) == str(checkpoint)
    said = [r.getMessage() for r in caplog.records if NO_CHECKSUMS in r.getMessage()]
    assert len(said) == 1 and "checkpoint-8" in said[0] and "\n" not in said[0], said
    rng = random.Random(fmt)
    loadable = [p for p in checkpoint.iterdir() if p.suffix in (".safetensors", ".pt", ".pth", ".json")]
    victim = rng.choice([p for p in loadable if p.name != COMPLETE_MARKER])
    _damage(victim, rng)
    reliability.fault_injected()
    problem = checkpoint_problem(str(checkpoint))
    assert problem is not None and problem.startswith(victim.name), (victim.name, problem)
    reliability.expect_clear_error(lambda: resolve_resume(str(checkpoint), str(run)), (victim.name, "checkpoint-8"))
    # True takes the previous checkpoint (whole, with checksums), naming the one skipped
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        assert resolve_resume(True, str(run)) == str(run / "checkpoint-4")
    reliability.fault_survived()
    assert f"checkpoint-8 ({victim.name}" in caplog.text
    reliability.checkpoint_verified()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_listed_file_removed_under_an_older_marker_is_named(run, reliability, fmt):
    checkpoint = run / "checkpoint-8"
    _remark(checkpoint, fmt)
    victim = random.Random(fmt).choice(sorted(p.name for p in checkpoint.iterdir() if p.name != COMPLETE_MARKER))
    (checkpoint / victim).unlink()
    reliability.fault_injected()
    assert checkpoint_problem(str(checkpoint)) == f"{victim} is missing"
    reliability.fault_survived()
    reliability.checkpoint_verified()


class Poison:
    """Unpickled, it calls a function of the standard library (harmless here; any other in an attack)."""

    def __reduce__(self):
        return (os.getcwd, ())


@pytest.mark.parametrize("marker", ["recomputed", "older"])
def test_a_poisoned_pickle_is_refused_by_name(run, reliability, marker):
    checkpoint = run / "checkpoint-8"
    pickled = sorted(p.name for p in checkpoint.iterdir() if p.suffix in (".pt", ".pth"))
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth"} <= set(pickled), pickled
    rng = random.Random(marker)
    victim = rng.choice(pickled)
    torch.save({"state": {0: Poison()}, "step": torch.tensor(rng.randrange(9))}, checkpoint / victim)
    write_marker(str(checkpoint), 8)  # the attacker recomputed the marker
    if marker == "older":
        _remark(checkpoint, rng.choice(FORMATS))
    reliability.fault_injected()
    for call in (
        lambda: resolve_resume(str(checkpoint), str(run)),
        lambda: IPUTrainer(tiny_model(TRAINER_CLASS), IPUConfig(), IPUTrainingArguments(str(run), **OPTIONS)).train(
            resume_from_checkpoint=str(checkpoint)
        ),
    ):
        err = reliability.expect_clear_error(call, (victim, "do not load it", "checkpoint-8"))
        assert "weights_only=False" not in str(err) and "posix.getcwd" in str(err), err
    reliability.fault_survived()
    reliability.checkpoint_verified()


def test_a_current_marker_still_resumes_without_a_word(run, caplog, reliability):
    with caplog.at_level(logging.WARNING, logger="optimum_ipu"):
        assert resolve_resume(True, str(run)) == str(run / "checkpoint-8")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    reliability.checkpoint_verified()
