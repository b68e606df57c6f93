"""What the README tells a newcomer to run, for `.ci/install_checks.sh wheel`.

    python .ci/readme_blocks.py python          # the first ```python block of the "## Quick start" section
    python .ci/readme_blocks.py pip WHEEL       # what the README's `pip install` lines install, one a line

`pip`: the `pip install` commands of the "## Install..." and "## Quick start" sections (in shell blocks, or in inline
code such as "installed by `pip install X`"), the package itself (`optimum-ipu[extras]`, `.[extras]`, `-e .`, a
built `*.whl`) replaced by WHEEL with the same extras. torch is left
out (CI installs the CPU wheel found on local disk first), and so are lines that need a network other than the
package registry (`--index-url`, git URLs); options are dropped. A section is found by its heading's start
(case-insensitive), and ends at the next heading of its level or above.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^(```|~~~)\s*([\w+-]*)")
SHELLS = ("bash", "sh", "shell", "console", "")
OWN_NAMES = ("optimum-ipu", "optimum_ipu", ".")
VALUE_OPTIONS = (
    "-c",
    "--constraint",
    "-r",
    "--requirement",
    "-f",
    "--find-links",
    "--extra-index-url",
    "-t",
    "--target",
)


def section(text: str, heading: str) -> str:
    """The lines under the first `## ` heading that starts with `heading`, up to the next `#`/`##` heading."""
    lines, found, out, fenced = text.splitlines(), False, [], False
    for line in lines:
        fenced ^= bool(FENCE.match(line))
        if not found:
            found = line.lower().startswith(f"## {heading.lower()}")
            continue
        if not fenced and re.match(r"^#{1,2} ", line):
            break
        out.append(line)
    return "\n".join(out)


def blocks(text: str, languages: tuple[str, ...]) -> list[str]:
    """The fenced code blocks of `text` whose language is one of `languages`, in order."""
    found, current, language = [], None, None
    for line in text.splitlines():
        match = FENCE.match(line)
        if current is None and match:
            current, language = [], match.group(2).lower()
        elif current is not None and line.strip() in ("```", "~~~"):
            if language in languages:
                found.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    return found


def quick_start(readme: str) -> str:
    code = blocks(section(readme, "Quick start"), ("python", "py"))
    if not code:
        raise SystemExit(f'{README.name}: no ```python block under a "## Quick start" heading')
    return code[0]


def _own(requirement: str) -> tuple[bool, str]:
    """Whether `requirement` names this package (by name, a clone's folder or a built wheel) and its `[extras]`."""
    match = re.fullmatch(r"(.+?)(\[[\w,\s-]+\])?", requirement)
    if match is None or not (match.group(1).lower() in OWN_NAMES or match.group(1).endswith(".whl")):
        return False, ""
    return True, (match.group(2) or "").replace(" ", "")


def pip_commands(readme: str) -> list[list[str]]:
    """The words after `install` of each `pip install` command of the shell blocks of the install sections."""
    text = "\n".join(section(readme, name) for name in ("Install", "Quick start"))
    commands = []
    inline = re.findall(r"`([^`\n]*pip install [^`\n]*)`", text)  # "... installed by `pip install X`"
    for block in [*blocks(text, SHELLS), *inline]:
        for line in block.replace("\\\n", " ").splitlines():
            for command in re.split(r"&&|;|\|\|", line.split(" #")[0]):
                words = shlex.split(command.strip().removeprefix("$ "))
                if "pip" in words and "install" in words[words.index("pip") :]:
                    commands.append(words[words.index("install", words.index("pip")) + 1 :])
    return commands


def pip_requirements(readme: str, wheel: str) -> list[str]:
    """What the README's `pip install` lines install, this package as `wheel` (see the module docstring)."""
    requirements: list[str] = []
    for words in pip_commands(readme):
        if "--index-url" in words or any(w.startswith(("git+", "http")) for w in words):
            continue  # another index (a CUDA or CPU torch build) or a URL: not reachable in CI
        skip_next = False
        for word in words:
            own, extras = _own(word)
            if skip_next or word.startswith("-"):
                skip_next = word in VALUE_OPTIONS
            elif own and f"{wheel}{extras}" not in requirements:
                requirements.append(f"{wheel}{extras}")
            elif not own and not re.match(r"torch\b", word) and word not in requirements:
                requirements.append(word)
    if not any(r.startswith(wheel) for r in requirements):
        requirements.insert(0, wheel)  # the README may name the package as a clone's folder only
    return requirements


def main(argv: list[str]) -> None:
    readme = README.read_text(encoding="utf-8")
    if argv[:1] == ["python"]:
        sys.stdout.write(quick_start(readme))
    elif argv[:1] == ["pip"] and len(argv) == 2:
        print("\n".join(pip_requirements(readme, argv[1])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
