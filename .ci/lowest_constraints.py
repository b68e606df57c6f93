"""Print pip constraints that pin the package's dependencies to the lowest versions pyproject.toml allows.

    python .ci/lowest_constraints.py [EXTRA_PACKAGE ...] > lowest.txt

Every dependency of `[project] dependencies` with a lower bound (`>=X`) becomes `name==X`, and so does each
EXTRA_PACKAGE named (looked up in the optional dependencies, e.g. `datasets`). torch is left out: CI installs the
CPU wheel found on local disk (torch==2.13.0) first, as the Makefile does. A dependency without a lower bound is
an error: a bound that is never tested is not declared.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
NOT_PINNED = {"torch"}  # installed before, from the wheel on local disk
# Pinned with a package pinned low: its own lowest dependency, where the newest release breaks it without saying so.
# pyarrow: datasets 3.0.0 requires pyarrow>=15.0.0, and pyarrow's newest releases import only with numpy 2 (undeclared).
WITH = {"datasets": ["pyarrow==15.0.0"]}


def lowest(requirement: Requirement) -> str:
    """The version of the `>=` specifier of `requirement` (the lowest it allows)."""
    lows = [spec.version for spec in requirement.specifier if spec.operator in (">=", "==")]
    if len(lows) != 1:
        raise SystemExit(f"{requirement}: no single lower bound (>=X) to test")
    return lows[0]


def constraints(extra_packages: list[str]) -> list[str]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    core = [Requirement(text) for text in project["dependencies"]]
    optional = [Requirement(text) for texts in project["optional-dependencies"].values() for text in texts]
    chosen = [r for r in core if r.name not in NOT_PINNED]
    for name in extra_packages:
        found = [r for r in optional if r.name == name]
        if not found:
            raise SystemExit(f"{name}: not in any extra of {PYPROJECT.name}")
        chosen.append(found[0])
    pins = [f"{r.name}=={lowest(r)}" for r in chosen]
    return pins + [pin for r in chosen for pin in WITH.get(r.name, [])]


if __name__ == "__main__":
    print("\n".join(constraints(sys.argv[1:])))
