"""Writing files so that a crash never leaves a truncated one (and a full disk is one line with the sizes), naming the
file a typo meant, checking a folder a config names and a text file that is not UTF-8. Pure Python: every layer may
use it."""

from __future__ import annotations

import codecs
import contextlib
import difflib
import errno
import json
import os
import shutil
import stat
import tempfile
import uuid
from typing import Any

# Linux's limits: a name of a path (one component) up to 255 bytes, a whole path up to 4,096 (PATH_MAX)
NAME_MAX, PATH_MAX = 255, 4096
UTF8_BOM = codecs.BOM_UTF8


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to a temporary file of this writer's own beside `path`, flush it to disk, then rename it over
    `path`. A full disk leaves `path` as it was (the temporary file is removed) and raises `NoSpaceLeftError`
    naming `path`, the bytes it needed and those free there."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # one name per writer, threads of a process too
    data = text.encode("utf-8")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpaceLeftError(path, len(data), "the file", "free space there or write elsewhere") from err
        raise


# ------------------------------------------------------------------ a full disk
def size_in_words(n: int) -> str:
    """A byte count as people read it: `"830 bytes"`, `"12 KB"`, `"3.4 MB"`, `"120 MB"`, `"2.5 GB"` (powers of
    1,000, as `df -H` and file managers count)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n} bytes"


def free_bytes(path: str | os.PathLike) -> int | None:
    """The bytes free to this user on the filesystem that holds `path` (its nearest existing folder), or None when
    that cannot be told."""
    folder = os.path.abspath(os.fspath(path))
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


class NoSpaceLeftError(OSError):
    """A write that found the disk full, as one line: the path, the size it needed, the space free there and the
    fix. An `OSError` with `errno.ENOSPC`, so that whoever handles a full disk handles it.

    Args:
        path (`str`): what was being written (a file or a checkpoint folder).
        needed (`int`, *optional*): about how many bytes the whole write needs (None: not known).
        what (`str`, *optional*): what needs them, for the message ("the checkpoint", "the model").
        fix (`str`, *optional*): what to do, after "free space" (e.g. "or save elsewhere (--output_dir)").
    """

    def __init__(self, path: str, needed: int | None = None, what: str = "it", fix: str = "free space there") -> None:
        free = free_bytes(path)
        need = f"{what} needs about {size_in_words(needed)}" if needed else ""
        have = f"{size_in_words(free)} free there" if free is not None else ""
        sizes = ", ".join(part for part in (need, have) if part)
        super().__init__(f"no space left on device writing {path}{': ' + sizes if sizes else ''}; {fix}")
        self.errno, self.path, self.needed, self.free = errno.ENOSPC, path, needed, free


def disk_full(err: BaseException) -> bool:
    """Whether `err` says a disk is full, however the writer reports it: an `OSError` (`ENOSPC`, `EDQUOT`),
    safetensors' `StorageFull`, torch's bare "file write failed" (`torch.save` gives no errno)."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err)
    return any(words in text for words in ("No space left on device", "StorageFull", "file write failed"))


# ------------------------------------------------------------------ folders a config names
def path_length_problem(path: str) -> str | None:
    """Why no filesystem here can hold `path`, in a few words (a NUL character, a name over 255 bytes, a path over
    4,096 bytes); None when its length and characters are fine."""
    if "\0" in path:
        return "it holds a NUL character, which no path can"
    encoded = os.fsencode(path)
    longest = max(encoded.split(b"/"), key=len, default=b"")
    if len(longest) > NAME_MAX:
        return f"one of its names is {len(longest)} bytes long, over the {NAME_MAX} a filesystem allows"
    if len(encoded) > PATH_MAX:
        return f"it is {len(encoded)} bytes long, over the {PATH_MAX} a path may be"
    return None


_USABLE_FOLDERS: set[str] = set()


def checked_writable_folder(path: str | os.PathLike, field: str, fix: str, error: type[ValueError] = ValueError) -> str:
    """`path` as an absolute folder that this process can write to, made when it is not there (once checked, a
    folder is not checked again in this process). A file, a device (`/dev/null`), a path too long for the
    filesystem, a folder that cannot be made or written to: one `error` "<field>: got <path>; <why>; <fix>"."""
    folder = os.path.abspath(os.fspath(path))
    if folder in _USABLE_FOLDERS:
        return folder
    shown = repr(os.fspath(path))
    shown = shown if len(shown) <= 120 else f"{shown[:60]}...{shown[-40:]} ({len(shown)} characters)"

    def refuse(problem: str) -> ValueError:
        return error(f"{field}: got {shown}; {problem}; {fix}")

    problem = path_length_problem(folder)
    if problem is not None:
        raise refuse(problem)
    blocked = folder  # the nearest part of the path that is there: a folder, or what stands in the way
    while not os.path.lexists(blocked) and os.path.dirname(blocked) != blocked:
        blocked = os.path.dirname(blocked)
    if not os.path.isdir(blocked):
        where = "it" if blocked == folder else f"{blocked}, on its path,"
        raise refuse(f"{where} is {not_a_file(blocked) or 'a file'}, not a folder")
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # a write, not `os.access`: root passes every permission check
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise refuse(f"cannot {'write to it' if os.path.isdir(folder) else 'make it'} ({reason})") from None
    _USABLE_FOLDERS.add(folder)
    return folder


# ------------------------------------------------------------------ text encodings
def utf8_problem(path: str | os.PathLike, bom_allowed: bool = True, chunk: int = 1 << 24) -> str | None:
    """Why the file at `path` is not UTF-8 text, in a few words with the fix (the first byte that is not, and the
    `iconv` command that converts a Latin-1 file), or that it starts with a byte-order mark when `bom_allowed` is
    False (`transformers` reads its JSON files without one); None when it is UTF-8. Read in chunks of `chunk`
    bytes: a file of any size costs a read, not its size in memory."""
    name = os.fspath(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, head = 0, b""
    with open(name, "rb") as f:
        while True:
            data = f.read(chunk)
            head = head or data[:4]
            if offset == 0 and data.startswith(UTF8_BOM) and not bom_allowed:
                return (
                    "starts with a UTF-8 byte-order mark, which transformers reads as part of the text; remove it, "
                    f"e.g. sed -i '1s/^\\xEF\\xBB\\xBF//' {name}"
                )
            held = len(decoder.getstate()[0])  # the end of the previous chunk: a character cut in two
            try:
                decoder.decode(data, final=not data)
            except UnicodeDecodeError as err:
                return not_utf8(name, offset - held + err.start, err.object[err.start], head)
            if not data:
                return None
            offset += len(data)


# a model folder's files that `transformers` reads as UTF-8 text without a byte-order mark: config.json,
# tokenizer.json, vocab.txt, merges.txt, chat templates (ipu_config.json is read with one: `read_json_file`)
MODEL_TEXT_FILES = (".json", ".txt", ".jinja")


def model_folder_text_problem(folder: str | os.PathLike) -> str | None:
    """What is wrong with the first text file of a local model folder that `transformers` would misread: "<file>
    <problem>" (a byte-order mark, which it fails on or reads into `vocab.txt`'s first token, or bytes that are not
    UTF-8, with the fix); None when every one is fine, or `folder` is not a folder (a Hub id)."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        return None
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if not entry.endswith(MODEL_TEXT_FILES) or entry == "ipu_config.json" or not os.path.isfile(path):
            continue
        try:
            problem = utf8_problem(path, bom_allowed=False)
        except OSError:  # unreadable: said by whatever reads it, in its own words
            continue
        if problem is not None:
            return f"{entry} {problem}"
    return None


def not_utf8(name: str, at: int, byte: int, head: bytes = b"") -> str:
    """The words for a file that is not UTF-8 (its first bytes `head` tell UTF-16 by its byte-order mark): where,
    and how to convert it."""
    converted = f"{os.path.splitext(name)[0]}.utf8{os.path.splitext(name)[1]}"
    source = "utf-16" if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else "latin1"
    kind = "UTF-16 text" if source == "utf-16" else "Latin-1 or another legacy encoding?"
    return (
        f"is not UTF-8 text (byte {at} is 0x{byte:02X}; {kind}); convert it, e.g. iconv -f {source} -t utf-8 {name} "
        f"> {converted}"
    )


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
        at = err.start + (len(UTF8_BOM) if data.startswith(UTF8_BOM) else 0)
        raise error(f"{name} is not valid JSON: it {not_utf8(name, at, data[at], data[:4])}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{name} is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except RecursionError:
        raise error(f"{name} is not valid as {what}: its JSON is nested too deeply") from None
    except ValueError as err:  # Python's limit on integer digits (4,300): no value needs such a number
        raise error(f"{name} is not valid as {what}: {str(err).split(';')[0]}") from None
