"""Writing files so that a crash never leaves a truncated one, and naming the file a typo meant. Pure Python: every
layer may use it."""

from __future__ import annotations

import difflib
import os
import stat
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


def not_a_file(path: str | os.PathLike) -> str | None:
    """What `path` is when it is there but is not a regular file, in words ("a folder", "a FIFO (named pipe)", "a
    symbolic link to ... that is not there", ...); None when it is a regular file (or a link to one) or is not
    there at all."""
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"a symbolic link to {os.readlink(path)!r}, which is not there" if os.path.islink(path) else None
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    if stat.S_ISREG(mode):
        return None
    kinds = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISSOCK: "a socket"}
    kinds |= {stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}
    return next((kind for test, kind in kinds.items() if test(mode)), "not a regular file")
