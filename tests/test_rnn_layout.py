"""The layout of plugins.rnn (its imports run one way: tests/test_architecture.py): the cell list
of the docs is the table's (docs/cells.md generated from it, no hand-written list of the family elsewhere)."""
import re
from pathlib import Path

import plugins.rnn
from plugins.rnn.variants import VARIANTS, cells_markdown

PACKAGE = Path(plugins.rnn.__file__).parent
ROOT = PACKAGE.parent.parent
# Where the cell family is documented for users; recipes/ and benchmarks/ name the cells they run.
DOCUMENTED = ["README.md", "hf_momentum/README.md", "fairseq_momentum/README.md", "docs/equations.md",
              "plugins/**/*.py", "hf_momentum/*.py", "fairseq_momentum/**/*.py"]


def test_docs_cell_list_is_generated_from_the_table():
    """After a change of the table: `make cells-doc`."""
    assert (ROOT / "docs/cells.md").read_text(encoding="utf-8") == cells_markdown()


def test_no_hand_written_list_of_the_cell_family():
    """A line naming three or more of the momentum cells is a list that would miss a new cell:
    point at docs/cells.md (or read the table) instead."""
    names = [name for name, v in VARIANTS.items() if not v.plain and name != "momentum"]
    word = re.compile(r"(?<![\w-])(" + "|".join(names) + r")(?![\w-])")
    found = []
    for pattern in DOCUMENTED:
        for path in sorted(ROOT.glob(pattern)):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if len(set(word.findall(line))) >= 3:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
