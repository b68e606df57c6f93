"""The package's imports form no circle and go one way, down the layers of the design ("Layers" in DESIGN.md).

The graph is read from the source with `ast`: every `import` and `from ... import` of an `optimum_ipu` module,
at module level and inside functions (`TYPE_CHECKING` blocks included), and every `importlib.import_module` of a
literal name, so that a circle cut with a late import still shows. The lazy attributes of a package's
`__getattr__` (`optimum_ipu.AutoModel...`, named in a table) are not imports here. Importing `a.b.c` runs the
packages `a` and `a.b` first; those implied edges are left out, as import tools leave them out (each package
would otherwise be a circle with its modules).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "optimum_ipu"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# DESIGN.md's layers, bottom to top: a module imports from its own layer and those below it, never from above.
# The files at the top of the package that DESIGN.md does not draw go where their imports put them: the helpers
# that `config` itself uses (`errors`, `files`) and the pure-Python `topology` with `config`; Optimum Graphcore's
# `modeling_utils` (helpers over `to_pipelined`) with `models`, and the package itself (`optimum_ipu`: `IPUConfig`
# and the plan registry's names, the rest lazily) with `models` too.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("config", ("config", "config_hub", "config_schema", "config_validation", "errors", "files", "topology")),
    ("runtime", ("runtime",)),
    ("models", ("models", "modeling_utils", "")),
    ("packing", ("packing", "data")),  # `data`: Optimum Graphcore's path to the pretraining collators
    ("pipelines", ("pipelines", "diffusers")),  # `diffusers`: Optimum Graphcore's path to the Stable Diffusion ones
    ("trainer", ("trainer",)),
    ("serving", ("serving",)),  # the HTTP front: calls pipelines, never the trainer
    ("benchmark", ("benchmark",)),
    ("cli", ("cli",)),
)


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name -> (file, whether it is a package's `__init__`)."""
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of a relative import of `name` at `level` dots, made in `module`."""
    if not level:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([name] if name else [])])


def _imported(node: ast.AST, module: str, is_package: bool, modules: dict) -> list[str]:
    """The package's modules a statement imports: `from x import y` reads `x.y` where `y` is a module, else `x`;
    `importlib.import_module("...")` with a literal name counts as an import too."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        target = _resolve(module, is_package, node.level, node.module)
        return [f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target for alias in node.names]
    if (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        name = node.args[0].value
        level = len(name) - len(name.lstrip("."))
        return [_resolve(module, is_package, level, name.lstrip(".") or None)]
    return []


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its file."""
    modules = _modules()
    graph = {}
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[module] = {
            name
            for node in ast.walk(tree)
            for name in _imported(node, module, is_package, modules)
            if name in modules and name != module
        }
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, and the modules that import themselves
    (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_of(module: str) -> int:
    """The index in `LAYERS` of a module (by the first name under `optimum_ipu`)."""
    top = module.split(".")[1] if "." in module else ""
    for rank, (_, tops) in enumerate(LAYERS):
        if top in tops:
            return rank
    raise AssertionError(f"{module} is in no layer of LAYERS: place it (DESIGN.md, 'Layers')")


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert "optimum_ipu.models.generation" in graph["optimum_ipu.models.pipelined"]
    assert "optimum_ipu.models.families" in graph["optimum_ipu.models.plans"]  # a function-level import
    assert "optimum_ipu.config" in graph["optimum_ipu.topology"]  # a TYPE_CHECKING import
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"a"}}) == [["a"]]


def test_the_package_imports_no_circle():
    cycles = _cycles(import_graph())
    assert not cycles, "import circles (move the code to the module where it belongs): " + "; ".join(
        " <-> ".join(cycle) for cycle in cycles
    )


def test_no_module_imports_from_a_higher_layer():
    names = [name for name, _ in LAYERS]
    upward = [
        f"{module} ({names[layer_of(module)]}) imports {other} ({names[layer_of(other)]})"
        for module, imported in sorted(import_graph().items())
        for other in sorted(imported)
        if layer_of(other) > layer_of(module)
    ]
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def _distributed_imports(path: Path) -> list[str]:
    """The imports of `torch.distributed` (or anything under it) in a file, as `line: statement`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            names = [f"{module}.{alias.name}" for alias in node.names]
        if any(name == "torch.distributed" or name.startswith("torch.distributed.") for name in names):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_runtime_imports_torch_distributed():
    """Collectives live in `runtime/` (DESIGN.md): the trainer, models, pipelines and the rest call its functions."""
    outside = {
        str(path.relative_to(ROOT)): hits
        for path in sorted(ROOT.rglob("*.py"))
        if path.relative_to(ROOT).parts[0] != "runtime" and (hits := _distributed_imports(path))
    }
    assert not outside, f"torch.distributed imported outside optimum_ipu/runtime/: {outside}"
    # the check reads what it should: the runtime's own imports are found
    assert _distributed_imports(ROOT / "runtime" / "distributed.py")


def test_the_server_reaches_models_only_through_pipelines():
    """DESIGN.md: the server is a thin front; nothing about models, layouts or training lives in `serving/`."""
    below = ("optimum_ipu.models", "optimum_ipu.runtime", "optimum_ipu.trainer", "optimum_ipu.packing")
    reached = [
        f"{module} imports {other}"
        for module, imported in sorted(import_graph().items())
        if module.startswith("optimum_ipu.serving")
        for other in sorted(imported)
        if other.startswith(below)
    ]
    assert not reached, "serving/ imports past the pipelines:\n" + "\n".join(reached)
    assert any(other.startswith("optimum_ipu.pipelines") for other in import_graph()["optimum_ipu.serving.app"])
