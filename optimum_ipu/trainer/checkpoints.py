"""Crash-safe checkpoints: a `checkpoint-N/` folder is resumed from only once it is marked complete and whole.

`transformers.Trainer` writes `checkpoint-N/` file by file; a run killed meanwhile leaves a folder that
`get_last_checkpoint` would pick up and fail on (or silently resume from a mix of steps). `IPUTrainer` writes
`checkpoint_complete.json` into the folder once every process has finished writing it (atomically: a
temporary file, then a rename). The marker lists every file of the folder with its size and SHA-256, and
records the run: a run id and the arguments that shape training (its identity). A resume:

- takes only marked folders whose files all have the listed sizes and hashes; a folder that fails is named
  and skipped for the previous whole one (or refused, when it was asked for by path); a marker of an earlier
  release, without checksums, counts as no marker (the folder is checked as a `Trainer` one, said in one line);
- refuses a pickled file that holds more than tensor data (a poisoned `optimizer.pt`), naming it;
- takes a folder written by a plain `transformers.Trainer` (no marker, no `ipu_config.json`) as `Trainer` would,
  when each of its files loads (JSON parses, safetensors headers cover their files, the zip records of `.pt`/`.bin`
  files match their CRC-32, the shards an index lists exist), saying in one line that it carries no marker;
- refuses a folder that holds whole checkpoints of several runs (an earlier run's left beside this one's);
- refuses a checkpoint written with other training arguments, naming them.

A folder about to be rewritten loses its marker first, so a kill in the middle never leaves a marked,
half-written folder. A save that finds the disk full (`full_disk_said`) ends in one line naming the file, the size
the save needs and the space free there; the checkpoint it cut short is removed (the earlier ones stay: they are
rotated only once a new one is marked), and a model saved into `output_dir` keeps no cut-short file.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME, TRAINING_ARGS_NAME
from transformers.trainer_utils import rotate_checkpoints

from ..config_schema import CONFIG_NAME as IPU_CONFIG_NAME
from ..errors import short_repr
from ..files import NoSpaceLeftError, disk_full, write_text_atomic

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "checkpoint_complete.json"
MARKER_VERSION = 2
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# The arguments whose change makes a resumed run differ from the one interrupted (data order, schedule, update).
IDENTITY_ARGS = (
    "learning_rate",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "optim",
    "lamb",
    "lr_scheduler_type",
    "warmup_steps",
    "seed",
    "data_seed",
    "per_device_train_batch_size",
    "num_train_epochs",
    "max_steps",
    "label_smoothing_factor",
    "loss_scaling",
    "lr_scheduler_kwargs",
    "warmup_ratio",
    "optim_args",
)
# Keys of a model's config that do not change what it computes in training (outputs asked for, names, versions)
MODEL_CONFIG_IGNORED = (
    "_name_or_path",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "architectures",
    "use_cache",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
    "auto_map",
)
IDENTITY_CONFIG = ("gradient_accumulation_steps", "replication_factor", "device_iterations", "auto_loss_scaling")
# Changed on purpose to train longer (as `transformers` allows): said in a warning, not refused.
IDENTITY_EXTENDABLE = ("num_train_epochs", "max_steps")


def new_run_id() -> str:
    """A fresh id for a training run started from scratch (a resumed run keeps its checkpoint's)."""
    return uuid.uuid4().hex[:12]


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def run_identity(
    args: Any, ipu_config: Any, precision: str, train_samples: int | None, model_config: Any = None
) -> dict[str, Any]:
    """What shapes a training run: the arguments of `IDENTITY_ARGS`, the config's `IDENTITY_CONFIG` fields, the
    precision, the number of training samples and the model's architecture (`model.<key>`: its config's values
    that differ from its class's defaults, and its type). Two runs with equal identities take the same steps."""
    identity = {name: _jsonable(getattr(args, name, None)) for name in IDENTITY_ARGS}
    identity.update({name: _jsonable(ipu_config.value(name)) for name in IDENTITY_CONFIG})
    identity["precision"] = precision
    identity["train_samples"] = train_samples
    if model_config is not None:
        identity["model"] = getattr(model_config, "model_type", type(model_config).__name__)
        for key, value in sorted(model_config.to_diff_dict().items()):
            if key not in MODEL_CONFIG_IGNORED and not key.startswith("_"):
                identity[f"model.{key}"] = _jsonable(value)
    return identity


def is_complete(checkpoint: str) -> bool:
    """Whether `checkpoint` has its completion marker (its files are checked by `checkpoint_problem`)."""
    return os.path.isfile(os.path.join(checkpoint, COMPLETE_MARKER))


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _checkpoint_files(checkpoint: str) -> list[str]:
    """Files of the folder, relative to it, without the marker and temporary files of atomic writes."""
    found = []
    for root, _, names in os.walk(checkpoint):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), checkpoint)
            if rel != COMPLETE_MARKER and ".tmp-" not in name:
                found.append(rel)
    return sorted(found)


def write_marker(checkpoint: str, global_step: int, run: dict[str, Any] | None = None) -> None:
    """Mark `checkpoint` complete: its files with their sizes and hashes, the step and the run (atomically)."""
    files = {}
    for rel in _checkpoint_files(checkpoint):
        path = os.path.join(checkpoint, rel)
        files[rel] = {"size": os.path.getsize(path), "sha256": file_sha256(path)}
    marker = {"version": MARKER_VERSION, "global_step": global_step, "run": run, "files": files}
    write_text_atomic(os.path.join(checkpoint, COMPLETE_MARKER), json.dumps(marker, indent=1))


def read_marker(checkpoint: str) -> dict[str, Any] | None:
    """The marker of `checkpoint` (None when it has none or it cannot be read as one)."""
    try:
        with open(os.path.join(checkpoint, COMPLETE_MARKER), encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and "files" in marker else None


def written_by_trainer(checkpoint: str) -> bool:
    """Whether `checkpoint` was written by a plain `transformers.Trainer`: its `trainer_state.json`, no marker and no
    `ipu_config.json` (`IPUTrainer` writes one into each of its checkpoints before marking it: an unmarked folder
    that has one is a save of ours cut short)."""
    return (
        not is_complete(checkpoint)
        and os.path.isfile(os.path.join(checkpoint, TRAINER_STATE_NAME))
        and not os.path.isfile(os.path.join(checkpoint, IPU_CONFIG_NAME))
    )


def _load_problem(path: str) -> str | None:
    """Why the file at `path` does not load, in a few words (None when it does); checked by what it is: JSON
    parses, a safetensors header covers its file, the records of a zip (`torch.save`'s format) match their CRC-32."""
    name = os.path.basename(path)
    try:
        if name.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                json.load(f)
        elif name.endswith(".safetensors"):
            with safe_open(path, framework="pt") as f:
                f.keys()
        elif name.endswith((".pt", ".pth", ".bin")):
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
            if bad is not None:
                return f"does not load ({bad} fails its CRC-32 check)"
    except (OSError, ValueError, SafetensorError, zipfile.BadZipFile) as err:
        return f"does not load ({_first_line(err)})"
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return short_repr(text[0], 80).strip("'\"") if text else type(err).__name__


def trainer_checkpoint_problem(checkpoint: str) -> str | None:
    """Why a checkpoint of a plain `transformers.Trainer` (no marker) cannot be resumed from; None when every file
    loads (`_load_problem`) and the shards its index files list are there."""
    for rel in _checkpoint_files(checkpoint):
        path = os.path.join(checkpoint, rel)
        problem = _load_problem(path)
        if problem is not None:
            return f"{rel} {problem}"
        if rel.endswith(".index.json"):
            with open(path, encoding="utf-8") as f:
                shards = set((json.load(f).get("weight_map") or {}).values())
            missing = sorted(s for s in shards if not os.path.isfile(os.path.join(checkpoint, os.path.dirname(rel), s)))
            if missing:
                return f"{missing[0]} is missing (listed in {rel})"
    return None


def has_checksums(marker: dict[str, Any]) -> bool:
    """Whether `marker` records a size and a SHA-256 for every file it lists (markers of earlier releases list
    names only, or sizes only: they cannot tell a file changed after the save)."""
    files = marker.get("files")
    return (
        isinstance(files, dict)
        and bool(files)
        and all(
            isinstance(e, dict) and isinstance(e.get("size"), int) and isinstance(e.get("sha256"), str)
            for e in files.values()
        )
    )


def unsafe_pickle_problem(checkpoint: str) -> str | None:
    """The first pickled file of `checkpoint` (`.pt`/`.pth`/`.bin`, but `training_args.bin`, which a resume never
    reads) holding objects that `torch.load(weights_only=True)` refuses, named with the objects and a warning not to
    load it; None when there is none. Read with `transformers`' allow-list of the numpy types of its RNG states, as
    a resume reads them; only the pickle's names are read, nothing is unpickled."""
    from torch.serialization import get_unsafe_globals_in_checkpoint
    from transformers.trainer_pt_utils import safe_globals

    for rel in _checkpoint_files(checkpoint):
        if not rel.endswith((".pt", ".pth", ".bin")) or os.path.basename(rel) == TRAINING_ARGS_NAME:
            continue
        try:
            with safe_globals():
                unsafe = get_unsafe_globals_in_checkpoint(os.path.join(checkpoint, rel))
        except Exception as err:  # a file torch cannot open as a checkpoint: the errors have no common type
            return f"{rel} does not load ({_first_line(err)})"
        if unsafe:
            names = ", ".join(short_repr(name, 60).strip("'") for name in unsafe[:3])
            return (
                f"{rel} holds pickled objects that are not tensor data ({names}): do not load it (unpickling it can "
                "run code on this machine); it was not written by a training run"
            )
    return None


def checkpoint_problem(checkpoint: str) -> str | None:
    """Why `checkpoint` cannot be resumed from, in a few words; None when it is marked complete and whole, or was
    written by a plain `transformers.Trainer` and its files load (`trainer_checkpoint_problem`).

    Every file the marker lists must be there with its size (all sizes are checked first, cheaply) and its
    SHA-256. A marker of an earlier release records no checksums (`has_checksums`): it counts as no marker, the
    files it lists must be there and every file of the folder must load, as for a `Trainer` checkpoint. In every
    case, a pickled file holding more than tensor data (`unsafe_pickle_problem`) is named and refused.
    """
    if written_by_trainer(checkpoint):
        return trainer_checkpoint_problem(checkpoint) or unsafe_pickle_problem(checkpoint)
    if not is_complete(checkpoint):
        return "no completion marker: a save cut short"
    marker = read_marker(checkpoint)
    if marker is None:
        return f"its {COMPLETE_MARKER} is unreadable"
    files = marker["files"]
    if not has_checksums(marker):
        listed = files if isinstance(files, list) else list(files) if isinstance(files, dict) else []
        missing = [str(name) for name in listed if not os.path.isfile(os.path.join(checkpoint, str(name)))]
        if missing:
            return f"{missing[0]} is missing"
        return trainer_checkpoint_problem(checkpoint) or unsafe_pickle_problem(checkpoint)
    for rel, entry in files.items():
        path = os.path.join(checkpoint, rel)
        if not os.path.isfile(path):
            return f"{rel} is missing"
        size = os.path.getsize(path)
        if size != entry["size"]:
            return f"{rel} has {size} bytes, the marker says {entry['size']} (truncated or rewritten)"
    for rel, entry in files.items():
        if file_sha256(os.path.join(checkpoint, rel)) != entry["sha256"]:
            return f"{rel} does not match its SHA-256 in the marker (changed after the save)"
    return unsafe_pickle_problem(checkpoint)


def _say_unverified(checkpoint: str) -> None:
    """One line for a checkpoint resumed without checksums: a `Trainer` one, or one marked by an earlier release."""
    marker = read_marker(checkpoint) if is_complete(checkpoint) else None
    if marker is not None and not has_checksums(marker):
        logger.warning(
            "%s: its %s (version %s) records no checksums and counts as no marker: its files load, resuming from it "
            "as Trainer would (a file changed after the save cannot be told)",
            checkpoint,
            COMPLETE_MARKER,
            short_repr(marker.get("version"), 20),
        )
    elif written_by_trainer(checkpoint):
        logger.warning(
            "%s carries no %s (written by transformers.Trainer): its files load, resuming from it as Trainer would",
            checkpoint,
            COMPLETE_MARKER,
        )


def _checkpoints_newest_first(folder: str) -> list[tuple[int, str]]:
    if not os.path.isdir(folder):
        return []
    found = ((int(m.group(1)), name) for name in os.listdir(folder) if (m := _CHECKPOINT.match(name)))
    return sorted(((step, os.path.join(folder, name)) for step, name in found), reverse=True)


def _run_id(checkpoint: str) -> str | None:
    marker = read_marker(checkpoint) or {}
    run = marker.get("run")
    return run.get("id") if isinstance(run, dict) else None


def last_complete_checkpoint(folder: str) -> str | None:
    """The `checkpoint-N` folder of `folder` with the highest N that is marked complete and whole, or written by a
    plain `transformers.Trainer` with files that load (said in one line); None if none.

    Newer folders that fail (unmarked: a save cut short; a listed file missing, truncated or changed; a file of a
    `Trainer` checkpoint that does not load) are skipped, with one warning naming each and why.

    Raises:
        ValueError: the whole checkpoints of `folder` come from more than one run (an earlier run's were left
            beside this one's): which one to continue is not guessed.
    """
    skipped, chosen = [], None
    for _, path in _checkpoints_newest_first(folder):
        problem = checkpoint_problem(path)
        if problem is None:
            chosen = path
            break
        skipped.append(f"{os.path.basename(path)} ({problem})")
    if skipped:
        where = "" if chosen else f"; no whole checkpoint left in {folder}"
        logger.warning("skipping checkpoint(s) that cannot be resumed from: %s%s", "; ".join(skipped), where)
    if chosen is not None:
        _refuse_mixed_runs(folder, chosen)
        _say_unverified(chosen)
    return chosen


def _refuse_mixed_runs(folder: str, chosen: str) -> None:
    """Complete checkpoints of another run than `chosen`'s (by the run ids in their markers) make a resume
    ambiguous: an earlier run's `checkpoint-12` beside this run's `checkpoint-4` would silently win."""
    mine = _run_id(chosen)
    complete = [path for _, path in _checkpoints_newest_first(folder) if is_complete(path)]
    others = [os.path.basename(path) for path in complete if _run_id(path) != mine]
    if others:
        raise ValueError(
            f"{folder} holds checkpoints of more than one training run ({os.path.basename(chosen)} and "
            f"{', '.join(others[:3])} come from different runs); pass --resume_from_checkpoint with the folder to "
            "continue, or --overwrite_output_dir to start afresh"
        )


def resolve_resume(resume_from_checkpoint: str | bool | None, output_dir: str) -> str | None:
    """The checkpoint folder a run resumes from, checked; None for a fresh start.

    `True` (or the string `"true"`) takes `last_complete_checkpoint(output_dir)`, which must exist. A folder
    given by path must be complete and whole, or written by a plain `transformers.Trainer` with files that load
    (said in one line).

    Raises:
        ValueError: one line naming the folder and why it cannot be resumed from.
    """
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True or str(resume_from_checkpoint).lower() == "true":
        checkpoint = last_complete_checkpoint(output_dir)
        if checkpoint is None:
            raise ValueError(
                f"--resume_from_checkpoint True: no complete checkpoint in {output_dir}; train without it to start "
                "afresh, or give a checkpoint folder"
            )
        return checkpoint
    path = os.fspath(resume_from_checkpoint)
    if not os.path.isdir(path):
        raise ValueError(
            f"--resume_from_checkpoint {short_repr(path)}: no such folder; give a checkpoint-N folder, or True for "
            "the newest complete one in --output_dir"
        )
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ValueError(
            f"--resume_from_checkpoint {path}: cannot resume from it ({problem}); pass True to take the newest "
            "whole checkpoint of --output_dir, or an earlier folder"
        )
    _say_unverified(path)
    return path


def check_run_identity(checkpoint: str, identity: dict[str, Any]) -> str | None:
    """Compare the run recorded in `checkpoint`'s marker with `identity`; return the run id to continue.

    Returns None for a checkpoint without a recorded run (a plain `transformers` one, or an older marker). A
    different length (`IDENTITY_EXTENDABLE`: training on for longer) is a warning, since the LR schedule then
    differs from the interrupted run's.

    Raises:
        ValueError: one line naming the other arguments that differ, their recorded and current values.
    """
    run = (read_marker(checkpoint) or {}).get("run")
    if not isinstance(run, dict):
        return None
    recorded = run.get("identity") or {}
    # a marker written before a key was recorded says nothing of it (of the model: before "model" was)
    known = [key for key in identity if key in recorded or (key.startswith("model.") and "model" in recorded)]
    changed = [key for key in sorted(set(recorded) | set(known)) if recorded.get(key) != identity.get(key)]

    def differences(keys: list[str]) -> str:
        pairs = [(k, short_repr(recorded.get(k), 40), short_repr(identity.get(k), 40)) for k in keys[:4]]
        return ", ".join(f"{k} {old} -> {new}" for k, old, new in pairs)

    longer = [key for key in changed if key in IDENTITY_EXTENDABLE]
    if longer:
        logger.warning(
            "%s: resumed with %s; the LR schedule differs from the interrupted run's", checkpoint, differences(longer)
        )
    changed = [key for key in changed if key not in IDENTITY_EXTENDABLE]
    if changed:
        diffs = differences(changed)
        raise ValueError(
            f"{checkpoint} was written by a run with other training arguments or another model ({diffs}); resume "
            "with the arguments and model it was trained with, or start afresh with --overwrite_output_dir"
        )
    return run.get("id")


def discard_checkpoint(checkpoint: str) -> None:
    """Delete a checkpoint folder, its marker first: a kill in the middle leaves an unmarked (skipped) folder."""
    marker = os.path.join(checkpoint, COMPLETE_MARKER)
    if os.path.exists(marker):
        os.remove(marker)
    shutil.rmtree(checkpoint, ignore_errors=True)


def discard_checkpoints(folder: str) -> list[str]:
    """Delete every `checkpoint-N` folder of `folder` (what an earlier run left); returns their names."""
    removed = []
    for _, path in sorted(_checkpoints_newest_first(folder)):
        discard_checkpoint(path)
        removed.append(os.path.basename(path))
    return removed


class MarkCheckpointComplete(TrainerCallback):
    """After `Trainer` saved `checkpoint-N` (on every process), mark it complete from the main process, then
    delete the checkpoints beyond `save_total_limit` (which `IPUTrainer` keeps `Trainer` from doing earlier)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        self.trainer.accelerator.wait_for_everyone()  # every rank has written its part (RNG states, shards)
        if args.should_save and os.path.isdir(checkpoint):
            write_marker(checkpoint, state.global_step, getattr(self.trainer, "run_record", None))
        # Older checkpoints go only now (save_total_limit): a kill before the marker keeps the previous one.
        rotation = self.trainer.take_pending_rotation()
        if args.should_save and rotation is not None:
            run_dir, limit = rotation
            rotate_checkpoints(run_dir, limit, state.best_model_checkpoint, use_mtime=True)


# ---------------------------------------------------------------------------------------------------- a full disk
CHECKPOINT_SPACE_FIX = (
    "free space there, save elsewhere (--output_dir), or keep fewer checkpoints (--save_total_limit; the oldest goes "
    "only once a new one is whole, so there must be room for one more)"
)
MODEL_SPACE_FIX = "free space there, or save elsewhere (--output_dir)"


def state_nbytes(*sources: Any) -> int:
    """Bytes of the tensors a save writes of `sources`: modules (their `state_dict()`) and optimizers (their state;
    accelerate's wrapper is looked through); a tensor shared by several names (tied weights) counts once, a DTensor
    as its local shard, a tensor on the meta device (a stage another process holds) not at all."""
    seen, total = set(), 0
    for source in sources:
        if isinstance(source, torch.nn.Module):
            tensors = list(source.state_dict().values())
        else:
            state = getattr(getattr(source, "optimizer", source), "state", None) or {}
            tensors = [value for entry in state.values() if isinstance(entry, dict) for value in entry.values()]
        for tensor in tensors:
            tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            if not torch.is_tensor(tensor) or tensor.is_meta:
                continue
            key = (tensor.device, tensor.data_ptr(), tensor.numel(), tensor.dtype)
            if key not in seen:
                seen.add(key)
                total += tensor.numel() * tensor.element_size()
    return total


def checkpoint_bytes(run_dir: str, model: Any, optimizer: Any = None) -> int:
    """About how many bytes a checkpoint of `model` (and `optimizer`) takes: its tensors, or the files of the
    newest whole checkpoint of `run_dir` (as its marker lists them) when they are more (every stage's, on any
    process)."""
    tensors = state_nbytes(model, optimizer)
    for _, path in _checkpoints_newest_first(run_dir):
        marker = read_marker(path) if is_complete(path) else None
        if marker is not None and has_checksums(marker):
            return max(tensors, sum(entry["size"] for entry in marker["files"].values()))
    return tensors


def _stamps(folder: str) -> dict[str, tuple[int, int, int]]:
    """Each file under `folder` (but the `checkpoint-N` folders inside it) -> (inode, size, mtime): what a save
    wrote since is what differs."""
    stamps = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = [name for name in dirs if not (root == folder and _CHECKPOINT.match(name))]
        for name in names:
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):
                st = os.stat(path)
                stamps[os.path.relpath(path, folder)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return stamps


@contextlib.contextmanager
def full_disk_said(
    folder: str, what: str, needed: Callable[[], int | None], fix: str, cleanup: str | None = None
) -> Iterator[None]:
    """A save into `folder` (a checkpoint, or a model's files) that finds the disk full, however its writer says it
    (`files.disk_full`), ends in one `NoSpaceLeftError`: "no space left on device writing <the file being written>:
    <what> needs about <needed()>, <free> free there; <fix>" (what run_script prints, exit 1).

    `cleanup` (on the process that writes the shared files, `should_save`; None elsewhere: another process may
    still be writing) says what goes: `"folder"`, a checkpoint folder, removed whole (unmarked, a resume would skip
    it anyway, and its space is free again); `"files"`, each file the save wrote that does not load (cut short), so
    that `folder` keeps no truncated model file beside the others."""
    before = _stamps(folder)
    try:
        yield
    except Exception as err:
        if not disk_full(err):
            raise
        after = _stamps(folder)
        written = [rel for rel, stamp in after.items() if before.get(rel) != stamp]
        newest = max(written, key=lambda rel: after[rel][2], default=None)
        path = getattr(err, "path", None) or (os.path.join(folder, newest) if newest else folder)
        note = ""
        if cleanup == "folder" and os.path.isdir(folder):
            discard_checkpoint(folder)
            note = f"{os.path.basename(folder)} was removed, earlier checkpoints kept"
        elif cleanup == "files":
            cut = [rel for rel in written if _load_problem(os.path.join(folder, rel)) is not None]
            for rel in cut:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(folder, rel))
            note = f"the cut-short {', '.join(cut[:3])} removed" if cut else ""
        try:
            size = needed()
        except Exception:  # an estimate only: never hide the full disk behind another error
            size = None
        raise NoSpaceLeftError(path, size, what, f"{fix}{f' ({note})' if note else ''}") from err


def reports_full_disk(save_model: Callable[..., Any]) -> Callable[..., Any]:
    """`IPUTrainer.save_model` that ends a full disk in one line (`full_disk_said`: the file, the model's size, the
    space free there), leaving no cut-short file in the folder; in a checkpoint, `_save_checkpoint` says it for the
    whole checkpoint."""

    @functools.wraps(save_model)
    def save(self: Any, output_dir: str | None = None, _internal_call: bool = False) -> None:
        folder = output_dir or self.args.output_dir
        cleanup = "files" if self.args.should_save else None
        with full_disk_said(folder, "the model", lambda: state_nbytes(self.model), MODEL_SPACE_FIX, cleanup):
            return save_model(self, output_dir, _internal_call)

    return save
