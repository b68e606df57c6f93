"""Writing files so that a crash never leaves a truncated one, and naming the file a typo meant. Pure Python: every
layer may use it."""

from __future__ import annotations

import difflib
import os
import uuid


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to a temporary file of this writer's own beside `path`, flush it to disk, then rename it over
    `path`."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # one name per writer, threads of a process too
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def nearest_sibling(path: str | os.PathLike, cutoff: float) -> str | None:
    """The name in `path`'s folder most like its own (`difflib`, at least `cutoff` alike), or None: what a path
    that is not there was probably meant to be (a typo)."""
    folder, name = os.path.split(os.fspath(path))
    siblings = os.listdir(folder or ".") if os.path.isdir(folder or ".") else []
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=cutoff)
    return close[0] if close else None
