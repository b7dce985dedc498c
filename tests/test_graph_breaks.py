"""plugins.graph_breaks.eager_under_compile: the decorated function runs outside the graph under
torch.compile (dynamo does not trace it) and is called directly in eager mode, without loading
dynamo."""
import subprocess
import sys
from pathlib import Path

import torch

from plugins.graph_breaks import eager_under_compile

ROOT = Path(__file__).resolve().parents[1]


def _traced(x):
    """x + 1 where dynamo traces the call, x where it runs outside a graph."""
    return x + float(torch.compiler.is_compiling())


outside = eager_under_compile(_traced)


def test_torch_compile_runs_it_outside_the_graph():
    x = torch.zeros(2)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(lambda t: _traced(t) * 2, backend="eager")(x), x + 2)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(lambda t: outside(t) * 2, backend="eager")(x), x)


def test_eager_calls_keep_the_function_and_do_not_load_dynamo():
    assert outside.__name__ == "_traced" and outside.__doc__ == _traced.__doc__
    assert torch.equal(outside(torch.ones(2)), torch.ones(2))
    script = ("import sys, torch\n"
              "from plugins.graph_breaks import eager_under_compile\n"
              "f = eager_under_compile(lambda x: x * 2)\n"
              "assert torch.equal(f(torch.ones(1)), torch.full((1,), 2.0))\n"
              "print('torch._dynamo' in sys.modules)\n")
    loaded = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()[-1]
    assert loaded == "False"
