"""A cache of built graph files that cannot serve a stale or damaged entry.

An entry is a folder `<root>/<key>/` holding one graph file and `manifest.json` (the file's name, size and SHA-256,
recorded when it was written). The key (`model_key`) covers everything that decides the file's content: the
model's code (the source files of every class the model and its submodules are made of), its weights and buffers,
its config, the library versions and the build options. A writer builds into a folder of its own (its pid and a
random suffix) and renames that folder into place: a reader sees a whole entry or none, and of two processes
building one entry at once, the first rename wins and the other takes the winner's. A reader checks the size and
the checksum before using an entry (`read_entry`); a damaged entry is moved aside, said once, and built again.

The key is known before the build, so it cannot name what the build will run. The build itself records it: every
source file whose code ran while it built (a helper a model's forward calls in another module, the tracing code of
`transformers`), but the libraries whose versions are in the key (torch, ONNX, ONNX Runtime, NumPy) and Python's
own, with their SHA-256 in the manifest; an entry one of whose files has changed since is stale, said, and built
again.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# A writer's folder older than this was left by a process killed mid-build (a build takes minutes at most).
STALE_SECONDS = 6 * 3600
# Classes whose code the key need not read: torch's own (covered by torch's version) and Python's.
_FRAMEWORK_MODULES = ("torch", "builtins")


def _versioned_folders() -> tuple[str, ...]:
    """Folders whose code a build's recorded sources leave out: the libraries whose versions the key holds, and
    Python's standard library."""
    import sysconfig

    folders = [sysconfig.get_paths()["stdlib"], os.path.dirname(os.__file__)]
    for name in ("torch", "onnx", "onnxruntime", "numpy"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            folders.append(os.path.dirname(module.__file__))
    return tuple(os.path.join(os.path.realpath(f), "") for f in folders)


@contextlib.contextmanager
def recording_sources():
    """Within the block, the source files whose functions are called (this thread), collected into the set given."""
    files: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            files.add(frame.f_code.co_filename)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield files
    finally:
        sys.setprofile(previous)


def source_digests(files: set[str]) -> dict[str, str]:
    """`{path: SHA-256}` of the recorded `files` that are real files outside the versioned libraries."""
    skipped = _versioned_folders()
    paths = {os.path.realpath(f) for f in files if os.path.isfile(f)}
    return {path: file_sha256(path) for path in sorted(paths) if not path.startswith(skipped)}


def _writer_suffix() -> str:
    """A name part no other writer uses at the same time: this process's id and a random part."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _code_bytes(code: Any) -> bytes:
    """A compiled function's bytecode, names and constants (nested functions' too), without memory addresses."""
    parts = [code.co_code, repr(code.co_names).encode()]
    for const in code.co_consts:
        parts.append(_code_bytes(const) if inspect.iscode(const) else repr(const).encode())
    return b"".join(parts)


def _class_code(cls: type) -> bytes:
    """What decides the behaviour of `cls`: the bytes of the file that defines it (every function and class of that
    module, so a helper it calls too; its source when the module has no file) and the compiled code of its own
    functions (which a class made by `exec`, or changed after import, has only there)."""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if path and os.path.isfile(path):
        with open(path, "rb") as f:
            parts = [f.read()]
    else:
        try:
            parts = [inspect.getsource(cls).encode()]
        except (OSError, TypeError):  # defined in an interactive session or by exec
            parts = []
    for name, value in sorted(vars(cls).items()):
        function = getattr(value, "__func__", value)  # static and class methods too
        if inspect.isfunction(function):
            parts.append(name.encode() + _code_bytes(function.__code__))
    return b"\0".join(parts)


def code_digest(model: nn.Module) -> str:
    """A digest of the code of `model`: every class in the method resolution order of the model's type and of each
    submodule's type (but `nn.Module`, torch's own classes and `object`), by their module files' bytes."""
    classes = {}
    for module in model.modules():
        for cls in type(module).__mro__:
            if cls.__module__.split(".")[0] not in _FRAMEWORK_MODULES:
                classes[f"{cls.__module__}.{cls.__qualname__}"] = cls
    digest = hashlib.sha256()
    seen: dict[bytes, None] = {}
    for name in sorted(classes):
        digest.update(name.encode())
        code = _class_code(classes[name])
        fingerprint = hashlib.sha256(code).digest()
        if fingerprint not in seen:  # a file shared by several classes is hashed once
            seen[fingerprint] = None
            digest.update(fingerprint)
    return digest.hexdigest()


def model_key(model: nn.Module, header: dict[str, Any]) -> str:
    """The cache key of a graph built from `model`: its code (`code_digest`), its config, every tensor of its
    `state_dict` (names, dtypes, shapes and bytes) and `header` (versions and build options)."""
    config = getattr(model, "config", None)
    head = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "code": code_digest(model),
        "config": config.to_json_string() if config is not None else "",
        **header,
    }
    digest = hashlib.sha256(json.dumps(head, sort_keys=True, default=str).encode())
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:24]


def entry_problem(folder: str) -> str | None:
    """Why the entry `folder` cannot be used, in a few words (None when its file has the size and the checksum its
    manifest recorded)."""
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        path = os.path.join(folder, manifest["file"])
        size, sha256 = int(manifest["size"]), str(manifest["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"its {MANIFEST} is unreadable ({type(err).__name__})"
    if not os.path.isfile(path):
        return f"{manifest['file']} is missing"
    if os.path.getsize(path) != size:
        return f"{manifest['file']} has {os.path.getsize(path)} bytes, {size} were written (truncated or rewritten)"
    if file_sha256(path) != sha256:
        return f"{manifest['file']} does not match the SHA-256 recorded when it was written (corrupted)"
    for source, digest in (manifest.get("sources") or {}).items():
        if not os.path.isfile(source) or file_sha256(source) != digest:
            return f"{source}, whose code ran when it was built, has changed since (stale)"
    return None


def _move_aside(folder: str) -> None:
    """Take a damaged entry out of the way (renamed first, so a reader never sees it half deleted)."""
    trash = f"{folder}.trash-{_writer_suffix()}"
    try:
        os.rename(folder, trash)
    except FileNotFoundError:  # another process moved it already
        return
    shutil.rmtree(trash, ignore_errors=True)


def _publish(staging: str, folder: str) -> bool:
    """Rename the whole `staging` folder to `folder`; False when another writer's entry got there first."""
    try:
        os.rename(staging, folder)
        return True
    except OSError:  # ENOTEMPTY / EEXIST: the entry exists (another process published it)
        shutil.rmtree(staging, ignore_errors=True)
        return False


def _sweep(root: str) -> None:
    """Remove the folders of writers killed mid-build (and of entries moved aside) older than `STALE_SECONDS`: a
    live writer's folder is younger than any build."""
    now = time.time()
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(".tmp-") or ".trash-" in name:
            with contextlib.suppress(OSError):
                if now - os.path.getmtime(path) > STALE_SECONDS:
                    shutil.rmtree(path, ignore_errors=True)


def cached_file(
    root: str, key: str, name: str, build: Callable[[str], str], what: str = "graph", retried: bool = False
) -> str:
    """The path of the verified file of entry `key` under `root`, built by `build(staging_folder) -> file path`
    when the entry is absent or damaged (one warning naming the entry and what is wrong with it).

    `build` writes into a folder of this writer's own; its file is renamed to `name`, recorded in the manifest
    (size, SHA-256) and the folder renamed into place, so that concurrent builders never share a temporary file.
    """
    folder = os.path.join(root, key)
    if os.path.isdir(folder):
        problem = entry_problem(folder)
        if problem is None:
            return os.path.join(folder, name)
        logger.warning("the cached %s %s is stale or damaged (%s); building it again", what, folder, problem)
        _move_aside(folder)
    os.makedirs(root, exist_ok=True)
    _sweep(root)
    staging = os.path.join(root, f".tmp-{key}-{_writer_suffix()}")
    os.makedirs(staging)
    try:
        with recording_sources() as ran:
            built = build(staging)
        path = os.path.join(staging, name)
        if os.path.abspath(built) != os.path.abspath(path):
            os.replace(built, path)
        for leftover in os.listdir(staging):  # intermediate files of the build
            if leftover != name:
                os.remove(os.path.join(staging, leftover))
        manifest = {"file": name, "size": os.path.getsize(path), "sha256": file_sha256(path)}
        manifest["sources"] = source_digests(ran)
        with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if not _publish(staging, folder) and entry_problem(folder) is not None and not retried:
        return cached_file(root, key, name, build, what, retried=True)  # the winner's entry was damaged meanwhile
    return os.path.join(folder, name)


def discard_entry(path: str, why: str, what: str = "graph") -> None:
    """An entry whose verified file still does not load (e.g. a manifest written for a bad file): said once, moved
    aside so the next build replaces it."""
    folder = os.path.dirname(path)
    logger.warning("the cached %s %s does not load (%s); building it again", what, folder, why)
    _move_aside(folder)


__all__ = ["cached_file", "code_digest", "discard_entry", "entry_problem", "model_key", "MANIFEST"]
