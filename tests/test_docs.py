"""Docs that run: every ```python, ```bash and ```shell block of README.md and docs/**/*.md is a test case, named by
its file and line (docs/docs-tests.md says the rules a page's author follows).

- Python blocks run in one process started for the session (`tests/docs_kernel.py`), in a fresh namespace per page
  shared by that page's blocks in order, like a notebook, each page in its own empty folder. A block selected alone
  (`-k`) runs the page's earlier blocks first.
- Shell blocks run with `bash -e` in an empty folder, the project's virtual environment first on PATH,
  `HF_HUB_OFFLINE=1`, and `REPO` naming the checkout.
- A block after `<!-- docs-test: parse-only REASON -->` or `<!-- docs-test: skip-run REASON -->` is checked for syntax
  and names only: Python is compiled and its `optimum_ipu` imports resolved; bash is parsed with `bash -n`, and each
  command that runs an example or benchmark script, a module (`python -m`), `optimum-ipu`, `torchrun` or
  `accelerate launch` has its arguments parsed by that program's own parser; `make` targets must exist.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
LANGUAGES = {"python": "python", "py": "python", "bash": "bash", "shell": "bash", "sh": "bash"}
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
MARKER_KINDS = ("parse-only", "skip-run")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
BLOCK_TIMEOUT = 240  # seconds; the README's quick start trains for a few seconds
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Block:
    """One fenced code block of a markdown page."""

    page: Path
    line: int  # of the opening fence, 1-based
    language: str  # "python" or "bash"
    code: str
    marker: str | None  # the text after `docs-test:` on the line before the fence, if any

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO_ROOT)}:{self.line}"


def collect(page: Path) -> list[Block]:
    """The python and shell blocks of `page`, in order (fences of other languages are skipped whole)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, language = opening.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), len(lines))
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(previous)
        if language.lower() in LANGUAGES:
            code = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end])
            blocks.append(Block(page, i + 1, LANGUAGES[language.lower()], code, marker and marker.group(1)))
        i = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in collect(page)]


class Kernel:
    """The session's `tests/docs_kernel.py` process, and which blocks of each page it has run."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.log = open(folder / "kernel.log", "w+b")  # noqa: SIM115 - open for the kernel's life
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg"}
        # one thread: on a small machine shared with the suite's other worker, more threads than cores make the
        # quick start's training several times slower
        env["OMP_NUM_THREADS"] = "1"
        self.process = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "tests" / "docs_kernel.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            cwd=folder,
        )
        self.ran: dict[Path, list[tuple[int, bool]]] = {}  # page -> (line, passed) of the blocks run

    def ask(self, request: dict, timeout: float = BLOCK_TIMEOUT) -> dict:
        assert self.process.poll() is None, f"the docs kernel died: {self.tail()}"
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            self.process.kill()
            pytest.fail(f"no answer in {timeout} s; the kernel was stopped. Its output:\n{self.tail()}")
        reply = self.process.stdout.readline()
        assert reply, f"the docs kernel died: {self.tail()}"
        return json.loads(reply)

    def tail(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def run(self, block: Block) -> dict:
        """Runs `block`, after the page's earlier executed blocks that have not run yet."""
        ran = self.ran.setdefault(block.page, [])
        earlier = [b for b in BLOCKS if b.page == block.page and b.line < block.line and executed(b)]
        for each in earlier:
            if each.line not in {line for line, _ in ran}:
                ran.append((each.line, self._run(each)["ok"]))
        failed = [line for line, ok in ran if not ok]
        if failed:
            return {"ok": False, "output": "", "error": f"an earlier block of the page failed (lines {failed})"}
        reply = self._run(block)
        ran.append((block.line, reply["ok"]))
        return reply

    def _run(self, block: Block) -> dict:
        cwd = self.folder / re.sub(r"\W", "_", str(block.page.relative_to(REPO_ROOT)))
        cwd.mkdir(exist_ok=True)
        request = {"op": "run", "page": str(block.page), "cwd": str(cwd), "name": str(block.page)}
        return self.ask({**request, "line": block.line, "code": block.code})

    def close(self) -> None:
        self.process.kill()  # it holds nothing to save; an interpreter with torch loaded takes seconds to exit
        self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    started = Kernel(tmp_path_factory.mktemp("docs"))
    yield started
    started.close()


def executed(block: Block) -> bool:
    return block.marker is None


def checked_marker(block: Block) -> str:
    """The marker's reason; a marker of another kind, or without a reason, is an error of the page."""
    kind, _, reason = block.marker.partition(" ")
    assert kind in MARKER_KINDS, f"{block.name}: unknown docs-test marker {kind!r} (use one of {MARKER_KINDS})"
    assert reason.strip(), f"{block.name}: the docs-test marker gives no reason"
    return reason


# ------------------------------------------------------------------------------------------------------------ bash


def bash_env(folder: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(BIN.parent),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "REPO": str(REPO_ROOT),
        "HOME": os.environ.get("HOME", str(folder)),
    }


def commands(code: str) -> list[list[str]]:
    """The simple commands of a shell block as word lists (continuations joined, comments, `...` placeholders and
    leading `VAR=value` assignments dropped; `&&`, `||`, `;` and `|` split commands)."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word and set(word) <= set(";&|"):
                while words and re.match(r"^\w+=", words[0]):
                    words.pop(0)
                if words:
                    found.append(words)
                words = []
            elif word != "...":
                words.append(word)
    return found


def check_bash_names(block: Block, kernel: Kernel) -> None:
    parsed = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
    assert parsed.returncode == 0, f"{block.name}: bash -n: {parsed.stderr}"
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    for words in commands(block.code):
        if words[0] == "make":
            for target in (w for w in words[1:] if not w.startswith("-") and "=" not in w):
                assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"make {target}: no such target"
        reply = kernel.ask({"op": "command", "words": words})
        assert reply["ok"], f"{block.name}: {' '.join(words)}\n{reply['error']}"


def run_bash(block: Block, folder: Path) -> None:
    script = folder / "block.sh"
    script.write_text(block.code + "\n", encoding="utf-8")
    try:
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", str(script)],
            cwd=folder,
            env=bash_env(folder),
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.name}: still running after {BLOCK_TIMEOUT} s")
    assert done.returncode == 0, f"{block.name}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


# ----------------------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_block(block: Block, kernel: Kernel, tmp_path: Path) -> None:
    if block.marker is not None:
        checked_marker(block)
        if block.language == "python":
            reply = kernel.ask({"op": "names", "code": block.code, "name": block.name})
            assert reply["ok"], f"{block.name}: {reply['error']}"
        else:
            check_bash_names(block, kernel)
        return
    if block.language == "python":
        reply = kernel.run(block)
        assert reply["ok"], f"{block.name} failed:\n{reply['output']}\n{reply['error']}"
    else:
        run_bash(block, tmp_path)


def test_blocks_are_found_and_the_quick_start_runs():
    """The collector sees every page's blocks, the README's quick start among those that run."""
    readme = [block for block in BLOCKS if block.page.name == "README.md"]
    quick_start = [b for b in readme if b.language == "python" and "IPUTrainer(" in b.code]
    assert quick_start and executed(quick_start[0]), "the README's quick start must run"
    assert len({block.page for block in BLOCKS}) >= 8
    assert sum(executed(block) for block in BLOCKS) >= 8


def test_the_collector_reads_markers_and_skips_other_languages(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- docs-test: parse-only a long run -->\n\n```bash\nmake demo\n```\n\n"
        "```diff\n-a\n+b\n```\n\n   ```python\n   x = 1\n   ```\n",
        encoding="utf-8",
    )
    first, second = collect(page)
    assert (first.language, first.line, first.code, first.marker) == ("bash", 5, "make demo", "parse-only a long run")
    assert (second.language, second.line, second.code, second.marker) == ("python", 14, "x = 1", None)


def test_commands_split_a_shell_block_into_the_commands_it_runs():
    code = 'cd x && HF_HUB_OFFLINE=1 python run_qa.py --a 1 \\\n  --b "two words" ...  # comment\nmake demo | tee l'
    assert commands(code) == [
        ["cd", "x"],
        ["python", "run_qa.py", "--a", "1", "--b", "two words"],
        ["make", "demo"],
        ["tee", "l"],
    ]


@pytest.mark.parametrize(
    ("words", "wrong"),
    [
        (["python", "examples/question-answering/run_qa.py", "--per_device_train_batch_size", "2"], None),
        (["python", "run_qa.py", "--per_device_train_batchsize", "2"], "unrecognized arguments"),
        (["python", "run_qa.py", "--learning_rate", "fast"], "--learning_rate"),
        (["torchrun", "--nproc_per_node", "2", "run_qa.py", "--n_ipu", "2"], None),
        (["torchrun", "--nproc_per_nodes", "2", "run_qa.py"], "SystemExit"),
        (["optimum-ipu", "config", "check", "Graphcore/bert-base-ipu", "--n-ipu", "16"], None),
        (["optimum-ipu", "config", "check", "Graphcore/bert-base-ipu", "--n-ipus", "16"], "unrecognized arguments"),
        (["python", "examples/no-such-task/run.py"], "no such script"),
    ],
)
def test_a_parse_only_command_is_checked_by_its_programs_parser(words, wrong, kernel):
    """What a parse-only block's commands go through: the program's own parser, stopped before it runs."""
    reply = kernel.ask({"op": "command", "words": words})
    if wrong is None:
        assert reply == {"ok": True, "error": ""}
    else:
        assert not reply["ok"] and wrong in reply["error"], reply
