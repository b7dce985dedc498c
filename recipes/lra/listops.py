"""ListOps (Nangia & Bowman 2018) as in the Long-Range Arena release: generator, files, tokens.

Grammar: an expression is a digit 0-9 or `[OP e_1 … e_k ]` with OP one of MAX, MIN, MED
(median, `int(np.median)`: the mean of the two middle values, rounded down, for an even count)
and SM (sum mod 10); `[MAX 2 9 [MIN 4 7 ] 0 ]` is 9. Ten classes, the value of the expression.

Generation follows `lra_benchmarks/data/listops.py`: a node at depth d < max_depth (the root has
depth 1) is an operator with probability 0.25, else a digit; an operator takes 2..max_args
arguments, drawn before the operator itself; a tree is kept when its token count without
parentheses is strictly between min_length and max_length, and duplicates are dropped. The
random calls are the release's, in its order, on `random.Random(seed)`. The defaults are the
release's (depth ≤ 10 counting the digits, at most 10 arguments, 500 < length < 2000 tokens).

File format (the release's `basic_{train,val,test}.tsv`): a tab-separated header `Source`,
`Target`, one expression per row, `\\r\\n` line ends (Python's csv writer). The release renders the
expression as its generator's nested pairs, each in parentheses:
`( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )`; `parens=False` writes the plain
`[MAX 2 9 [MIN 4 7 ] 0 ]`. The release's input pipeline deletes the parentheses before
tokenising; `encode` does the same unless asked to keep them.
"""
import csv
import random
from pathlib import Path
from typing import Iterable, List, NamedTuple, Sequence, Tuple, Union

import torch

MIN, MAX, MED, SUM_MOD = "[MIN", "[MAX", "[MED", "[SM"
OPERATORS = (MIN, MAX, MED, SUM_MOD)         # the release's order (its random.choice draws from it)
END = "]"
DIGITS = tuple(str(d) for d in range(10))
PARENS = ("(", ")")
PAD = "<pad>"
VOCAB = (PAD,) + DIGITS + OPERATORS + (END,) + PARENS   # 17 tokens and padding
TOKEN_ID = {token: i for i, token in enumerate(VOCAB)}
N_CLASSES = 10
OPERATOR_P = 0.25                           # the release's VALUE_P: P(operator) below max_depth
HEADER = ("Source", "Target")
SPLITS = ("train", "val", "test")

Tree = Union[int, Tuple[str, tuple]]        # a digit, or (operator, arguments)


def generate_tree(rng: random.Random, max_depth: int = 10, max_args: int = 10, depth: int = 1) -> Tree:
    """One random expression, drawn as the release draws it."""
    if (rng.random() if depth < max_depth else 1.0) > OPERATOR_P:
        return rng.choice(range(10))
    n_args = rng.randint(2, max_args)
    args = tuple(generate_tree(rng, max_depth, max_args, depth + 1) for _ in range(n_args))
    return rng.choice(OPERATORS), args


def tree_length(tree: Tree) -> int:
    """Tokens without parentheses: operator, arguments, closing bracket."""
    if isinstance(tree, int):
        return 1
    return 2 + sum(tree_length(arg) for arg in tree[1])


def tree_depth(tree: Tree) -> int:
    """Nodes on the longest root-to-digit path (a digit alone has depth 1)."""
    if isinstance(tree, int):
        return 1
    return 1 + max(tree_depth(arg) for arg in tree[1])


def median(values: Sequence[int]) -> int:
    """`int(np.median(values))` of the release, in integers."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) // 2


def apply(operator: str, values: Sequence[int]) -> int:
    if operator == MAX:
        return max(values)
    if operator == MIN:
        return min(values)
    if operator == MED:
        return median(values)
    if operator == SUM_MOD:
        return sum(values) % 10
    raise ValueError(f"operator must be one of {OPERATORS}, got {operator!r}")


def tree_value(tree: Tree) -> int:
    if isinstance(tree, int):
        return tree
    operator, args = tree
    return apply(operator, [tree_value(arg) for arg in args])


def to_source(tree: Tree, parens: bool = True) -> str:
    """The expression as the release writes it (`parens=True`) or without its parentheses."""
    if isinstance(tree, int):
        return str(tree)
    operator, args = tree
    rendered = [to_source(arg, parens) for arg in args]
    if not parens:
        return " ".join([operator, *rendered, END])
    # The release's tree is ((((op, a1), a2), …), END), each pair printed as "( left right )".
    text = f"( {operator} {rendered[0]} )"
    for arg in rendered[1:]:
        text = f"( {text} {arg} )"
    return f"( {text} {END} )"


def tokens_of(source: str, keep_parens: bool = False) -> List[str]:
    """Whitespace tokens of an expression, parentheses dropped unless `keep_parens`."""
    return [t for t in source.split() if keep_parens or t not in PARENS]


def evaluate(source: str) -> int:
    """The value of an expression in either rendering, with a stack of open operators."""
    stack: List[Tuple[str, List[int]]] = []
    result = None
    for token in tokens_of(source):
        if token in OPERATORS:
            stack.append((token, []))
            continue
        if token == END:
            if not stack:
                raise ValueError(f"unbalanced ']' in {source[:80]!r}")
            operator, values = stack.pop()
            value = apply(operator, values)
        elif token in DIGITS:
            value = int(token)
        else:
            raise ValueError(f"unknown ListOps token {token!r} in {source[:80]!r}")
        if stack:
            stack[-1][1].append(value)
        elif result is None:
            result = value
        else:
            raise ValueError(f"more than one expression in {source[:80]!r}")
    if stack or result is None:
        raise ValueError(f"incomplete expression {source[:80]!r}")
    return result


def generate(n: int, seed: int, *, max_depth: int = 10, max_args: int = 10, min_length: int = 500,
             max_length: int = 2000, max_tries: int = 0) -> List[Tree]:
    """`n` distinct trees with min_length < length < max_length, in the order drawn.
    max_tries (0: 1000 per tree) bounds the draws, so impossible bounds fail instead of looping."""
    for name, value, low in (("n", n, 0), ("max_depth", max_depth, 2), ("max_args", max_args, 2),
                             ("min_length", min_length, 0)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if not isinstance(max_length, int) or max_length <= min_length + 1:
        raise ValueError(f"max_length must be an integer > min_length + 1 = {min_length + 1}, "
                         f"got {max_length!r}")
    rng = random.Random(seed)
    kept, seen = [], set()
    tries = max_tries or 1000 * max(n, 1)
    for _ in range(tries):
        if len(kept) == n:
            break
        tree = generate_tree(rng, max_depth, max_args)
        if min_length < tree_length(tree) < max_length and tree not in seen:
            seen.add(tree)
            kept.append(tree)
    if len(kept) < n:
        raise RuntimeError(f"only {len(kept)} of {n} trees with {min_length} < length < {max_length} "
                           f"in {tries} draws (max_depth={max_depth}, max_args={max_args}): "
                           "widen the length bounds or raise max_depth / max_args")
    return kept


def write_tsv(path: Path, trees: Iterable[Tree], parens: bool = True) -> Path:
    """The release's TSV: header `Source\\tTarget`, one expression and its value per row."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(HEADER)
        writer.writerows((to_source(tree, parens), tree_value(tree)) for tree in trees)
    return path


def read_tsv(path: Path) -> List[Tuple[str, int]]:
    """(source, target) rows of a ListOps TSV (ours or the release's)."""
    path = Path(path)
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    if not rows or tuple(rows[0][:2]) != HEADER:
        found = rows[0] if rows else "no rows"
        raise ValueError(f"{path}: expected the header 'Source\\tTarget', got {found}")
    out = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) < 2 or not row[1].strip().isdigit() or not 0 <= int(row[1]) < N_CLASSES:
            raise ValueError(f"{path}:{line}: expected an expression and a target 0-9, got {row!r}")
        out.append((row[0], int(row[1])))
    return out


def split_path(directory: Path, split: str) -> Path:
    """`{split}.tsv` (ours) or the release's `basic_{split}.tsv` in `directory`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    for name in (f"{split}.tsv", f"basic_{split}.tsv"):
        if (Path(directory) / name).exists():
            return Path(directory) / name
    raise FileNotFoundError(f"neither {split}.tsv nor basic_{split}.tsv in {directory} (generate them "
                            "with `python -m recipes.lra.data listops --out DIR`, or use "
                            "lra_release/listops-1000)")


class Encoded(NamedTuple):
    tokens: torch.Tensor   # (N, T) uint8 ids into VOCAB, 0 = padding
    lengths: torch.Tensor  # (N,) int64
    labels: torch.Tensor   # (N,) int64 in 0..9


def encode(rows: Sequence[Tuple[str, int]], max_length: int = 2000, keep_parens: bool = False) -> Encoded:
    """Token ids padded to the longest row, each row cut at `max_length` tokens (as the release)."""
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
    ids = []
    for source, _ in rows:
        tokens = tokens_of(source, keep_parens)[:max_length]
        unknown = [t for t in tokens if t not in TOKEN_ID or t == PAD]
        if unknown:
            raise ValueError(f"unknown ListOps token {unknown[0]!r} in {source[:80]!r}")
        ids.append([TOKEN_ID[t] for t in tokens])
    lengths = torch.tensor([len(row) for row in ids], dtype=torch.int64)
    tokens = torch.zeros(len(ids), int(lengths.max()) if ids else 0, dtype=torch.uint8)
    for i, row in enumerate(ids):
        tokens[i, :len(row)] = torch.tensor(row, dtype=torch.uint8)
    labels = torch.tensor([target for _, target in rows], dtype=torch.int64)
    return Encoded(tokens, lengths, labels)


def load_split(directory: Path, split: str, max_length: int = 2000, keep_parens: bool = False) -> Encoded:
    """One split of our files or the release's (`lra_release/listops-1000`), encoded."""
    return encode(read_tsv(split_path(directory, split)), max_length, keep_parens)
