"""A full disk while saving (issue 42, item 10): one line naming the file being written, the size the save needs and
the space free there, with the fix; the checkpoint it cut short is removed and the earlier one stays whole and
resumable; a model saved into a folder keeps no cut-short file; a JSON file written atomically stays as it was.

The disk fills by fault injection: each writer (`safetensors`' `save_file` for the weights, `torch.save` for the
optimizer state, `IPUTrainerState.save_to_json` for the trainer state, `os.fsync` under an atomic write) writes part of
its file, then fails as it does on a full disk (a real one needs a filesystem to fill)."""

from __future__ import annotations

import contextlib
import errno
import io
import os
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import SafetensorError

from optimum_ipu import IPUConfig, IPUTrainer, IPUTrainingArguments
from optimum_ipu.errors import run_script
from optimum_ipu.files import NoSpaceLeftError, write_text_atomic
from optimum_ipu.trainer.checkpoints import checkpoint_problem, last_complete_checkpoint
from optimum_ipu.trainer.state import IPUTrainerState

from ..helpers import SHORT_RUN, TRAINER_CLASS, classification_dataset
from ..tiny_models import tiny_model

OPTIONS = {**SHORT_RUN, "per_device_train_batch_size": 4, "num_train_epochs": 1, "save_strategy": "steps"}
OPTIONS["save_steps"] = 4  # checkpoints at steps 4 and 8 of 8
TORCH_SAVE = torch.save
SAFE_SAVE = transformers.modeling_utils.safe_save_file
SAVE_STATE = IPUTrainerState.save_to_json


def _cut(path: str) -> None:
    """The file as a full disk leaves it: its first half."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def _fill(monkeypatch, writer: str, when: str) -> None:
    """`writer` finds the disk full while writing a file whose path contains `when`: it writes part of it, then
    fails as it does on a full disk."""

    def safetensors(tensors, filename, *args, **kwargs):
        SAFE_SAVE(tensors, filename, *args, **kwargs)
        if when in str(filename):
            _cut(filename)
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    def torch_save(obj, f, *args, **kwargs):
        TORCH_SAVE(obj, f, *args, **kwargs)
        if isinstance(f, (str, os.PathLike)) and when in str(f):
            _cut(f)
            raise RuntimeError(
                "[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file data/0: file "
                "write failed"
            )

    def save_state(self, json_path):
        SAVE_STATE(self, json_path)
        if when in str(json_path):
            _cut(json_path)
            raise OSError(errno.ENOSPC, "No space left on device")

    patches: dict[str, tuple] = {"safetensors": ("transformers.modeling_utils.safe_save_file", safetensors)}
    patches["torch.save"] = ("torch.save", torch_save)
    patches["json"] = (IPUTrainerState, "save_to_json", save_state)
    monkeypatch.setattr(*patches[writer])


def _trainer(out: Path, **options) -> IPUTrainer:
    args = IPUTrainingArguments(str(out), **{**OPTIONS, **options})
    return IPUTrainer(tiny_model(TRAINER_CLASS), IPUConfig(), args, train_dataset=classification_dataset(32))


def _one_line(main) -> tuple[int, list[str]]:
    """What `run_script` (every example script's `main`) exits with, and the lines it prints (not the progress bars
    of `transformers`' writers, which share stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        run_script(main, "run_x.py")
    return exit_.value.code, [line for line in err.getvalue().splitlines() if line.startswith("run_x.py")]


@pytest.mark.parametrize(
    ("writer", "file", "limit"),
    [
        ("safetensors", "model.safetensors", None),
        ("torch.save", "optimizer.pt", 1),
        ("json", "trainer_state.json", None),
    ],
)
def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_earlier_checkpoint(
    tmp_path, monkeypatch, reliability, writer, file, limit
):
    """The second checkpoint (step 8) finds the disk full while writing `file`: one line naming it, the checkpoint's
    size and the space free, exit 1; checkpoint-8 is gone, checkpoint-4 whole (with --save_total_limit 1 too: it goes
    only once a newer one is marked) and a resume takes it and finishes."""
    out = tmp_path / "out"
    _fill(monkeypatch, writer, f"checkpoint-8{os.sep}{file}")
    code, lines = _one_line(lambda: _trainer(out, save_total_limit=limit).train())
    written = str(out / "checkpoint-8" / file)
    clear = code == 1 and len(lines) == 1 and f"no space left on device writing {written}: " in lines[0]
    clear = clear and "the checkpoint needs about " in lines[0] and " free there" in lines[0]
    clear = clear and "--save_total_limit" in lines[0] and "--output_dir" in lines[0]
    assert reliability.bad_input(clear), lines
    kept = last_complete_checkpoint(str(out))
    survived = not (out / "checkpoint-8").exists() and kept == str(out / "checkpoint-4")
    survived = survived and checkpoint_problem(kept) is None
    monkeypatch.undo()
    resumed = _trainer(out, save_total_limit=limit).train(resume_from_checkpoint=True)
    survived = survived and resumed.global_step == 8 and last_complete_checkpoint(str(out)) == str(out / "checkpoint-8")
    assert reliability.fault(survived), sorted(p.name for p in out.iterdir())
    reliability.checkpoint_verified()


def test_the_size_a_checkpoint_needs_is_about_its_files(tmp_path, monkeypatch):
    """The size said is that of the checkpoint (the earlier one's files), not of the part that fitted."""
    out = tmp_path / "out"
    _fill(monkeypatch, "torch.save", f"checkpoint-8{os.sep}optimizer.pt")
    with pytest.raises(NoSpaceLeftError) as caught:
        _trainer(out).train()
    whole = sum(p.stat().st_size for p in (out / "checkpoint-4").iterdir())
    assert caught.value.errno == errno.ENOSPC and caught.value.needed >= 0.9 * whole, (caught.value.needed, whole)
    assert caught.value.free is not None and f"{caught.value.path}:" in str(caught.value)


@pytest.mark.parametrize(("writer", "file"), [("safetensors", "model.safetensors"), ("torch.save", "training_args")])
def test_a_full_disk_in_save_model_leaves_no_cut_short_file(tmp_path, monkeypatch, reliability, writer, file):
    """`trainer.save_model()` (the scripts' last save) on a full disk: one line naming the file and the model's size,
    and the folder keeps no truncated file beside the others."""
    out = tmp_path / "out"
    trainer = _trainer(out, save_strategy="no")
    final = out / "final"
    _fill(monkeypatch, writer, f"final{os.sep}{file}")
    code, lines = _one_line(lambda: trainer.save_model(str(final)))
    clear = code == 1 and len(lines) == 1 and f"no space left on device writing {final / file}" in lines[0]
    clear = clear and "the model needs about " in lines[0] and " free there" in lines[0]
    assert reliability.bad_input(clear), lines
    monkeypatch.undo()
    assert reliability.fault(not any(file in p.name for p in final.iterdir())), sorted(p.name for p in final.iterdir())


def test_an_atomic_json_write_on_a_full_disk_keeps_the_file_and_says_so(tmp_path, monkeypatch, reliability):
    """`ipu_config.json` (and every file written with `write_text_atomic`) on a full disk: the file as it was, no
    temporary file left, one error naming the file and its size."""
    IPUConfig(seed=1).save_pretrained(tmp_path)
    before = (tmp_path / "ipu_config.json").read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    err = reliability.expect_clear_error(
        lambda: IPUConfig(seed=2).save_pretrained(tmp_path),
        ("no space left on device writing", str(tmp_path / "ipu_config.json"), "needs about", "free there"),
        (NoSpaceLeftError,),
    )
    monkeypatch.undo()
    assert err.errno == errno.ENOSPC
    survived = (tmp_path / "ipu_config.json").read_bytes() == before and sorted(os.listdir(tmp_path)) == [
        "ipu_config.json"
    ]
    assert reliability.fault(survived), os.listdir(tmp_path)


def test_write_text_atomic_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EDQUOT, "Disk quota exceeded")))
    with pytest.raises(
        NoSpaceLeftError, match="no space left on device writing .*notes.txt: the file needs about 5 bytes"
    ):
        write_text_atomic(tmp_path / "notes.txt", "hello")
    assert not os.listdir(tmp_path)
