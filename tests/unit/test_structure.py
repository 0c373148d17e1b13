"""The house's shape, read from the source with `ast` (nothing is imported): no import circle
among our modules, no services/ file over its limit, no function over its limit outside the
`@triton.jit` kernels. Imports under `TYPE_CHECKING` and inside functions count: a circle hidden
there is still one in the design."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "services": "pagedserve.services",
    "shared": "pagedserve.shared",
    "kernels": "pagedserve.kernels",
}
MAX_SERVICE_FILE_LINES = 450
MAX_FUNCTION_LINES = 60


def source_files() -> dict[str, Path]:
    """Every module of ours by its import name (a package by its own name, not `__init__`)."""
    modules = {}
    for folder, package in FOLDERS.items():
        for path in sorted((CHECKOUT / folder).rglob("*.py")):
            parts = path.relative_to(CHECKOUT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name the module imports, anywhere in it; `from a import b` yields `a.b`
    (a submodule or a name in `a`: the caller keeps what is a module)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    files = source_files()
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        targets = set()
        for name in imported_names(tree, module, is_package):
            # `from a.b import c`: the edge goes to a.b.c if it is a module, else to a.b
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per tangle (strongly connected component) of more than one module."""
    return [cycle_within(graph, set(c)) for c in find_components(graph)]


def find_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def describe(graph: dict[str, set[str]], cycle: list[str]) -> str:
    """The cycle, and every other module caught in the same tangle."""
    tangle = {m for c in find_components(graph) if cycle[0] in c for m in c} - set(cycle)
    also = f"  (with {', '.join(sorted(tangle))})" if tangle else ""
    return " -> ".join(cycle) + also


def cycle_within(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside it."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        next_frontier = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    return [*paths[node], start]
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    next_frontier.append(target)
        frontier = next_frontier
    raise AssertionError(f"no cycle through {start} in its own component")


def is_triton_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(ast.unparse(d).startswith(("triton.jit", "jit")) for d in node.decorator_list)


def long_functions() -> Iterator[str]:
    for path in source_files().values():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = node.end_lineno - first + 1
            if length > MAX_FUNCTION_LINES and not is_triton_kernel(node):
                yield f"{path.relative_to(CHECKOUT)}:{node.name}:{length}"


def test_the_module_graph_has_no_cycle():
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import circles:\n" + "\n".join(describe(graph, c) for c in cycles)


def test_no_services_file_is_over_its_limit():
    too_long = [
        f"{path.relative_to(CHECKOUT)}:{num_lines}"
        for path in sorted((CHECKOUT / "services").rglob("*.py"))
        if (num_lines := len(path.read_text().splitlines())) > MAX_SERVICE_FILE_LINES
    ]
    assert not too_long, f"services/ files over {MAX_SERVICE_FILE_LINES} lines: {too_long}"


def test_no_function_is_over_its_limit():
    too_long = sorted(long_functions())
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(too_long)


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function():
    """The checker itself: a circle closed only by an import inside a function is found."""
    a = ast.parse("import pagedserve.shared.b\n")
    b = ast.parse("def f():\n    from pagedserve.shared import a\n")
    graph = {
        "pagedserve.shared.a": set(imported_names(a, "pagedserve.shared.a", False)),
        "pagedserve.shared.b": set(imported_names(b, "pagedserve.shared.b", False)),
    }
    graph = {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}
    assert find_cycles(graph) == [
        ["pagedserve.shared.a", "pagedserve.shared.b", "pagedserve.shared.a"]
    ]


GENERIC_WORKER_FOLDERS = ("services/gpu_worker/layers", "services/gpu_worker/models")
DEVICE_NAMES = {"cpu", "cuda"}


def device_branches(tree: ast.Module) -> Iterator[int]:
    """Lines that compare something with a device name or read a device's `.type` / `.is_cuda`
    in a test: the branches an op's forms and the platform seam exist to replace."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value in DEVICE_NAMES for o in operands):
                yield node.lineno
        if isinstance(node, ast.If | ast.IfExp) and any(
            isinstance(n, ast.Attribute) and n.attr in ("is_cuda", "is_cpu")
            for n in ast.walk(node.test)
        ):
            yield node.lineno


def test_no_generic_layer_or_model_branches_on_the_device():
    """Layers and models choose nothing by device: ops pick their CPU or CUDA form once at
    load (`layers/custom_op.py`, which alone maps device types to forms), the platform seam
    the rest."""
    found = [
        f"{path.relative_to(CHECKOUT)}:{line}"
        for folder in GENERIC_WORKER_FOLDERS
        for path in sorted((CHECKOUT / folder).rglob("*.py"))
        if path.name != "custom_op.py"
        for line in device_branches(ast.parse(path.read_text()))
    ]
    assert not found, f"device branches in generic worker code: {found}"


def test_the_device_branch_finder_finds_one():
    tree = ast.parse("if x.device.type == 'cuda':\n    pass\ny = 1 if t.is_cuda else 2\n")
    assert list(device_branches(tree)) == [1, 3]
