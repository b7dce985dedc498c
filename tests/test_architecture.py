"""The import structure of the core: `plugins/` depends on torch (and, for its fast paths, triton)
only, and its modules import one way — no cycle, counting imports inside functions, which can
hide a cycle from the interpreter but not from a reader."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = "plugins"
FRAMEWORKS = ("fairseq", "transformers", "hf_momentum", "fairseq_momentum", "recipes", "accelerate")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """Absolute names a `from ... import ...` refers to: the module, and each imported name that
    may itself be a submodule."""
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def core_imports() -> dict[str, set[str]]:
    """Every module under plugins/ and the absolute module names it imports (anywhere in it)."""
    graph = {}
    for path in sorted((ROOT / CORE).rglob("*.py")):
        name = _module_name(path)
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                found |= set(_resolve(name, path.name == "__init__.py", node))
        graph[name] = found
    return graph


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def module_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges between core modules. A package's __init__ re-exporting its children is not a
    dependency of the children on the package: only edges into a package from outside it count."""
    edges = {}
    for module, imported in graph.items():
        targets = {t for t in imported if t in graph and t != module}
        edges[module] = {t for t in targets if not t.startswith(module + ".")}
    return edges


def test_core_imports_no_framework():
    offenders = {m: sorted(i for i in imps if i.split(".")[0] in FRAMEWORKS)
                 for m, imps in core_imports().items()}
    offenders = {m: i for m, i in offenders.items() if i}
    assert not offenders, f"plugins/ must stay framework-neutral: {offenders}"


def test_core_modules_import_one_way():
    graph = core_imports()
    assert len(graph) > 20
    cycles = _cycles(module_edges(graph))
    assert not cycles, f"import cycles inside plugins/: {cycles}"


def test_the_cycle_check_finds_a_cycle():
    """The check itself can fail: two modules importing each other (even inside a function) form
    a cycle, and a package importing its own children does not."""
    graph = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p"}}
    assert _cycles(module_edges(graph)) == [["p.a", "p.b"]]
    graph = {"p": {"p.a", "p.b"}, "p.a": {"p.b"}, "p.b": set()}
    assert _cycles(module_edges(graph)) == []
