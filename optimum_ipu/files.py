"""Writing files so that a crash never leaves a truncated one, and naming the file a typo meant. Pure Python: every
layer may use it."""

from __future__ import annotations

import difflib
import json
import os
import stat
import uuid
from typing import Any


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


def read_json_file(path: str | os.PathLike, what: str, max_bytes: int, error: type[ValueError] = ValueError) -> Any:
    """A JSON text file read with the checks every file a user names gets: a regular file only (a FIFO would block
    forever, `/dev/zero` read until memory runs out), at most `max_bytes`, UTF-8 (a byte-order mark accepted), not
    nested past Python's recursion limit, no integer past its digit limit. Any problem is one `error` naming the
    file, `what` it should be, and the cause. Only JSON is read (never pickle or YAML): data, not code.

    Args:
        path: the file.
        what (`str`): what the file should be, for the messages ("an IPU config", "an argument file").
        max_bytes (`int`): the largest such file can sensibly be.
        error (`type[ValueError]`, *optional*): the error raised.
    """
    name = os.fspath(path)
    kind = not_a_file(name)
    if kind is not None:
        raise error(f"{name} is {kind}, not a regular file; {what} is a JSON text file")
    try:
        with open(name, "rb") as f:
            data = f.read(max_bytes + 1)  # one byte more, to know it is over whatever stat said
    except OSError as err:  # not there, no permission, ...
        raise error(f"{name}: cannot read {what} ({err.strerror or err})") from None
    if len(data) > max_bytes:
        raise error(f"{name} is over {max_bytes // 1024} KiB; {what} is far smaller (the wrong file?)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise error(f"{name} is not valid JSON: it is not UTF-8 text (byte {err.start}); {what} is JSON text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{name} is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except RecursionError:
        raise error(f"{name} is not valid as {what}: its JSON is nested too deeply") from None
    except ValueError as err:  # Python's limit on integer digits (4,300): no value needs such a number
        raise error(f"{name} is not valid as {what}: {str(err).split(';')[0]}") from None
