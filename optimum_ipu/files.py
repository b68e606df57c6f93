"""Writing files so that a crash never leaves a truncated one. Pure Python: every layer may use it."""

from __future__ import annotations

import os


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to a temporary file beside `path`, flush it to disk, then rename it over `path`."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
