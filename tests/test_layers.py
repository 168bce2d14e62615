"""The layer map as a test: the import graph of `src/metrale`, read with `ast` (no imports run),
has no cycle and no import that points up the layer order.

An import under `if TYPE_CHECKING:` never runs and does not count. An import inside a function
does: deferring it (to keep start-up fast, or an extra optional) changes when its cost is paid,
not that the module depends on the other, so a circle closed by a deferred import is a circle.

The order, top first, is the one in docs/architecture.md: cli > matrix > runner > benchmarks >
rollout > agent > plugin > sandbox_sim > runtime > endpoint > neutral.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: Top first. A module belongs to the first layer whose prefix names it (or its package).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cli", ("metrale.cli", "metrale.__main__")),
    ("matrix", ("metrale.matrix",)),
    (
        "runner",
        (
            "metrale.runner",
            "metrale.rundir",
            "metrale.resume",
            "metrale.budgets",
            "metrale.live",
            "metrale.telemetry",
        ),
    ),
    ("benchmarks", ("metrale.benchmarks",)),
    ("rollout", ("metrale.rollout",)),
    ("agent", ("metrale.agent",)),
    ("plugin", ("metrale.plugin",)),
    ("sandbox_sim", ("metrale.sandbox_sim",)),
    ("runtime", ("metrale.runtime",)),
    ("endpoint", ("metrale.endpoint",)),
    (
        "neutral",
        (
            "metrale.stats",
            "metrale.fmt",
            "metrale.bounds",
            "metrale.table",
            "metrale.errors",
            "metrale.net",
            "metrale.datasets",
            "metrale.entry",
            "metrale.prefix",
            "metrale.backoff",
            "metrale",  # the package itself: its version only
        ),
    ),
)


def layer_of(module: str) -> int:
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != "metrale" and module.startswith(prefix + ".")):
                return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time(body: list[ast.stmt], deferred: bool) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run: at the top level and in any block, except under `if TYPE_CHECKING:`;
    with `deferred`, those inside functions too."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            found += _run_time(node.orelse, deferred)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            if deferred:
                found += _run_time(node.body, deferred)  # type: ignore[arg-type]
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(node, field, None)
                if isinstance(block, list):
                    found += _run_time([b for b in block if isinstance(b, ast.AST)], deferred)
    return found


def imports_of(
    module: str, tree: ast.Module, known: set[str], is_package: bool, deferred: bool = True
) -> set[str]:
    """The metrale modules `module` imports at import time (`from pkg import name` counts as
    `pkg.name` when that is a module, else as `pkg`)."""
    package = module if is_package else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in _run_time(tree.body, deferred):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            names = [
                f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem
                for alias in node.names
            ]
        targets |= {n for n in names if n == "metrale" or n.startswith("metrale.")}
    resolved = set()
    for name in targets:  # `import metrale.a.b` of a name that is not a module: its package
        while name not in known and "." in name:
            name = name.rpartition(".")[0]
        if name != module:
            resolved.add(name)
    return resolved


def import_graph(root: Path = SRC, deferred: bool = True) -> dict[str, set[str]]:
    """Module -> the metrale modules it imports. `deferred` counts imports inside functions:
    deferring an import changes when its cost is paid, not that the module depends on it, so a
    circle closed by a deferred import is still a circle."""
    paths = sorted((root / "metrale").rglob("*.py"))
    names = {module_name(p, root): p for p in paths}
    known = set(names)
    return {
        name: imports_of(
            name, ast.parse(path.read_text()), known, path.name == "__init__.py", deferred
        )
        for name, path in names.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the list of modules around it, or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def all_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (each holds a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return groups


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) < layer_of(module):
                found.append(
                    f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
                    f"({LAYERS[layer_of(target)][0]})"
                )
    return found


def test_every_module_has_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


def test_no_import_cycle() -> None:
    groups = all_cycles(import_graph())
    assert not groups, "import cycles among: " + "; ".join(", ".join(g) for g in groups)


def test_no_import_up_the_layers() -> None:
    found = upward_imports(import_graph())
    assert not found, "imports up the layer order:\n" + "\n".join(found)


def test_matrix_reads_only_the_summary_and_the_declarations() -> None:
    """matrix works from files: the plugin contract (summary, declared metrics) and neutral
    helpers, never the rollout engine's internals nor a runtime or an endpoint."""
    graph = import_graph()
    allowed = {"matrix", "runner", "plugin", "neutral"}
    found = [
        f"{m} imports {t}"
        for m, targets in sorted(graph.items())
        if m.startswith("metrale.matrix")
        for t in sorted(targets)
        if LAYERS[layer_of(t)][0] not in allowed
    ]
    assert not found, "\n".join(found)


# The checker itself: it must see what it claims to see.


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_checker_sees_a_cycle_through_relative_and_from_imports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "metrale/__init__.py": "",
            "metrale/rollout/__init__.py": "",
            "metrale/rollout/pool.py": "from metrale.rollout import warm\n",
            "metrale/rollout/warm.py": "from .pool import run\n",
        },
    )
    graph = import_graph(root)
    assert find_cycle(graph) is not None
    assert all_cycles(graph) == [["metrale.rollout.pool", "metrale.rollout.warm"]]


def test_checker_ignores_type_checking_but_counts_deferred_imports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "metrale/__init__.py": "",
            "metrale/fmt.py": "",
            "metrale/table.py": "",
            "metrale/cli.py": "import metrale.fmt\n",
            "metrale/stats.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from metrale.cli import x\n"
                "class C:\n    def f(self):\n        from metrale import table\n"
            ),
        },
    )
    assert import_graph(root)["metrale.stats"] == {"metrale.table"}
    assert import_graph(root, deferred=False)["metrale.stats"] == set()
    assert import_graph(root)["metrale.cli"] == {"metrale.fmt"}
    assert upward_imports(import_graph(root)) == []


def test_checker_sees_an_import_up_the_order(tmp_path: Path) -> None:
    files = {
        "metrale/__init__.py": "",
        "metrale/rollout/__init__.py": "",
        "metrale/plugin/__init__.py": "",
        "metrale/plugin/results.py": "from metrale.rollout import thing\n",
    }
    found = upward_imports(import_graph(_tree(tmp_path, files)))
    assert found == ["metrale.plugin.results (plugin) imports metrale.rollout (rollout)"]


def test_checker_allows_an_import_down_the_order(tmp_path: Path) -> None:
    files = {
        "metrale/__init__.py": "",
        "metrale/endpoint/__init__.py": "",
        "metrale/runtime/__init__.py": "",
        "metrale/runtime/base.py": "import metrale.endpoint\n",
    }
    assert upward_imports(import_graph(_tree(tmp_path, files))) == []
