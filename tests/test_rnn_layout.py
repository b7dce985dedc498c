"""The layout of plugins.rnn: imports between its modules run one way (no cycle, counting the
imports inside functions that load the optional Triton path)."""
import ast
from pathlib import Path

import plugins.rnn

PACKAGE = Path(plugins.rnn.__file__).parent


def relative_imports(path):
    """Modules of plugins.rnn that `path` imports, at top level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found - {"__init__"}


def test_plugins_rnn_imports_form_no_cycle():
    graph = {p.stem: relative_imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    done, path = set(), []

    def visit(name):
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        path.append(name)
        for dep in sorted(graph.get(name, ())):
            visit(dep)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
    assert "adam_recurrence" not in graph["adam_recurrence_triton"]


def test_models_saved_before_the_rename_find_the_triton_path():
    """Their bundled code imports plugins.rnn.triton_recurrence inside a try block."""
    from plugins.rnn import adam_recurrence_triton, triton_recurrence

    assert triton_recurrence.TritonAdamLSTMRecurrence is adam_recurrence_triton.TritonAdamLSTMRecurrence
