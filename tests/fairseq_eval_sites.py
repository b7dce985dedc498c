"""Every place in the installed fairseq that evaluates a string as Python, found from its source
(an AST scan, so a fairseq upgrade that adds one fails tests/test_fairseq_safe_config.py until
fairseq_momentum/safe_config.py covers it). No tests here."""
import ast
from pathlib import Path
from typing import List, NamedTuple

import fairseq

EVALUATORS = {"eval", "eval_str_list", "eval_str_dict", "eval_bool"}


class Site(NamedTuple):
    module: str        # dotted module name
    line: int
    function: str      # eval, eval_str_list, ...
    field: str         # the config field evaluated, or "" when the argument is not an attribute
    argument: str      # the evaluated expression as written
    kind: str          # "call" (evaluated when the code runs) or "argparse" (a command-line type)


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _calls_evaluator(node) -> bool:
    if isinstance(node, (ast.Name, ast.Attribute)):
        return (node.id if isinstance(node, ast.Name) else node.attr) in EVALUATORS
    return any(isinstance(n, ast.Call) and _callee(n) in EVALUATORS for n in ast.walk(node))


def _field(node) -> str:
    return node.attr if isinstance(node, ast.Attribute) else ""


def _option_field(call: ast.Call) -> str:
    dest = [k.value.value for k in call.keywords if k.arg == "dest" and isinstance(k.value, ast.Constant)]
    if dest:
        return dest[0]
    options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    longest = max(options, key=lambda o: (o.startswith("--"), len(o)), default="")
    return longest.lstrip("-").replace("-", "_")


def _module_sites(path: Path, module: str) -> List[Site]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    sites = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _callee(node)
        if name in EVALUATORS and node.args and not (name == "eval" and isinstance(node.func, ast.Attribute)):
            sites.append(Site(module, node.lineno, name, _field(node.args[0]),
                              ast.unparse(node.args[0]), "call"))
        if name == "add_argument":
            for keyword in node.keywords:
                if keyword.arg == "type" and _calls_evaluator(keyword.value):
                    sites.append(Site(module, node.lineno, ast.unparse(keyword.value), _option_field(node),
                                      ast.unparse(node.args[0]) if node.args else "", "argparse"))
    return sites


def fairseq_eval_sites() -> List[Site]:
    root = Path(fairseq.__file__).parent
    sites = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(("fairseq",) + path.relative_to(root).with_suffix("").parts)
        sites.extend(_module_sites(path, module.removesuffix(".__init__")))
    return sites
