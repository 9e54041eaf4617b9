"""The import graph of gpuprov/, read with `ast` (no module is imported): no circle anywhere, and
every import points down the layers written once in docs/design.md (between its `layers`
markers). Imports inside functions count; `from X import y` is an import of X.y where y is a
module; relative imports are resolved; importing a.b.c also runs a.b (a package's
``__init__``), so it counts as an import of a.b too, unless the importer lives inside a.b.
An import under ``if TYPE_CHECKING:`` never runs: it is held to the layer order, not counted
in circles. An import inside a function carries the comment ``# lazy: CLI start-up``. The command
registry's rows (gpuprov/cli/registry.py's ``COMMANDS``: each the dotted name of the module a
command imports when it runs) are imports of the registry."""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpuprov"
DESIGN = ROOT / "docs" / "design.md"
LAZY_COMMENT = "# lazy: CLI start-up"
REGISTRY = "gpuprov.cli.registry"
# Files whose function-level imports are being rewritten elsewhere, each with its reason.
LAZY_PENDING = {
    "gpuprov/providers/static/__init__.py": "the hosts-file reader is being rewritten (issue 31 item 3)",
}


def layers(text: str) -> list[tuple[str, list[str]]]:
    """[(layer, [path patterns])] from the top (the CLI) down, as docs/design.md writes them."""
    block = re.search(r"<!-- layers: begin -->\n(.*?)<!-- layers: end -->", text, re.S)
    assert block, "docs/design.md has no <!-- layers: begin/end --> block"
    return [(line.split()[0], line.split()[1:]) for line in block.group(1).splitlines() if line.strip()]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def layer_of(name: str, table: list[tuple[str, list[str]]]) -> int | None:
    """The layer whose pattern matches the module most closely: a file the table names is in that
    file's layer, though a folder of another layer holds it (gpuprov/lock/stack_choice.py)."""
    rel = str(MODULES[name].relative_to(ROOT))
    found = [(len(pattern), i) for i, (_, patterns) in enumerate(table) for pattern in patterns
             if (rel.startswith(pattern) if pattern.endswith("/") else fnmatch.fnmatchcase(rel, pattern))]
    return max(found)[1] if found else None


def _known(name: str) -> str:
    while name not in MODULES:
        name = name.rsplit(".", 1)[0]
    return name


def registered(tree: ast.Module) -> list[tuple[str, int]]:
    """(module, line) for each row of the command registry's ``COMMANDS`` table."""
    rows = []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and "COMMANDS" in ast.unparse(
                node.targets[0] if isinstance(node, ast.Assign) else node.target):
            rows += [(value.value, value.lineno) for table in ast.walk(node) if isinstance(table, ast.Dict)
                     for value in table.values if isinstance(value, ast.Constant) and isinstance(value.value, str)]
    return rows


def imports(name: str) -> list[tuple[str, int, bool, bool]]:
    """(gpuprov module imported, line, inside a function, under TYPE_CHECKING) for each import."""
    found: list[tuple[str, int, bool, bool]] = []

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:
            here = name.split(".") if is_package(name) else name.split(".")[:-1]
            here = here[: len(here) - node.level + 1]
            base = ".".join(here + ([node.module] if node.module else []))
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]

    def walk(node: ast.AST, in_function: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in targets(child):
                    if target == "gpuprov" or target.startswith("gpuprov."):
                        found.append((_known(target), child.lineno, in_function, type_only))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                 type_only or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)))

    tree = ast.parse(MODULES[name].read_text())
    walk(tree, False, False)
    if name == REGISTRY:
        found += [(_known(module), line, False, False) for module, line in registered(tree)]
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    out = []
    for target, line, in_function, type_only in found:
        # Importing a.b.c runs a.b's __init__ first: an import of that package too.
        parts = target.split(".")
        for i in range(2, len(parts)):
            package = ".".join(parts[:i])
            if package in MODULES and package not in ancestors and package != name:
                out.append((package, line, in_function, type_only))
        if target != name:
            out.append((target, line, in_function, type_only))
    return out


def graph(with_type_only: bool = False) -> dict[str, set[str]]:
    return {m: {t for t, _, _, type_only in imports(m) if with_type_only or not type_only} for m in MODULES}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_sees_imports_inside_functions_and_packages() -> None:
    """The reader itself: a function-level import, a relative one, `from pkg import module` and
    the package a dotted import runs are all edges (so a circle hidden by them is found)."""
    edges = graph()
    assert "gpuprov.cluster" in edges["gpuprov.cli.app"]  # imported inside the `up` command
    assert "gpuprov.core.up" in edges[REGISTRY]  # a row of the command registry
    assert "gpuprov.core" in edges[REGISTRY]  # gpuprov.core.up runs gpuprov/core/__init__
    assert "gpuprov.settings" in edges["gpuprov.core.up_steps"]  # from gpuprov import settings
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    table = layers(DESIGN.read_text())  # a file the table names, in a folder of another layer
    assert [table[layer_of(m, table)][0] for m in ("gpuprov.lock.stack", "gpuprov.lock.stack_choice")] == [
        "records", "leaves"]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_circle_anywhere() -> None:
    found = circles(graph())
    assert found == [], "import circles (each a strongly connected component):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_imports_point_down_the_layers() -> None:
    table = layers(DESIGN.read_text())
    assert table[0][0] == "cli" and len({n for n, _ in table}) == len(table)
    unplaced = sorted(m for m in MODULES if layer_of(m, table) is None)
    assert unplaced == [], f"modules in no layer of docs/design.md: {unplaced}"
    upward = []
    for name in sorted(MODULES):
        mine = layer_of(name, table)
        for target, line, _, _ in imports(name):
            theirs = layer_of(target, table)
            if mine is not None and theirs is not None and theirs < mine:
                upward.append(f"{MODULES[name].relative_to(ROOT)}:{line}: {name} ({table[mine][0]}) "
                              f"imports {target} ({table[theirs][0]})")
    assert upward == [], "imports against the layer order of docs/design.md:\n" + "\n".join(upward)


def test_health_and_pull_never_import_the_commands() -> None:
    edges = graph(with_type_only=True)
    found = sorted(f"{m} -> {t}" for m in MODULES if m.startswith(("gpuprov.health", "gpuprov.pull"))
                   for t in edges[m] if t == "gpuprov.core" or t.startswith("gpuprov.core."))
    assert found == []


def test_the_commands_package_hands_nothing_on() -> None:
    """gpuprov/core/__init__.py imports nothing: the CLI's registry imports each command module."""
    tree = ast.parse((PACKAGE / "core" / "__init__.py").read_text())
    assert [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))] == []


def test_an_import_inside_a_function_says_why() -> None:
    unexplained = []
    for name, path in sorted(MODULES.items()):
        rel = str(path.relative_to(ROOT))
        if rel in LAZY_PENDING:
            continue
        lines = path.read_text().splitlines()
        for _, line, in_function, type_only in imports(name):
            if in_function and not type_only and LAZY_COMMENT not in lines[line - 1]:
                unexplained.append(f"{rel}:{line}: {lines[line - 1].strip()}")
    assert unexplained == [], (f"imports inside functions without `{LAZY_COMMENT}` (move them to the top, "
                               "or say why start-up needs them there):\n" + "\n".join(sorted(set(unexplained))))
