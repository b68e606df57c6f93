"""Every vendored notebook is registered once, docs/migrating.md's table is the registry's, and what the registry
says of a notebook holds: stand-ins only where it runs with stand-ins, "does not apply" only where its code drives
the IPU itself."""

from __future__ import annotations

from collections import Counter

from ..conftest import REPO_ROOT
from .registry import BY_PATH, NOT_APPLICABLE, NOTEBOOKS, NOTEBOOKS_DIR, RUNS, STAND_INS, markdown_table
from .runner import code_cells

IPU_ONLY = ("poptorch", "gc-monitor")


def test_every_notebook_is_registered_once():
    vendored = {str(path.relative_to(NOTEBOOKS_DIR)) for path in NOTEBOOKS_DIR.rglob("*.ipynb")}
    assert len(vendored) == 33  # Optimum Graphcore's notebooks/ @ b8cd6e09
    assert Counter(n.path for n in NOTEBOOKS) == Counter(vendored)


def test_statuses_say_what_runs():
    for notebook in NOTEBOOKS:
        code = "\n".join(code_cells(NOTEBOOKS_DIR / notebook.path))
        if notebook.status == RUNS:
            assert not notebook.replace, f"{notebook.path}: a notebook with stand-ins is '{STAND_INS}'"
        if notebook.status == STAND_INS:
            assert notebook.replace, f"{notebook.path}: no stand-in, so it '{RUNS}'"
        if notebook.status == NOT_APPLICABLE:
            assert any(word in code for word in IPU_ONLY), f"{notebook.path}: its code does not drive an IPU"


def test_the_docs_table_is_the_registry():
    docs = (REPO_ROOT / "docs" / "migrating.md").read_text()
    assert markdown_table() in docs, (
        "docs/migrating.md's notebook table: paste tests.notebooks.registry.markdown_table()"
    )
    counts = Counter(n.status for n in BY_PATH.values())
    summary = ", ".join(f"{counts[status]} {status}" for status in sorted(counts))
    assert summary in docs, f"the counts under the table: {summary}"
