"""DESIGN.md's one-way imports: each layer imports only the layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "optimum_ipu"
# top to bottom; a module may import its own layer and the ones after it
ORDER = ["cli", "benchmark", "trainer", "pipelines", "packing", "models", "runtime", "config"]


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "optimum_ipu" or len(parts) < 2:
        return None
    head = parts[1]
    return (
        "config"
        if head in ("config", "config_schema", "config_validation", "config_hub", "topology", "errors", "files")
        else head
    )


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                found.add(node.module)
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_down_only(path):
    own = layer_of("optimum_ipu." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    if own not in ORDER:
        return  # the package's __init__ re-exports lazily
    for module in imported_modules(path):
        target = layer_of(module)
        if target in ORDER:
            assert ORDER.index(target) >= ORDER.index(own), f"{path.name} ({own}) imports {module} ({target})"
    if own == "config":
        assert not any(m.split(".")[0] == "torch" for m in imported_modules(path)), f"{path.name} imports torch"


def test_the_library_imports_without_matplotlib():
    """Only the command draws (matplotlib): the library imports without it."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "import optimum_ipu.trainer, optimum_ipu.pipelines, optimum_ipu.packing, optimum_ipu.models, optimum_ipu.cli\n"
        "from optimum_ipu import IPUTrainer, pipeline, to_pipelined\n"
        "print('ok')"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_the_command_draws_and_shows_progress(path):
    if path.relative_to(PACKAGE).parts[0] in ("cli", "benchmark"):
        return  # the command and its benchmark harness
    drawn = {m for m in imported_modules(path) if m.split(".")[0] in ("matplotlib", "tqdm")}
    assert not drawn, f"{path.name} imports {drawn}: only optimum_ipu/cli/ and its benchmark draw and show progress"
