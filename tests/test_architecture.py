"""The import structure of the core: `plugins/` depends on torch (and, for its fast paths, triton)
only, and its modules import one way — no cycle, counting imports inside functions, which can
hide a cycle from the interpreter but not from a reader."""
import ast
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = "plugins"
FRAMEWORKS = ("fairseq", "transformers", "hf_momentum", "fairseq_momentum", "recipes", "accelerate")
# Third-party packages the core may import: torch everywhere, triton only in its kernel modules.
THIRD_PARTY = {"torch", "triton"}


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


def _imports(nodes, module: str, is_package: bool) -> set[str]:
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= set(_resolve(module, is_package, node))
    return found


def _module_level(tree: ast.Module):
    """The nodes run when the module is imported: all but the bodies of functions."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))


def core_imports(module_level_only: bool = False) -> dict[str, set[str]]:
    """Every module under plugins/ and the absolute module names it imports (anywhere in it, or
    only those imported when the module itself is)."""
    graph = {}
    for path in sorted((ROOT / CORE).rglob("*.py")):
        name, tree = _module_name(path), ast.parse(path.read_text())
        nodes = _module_level(tree) if module_level_only else ast.walk(tree)
        graph[name] = _imports(nodes, name, path.name == "__init__.py")
    return graph


def non_torch_imports(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Per module, what it imports beyond the standard library, torch, triton and plugins/."""
    allowed = set(sys.stdlib_module_names) | THIRD_PARTY | {CORE}
    offenders = {m: sorted(i for i in imps if i.split(".")[0] not in allowed) for m, imps in graph.items()}
    return {m: i for m, i in offenders.items() if i}


def triton_on_import(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Modules that load triton when they are imported (directly or through core modules they
    import at module level), each with the chain that does it."""
    chains = {}

    def chain(module, seen):
        if module in chains:
            return chains[module]
        for imported in sorted(graph[module]):
            if imported.split(".")[0] == "triton":
                return [module, imported]
            if imported in graph and imported not in seen:
                found = chain(imported, seen | {imported})
                if found:
                    return [module] + found
        return None

    for module in graph:
        chains[module] = chain(module, {module})
    return {m: c for m, c in chains.items() if c}


def _kernel_module(module: str) -> bool:
    """A module of Triton kernels (plugins/*/triton/*, *_triton.py, triton_*.py): it may import
    triton when it is imported, as the modules that use it import it lazily, after checking
    that triton is installed."""
    *package, leaf = module.split(".")
    return "triton" in package[1:] or leaf.endswith("_triton") or leaf.startswith("triton_")


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


def test_core_imports_only_torch():
    """No matplotlib, numpy or any other third-party package anywhere in plugins/, not even
    inside a function."""
    offenders = non_torch_imports(core_imports())
    assert not offenders, f"plugins/ imports only the standard library, torch and triton: {offenders}"


def test_core_imports_triton_only_on_demand():
    """Importing a core module never loads triton: only the kernel modules import it at module
    level, and everything else reaches them inside functions."""
    chains = triton_on_import(core_imports(module_level_only=True))
    offenders = {m: c for m, c in chains.items() if not _kernel_module(m)}
    assert not offenders, f"these modules load triton when imported: {offenders}"


def test_the_import_checks_find_offenders():
    """The checks themselves can fail: a plotting import inside a function, and triton reached
    at module level through another core module."""
    tree = ast.parse("import torch\nimport os\ndef draw():\n    from matplotlib.figure import Figure\n")
    assert _imports(ast.walk(tree), "plugins.m", False) == {"torch", "os", "matplotlib.figure",
                                                            "matplotlib.figure.Figure"}
    assert _imports(_module_level(tree), "plugins.m", False) == {"torch", "os"}
    graph = {"plugins.m": {"torch", "os", "matplotlib.figure"}, "plugins.n": {"triton.language"}}
    assert non_torch_imports(graph) == {"plugins.m": ["matplotlib.figure"]}
    graph = {"plugins.a": {"plugins.b"}, "plugins.b": {"plugins.k_triton"}, "plugins.k_triton": {"triton"},
             "plugins.c": set()}
    assert triton_on_import(graph) == {"plugins.a": ["plugins.a", "plugins.b", "plugins.k_triton", "triton"],
                                       "plugins.b": ["plugins.b", "plugins.k_triton", "triton"],
                                       "plugins.k_triton": ["plugins.k_triton", "triton"]}
    assert _kernel_module("plugins.k_triton") and _kernel_module("plugins.attention.triton.chunk")
    assert not _kernel_module("plugins.attention.backends") and not _kernel_module("plugins.attention.triton")


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


def test_importing_the_core_leaves_torch_compile_unloaded():
    """Importing any core module does not load torch._dynamo (over a second of every process's
    start: fairseq-generate, fairseq-eval-lm and fairseq-preprocess with the user-dir never need it);
    an eager-only function is marked with torch._disable_dynamo, which loads it on first call."""
    modules = sorted(m for m in core_imports() if not _kernel_module(m))
    script = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
              + "loaded = sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'triton')))\n"
              + "assert not loaded, loaded\n")
    _python_succeeds(script)


def _python_succeeds(script):
    """Runs `python -c script` from the repo root in a fresh process and asserts it exits 0."""
    import subprocess
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]


EAGER_LSTM_CALLS = """
import sys
import torch
from torch.nn.utils.rnn import pack_padded_sequence
from plugins.rnn import MomentumLSTM
for cell in ("momentum", "adam", "rmsprop", "lstm"):
    layer = MomentumLSTM(4, 6, num_layers=2, cell=cell)
    x = torch.randn(5, 2, 4)
    out, state = layer(x)
    out.sum().backward()
    layer.eval()
    with torch.no_grad():
        layer(pack_padded_sequence(x, torch.tensor([5, 3])))
        layer(x[:1], state)
loaded = sorted(m for m in sys.modules if m.startswith("torch._dynamo"))
assert not loaded, loaded[:5]
"""


def test_eager_lstm_calls_leave_torch_compile_unloaded():
    """Eager training, no-grad and one-step calls of MomentumLSTM (the joined-weight cache, the
    Adam/RMSProp recurrence, torch's fused kernel) do not load torch._dynamo either: the graph
    breaks they need under torch.compile are taken only when compiling."""
    _python_succeeds(EAGER_LSTM_CALLS)
