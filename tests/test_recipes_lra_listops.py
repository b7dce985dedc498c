"""ListOps: labels against a recursive-descent evaluator written here, bounds, seeds, the release's files."""
import statistics

import pytest

from recipes.lra import listops

# What the release's to_string prints for [MAX 2 9 [MIN 4 7 ] 0 ], worked out by hand from its code.
RELEASE_EXAMPLE = "( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )"


def parse(tokens, i=0):
    """Recursive descent over the tokens without parentheses: (value, next position)."""
    token = tokens[i]
    if token.isdigit():
        return int(token), i + 1
    assert token in ("[MAX", "[MIN", "[MED", "[SM"), token
    args, i = [], i + 1
    while tokens[i] != "]":
        value, i = parse(tokens, i)
        args.append(value)
    assert len(args) >= 2
    if token == "[MAX":
        return max(args), i + 1
    if token == "[MIN":
        return min(args), i + 1
    if token == "[SM":
        return sum(args) % 10, i + 1
    return int(statistics.median(args)), i + 1     # the release's int(np.median): truncation


def reference_value(source):
    tokens = [t for t in source.split() if t not in "()"]
    value, end = parse(tokens)
    assert end == len(tokens)
    return value


def test_the_issue_example_in_both_renderings():
    tree = ("[MAX", (2, 9, ("[MIN", (4, 7)), 0))
    assert listops.to_source(tree, parens=False) == "[MAX 2 9 [MIN 4 7 ] 0 ]"
    assert listops.to_source(tree) == RELEASE_EXAMPLE
    for source in (RELEASE_EXAMPLE, "[MAX 2 9 [MIN 4 7 ] 0 ]"):
        assert listops.evaluate(source) == 9 == reference_value(source)


def test_median_of_an_even_count_rounds_down_as_the_release():
    assert listops.evaluate("[MED 1 2 ]") == 1 and listops.evaluate("[MED 3 8 1 6 ]") == 4
    assert listops.evaluate("[SM 9 9 5 ]") == 3


@pytest.mark.parametrize("parens", [True, False])
def test_generated_labels_match_an_independent_evaluator(tmp_path, parens):
    trees = listops.generate(60, seed=3, min_length=40, max_length=300, max_depth=6)
    path = listops.write_tsv(tmp_path / "train.tsv", trees, parens=parens)
    rows = listops.read_tsv(path)
    assert len(rows) == 60
    assert all(("(" in source) == parens for source, _ in rows)
    assert [target for _, target in rows] == [reference_value(source) for source, _ in rows]
    assert len({target for _, target in rows}) >= 5


def test_release_size_bounds_and_determinism():
    trees = listops.generate(12, seed=0)            # the release's defaults: 500 < length < 2000, depth 10
    for tree in trees:
        source = listops.to_source(tree, parens=False)
        assert 500 < len(source.split()) < 2000
        depth, deepest = 0, 0
        for token in source.split():
            depth += token.startswith("[")
            deepest = max(deepest, depth)
            depth -= token == "]"
        assert deepest <= 9                          # operators nest 9 deep, digits are the 10th level
        assert listops.tree_depth(tree) <= 10
    assert listops.generate(12, seed=0) == trees
    assert listops.generate(12, seed=1) != trees
    assert len(set(trees)) == len(trees)


def test_impossible_bounds_and_bad_arguments_are_refused():
    with pytest.raises(RuntimeError, match="widen the length bounds"):
        listops.generate(2, seed=0, max_depth=2, min_length=50, max_length=60, max_tries=200)
    with pytest.raises(ValueError, match="max_length must be"):
        listops.generate(2, seed=0, min_length=10, max_length=11)
    with pytest.raises(ValueError, match="max_args must be"):
        listops.generate(2, seed=0, max_args=1)


def test_loader_reads_a_release_formatted_file(tmp_path):
    """The release's basic_*.tsv: header, parenthesised sources, \\r\\n line ends."""
    (tmp_path / "basic_val.tsv").write_bytes(
        b"Source\tTarget\r\n" + RELEASE_EXAMPLE.encode() + b"\t9\r\n"
        b"( ( ( [SM 4 ) 8 ) ] )\t2\r\n")
    encoded = listops.load_split(tmp_path, "val")
    assert encoded.labels.tolist() == [9, 2]
    assert encoded.lengths.tolist() == [9, 4]
    first = [listops.VOCAB[i] for i in encoded.tokens[0, :9].tolist()]
    assert first == "[MAX 2 9 [MIN 4 7 ] 0 ]".split()
    assert encoded.tokens[1, 4:].eq(0).all()        # padding
    kept = listops.load_split(tmp_path, "val", keep_parens=True)
    assert kept.lengths.tolist() == [len(RELEASE_EXAMPLE.split()), 10]
    assert len(listops.VOCAB) == 18                 # 17 tokens and padding


def test_loader_errors_name_the_problem(tmp_path):
    (tmp_path / "test.tsv").write_text("Input\tLabel\n[MAX 1 2 ]\t2\n")
    with pytest.raises(ValueError, match="expected the header"):
        listops.load_split(tmp_path, "test")
    with pytest.raises(FileNotFoundError, match="basic_train.tsv"):
        listops.load_split(tmp_path, "train")
    with pytest.raises(ValueError, match="unknown ListOps token"):
        listops.encode([("[MAX 1 X ]", 1)])
