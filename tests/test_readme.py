"""Every code block of README.md's "Quickstart" sections runs as written, at a tiny size.

Each block runs in a fresh temporary directory holding the data it expects (`train.txt` … for the
fairseq LM block, `train.de` / `train.en` … for the translation block; `recipes/` is linked there
because the README's commands run from the repo root), with the virtualenv's bin first on PATH as
after `. .venv/bin/activate`, and this checkout on PYTHONPATH. The only change to a block is the
substitutions in SIZES, which shrink training lengths and append size arguments to the large
presets; each must match, so a README edit that drops one fails here instead of silently running
the full size.
"""
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

TINY_TRANSFORMER = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
                    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 "
                    "--decoder-attention-heads 2")
# (pattern, replacement): what the test shrinks; nothing else in a block is changed.
SIZES = [
    (r"--max-update 2000\b", "--max-update 3"),
    (r"--max-update 200\b", "--max-update 2"),
    (r"--max-update 50000\b", "--max-update 2"),
    (r"--max-update 300000\b", "--max-update 2"),
    (r"--max-epoch 3\b", "--max-epoch 1 --max-update 3"),
    (r"--arch momentum_transformer_iwslt_de_en\b", r"\g<0> " + TINY_TRANSFORMER),
    (r"--arch momentum_iterative_nat_iwslt16\b", r"\g<0> " + TINY_TRANSFORMER),
]
PAIRS = 16
WORDS = ("the of and to a in that it was her she not be he his as had with for you which at but is "
         "mr have on by all so very could would my been from were no what they said elizabeth").split()


def quickstart_blocks():
    """(section, language, code) for every fenced block under a `## Quickstart` heading."""
    blocks, section = [], None
    text = (REPO / "README.md").read_text(encoding="utf-8")
    for match in re.finditer(r"^## ([^\n]*)$|^```(\w+)\n(.*?)^```$", text, re.M | re.S):
        if match.group(1) is not None:
            section = match.group(1) if match.group(1).startswith("Quickstart") else None
        elif section is not None:
            blocks.append((section, match.group(2), match.group(3)))
    return blocks


BLOCKS = quickstart_blocks()


def shrink(code):
    for pattern, replacement in SIZES:
        code = re.sub(pattern, replacement, code)
    return code


def sentences(rng, n, words=WORDS):
    return "".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) + "\n" for _ in range(n))


def write_data(folder):
    """LM text with valid/test of at least 8 blocks of 256 tokens (fairseq batches in multiples of
    8 samples and finds a smaller validation set empty), and 16 parallel test pairs."""
    rng = random.Random(0)
    for split, n in (("train", 800), ("valid", 300), ("test", 300)):
        (folder / f"{split}.txt").write_text(sentences(rng, n))
        source = sentences(rng, n if split == "train" else PAIRS)
        (folder / f"{split}.de").write_text(source)
        (folder / f"{split}.en").write_text("".join(" ".join(reversed(line.split())) + "\n"
                                                    for line in source.splitlines()))
    (folder / "recipes").symlink_to(REPO / "recipes")


def test_readme_has_the_quickstart_blocks():
    languages = [(section.split(": ")[1], language) for section, language, _ in BLOCKS]
    assert languages == ([("the PyTorch core", "python")] * 3 + [("fairseq", "bash")] * 2
                         + [("transformers", "python")] * 2)
    shrunk = "\n".join(code for _, _, code in BLOCKS)
    for pattern, _ in SIZES:
        assert re.search(pattern, shrunk), f"SIZES pattern {pattern!r} matches no README block"


@pytest.mark.slow
@pytest.mark.parametrize("section,language,code", BLOCKS,
                         ids=[f"{i}-{section.split(': ')[1].replace(' ', '_')}-{language}"
                              for i, (section, language, _) in enumerate(BLOCKS)])
def test_quickstart_block_runs(section, language, code, tmp_path):
    write_data(tmp_path)
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(BIN.parent),
               PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    if language == "python":
        cmd = [sys.executable, "-c", shrink(code)]
    else:
        assert language == "bash"
        cmd = ["bash", "-euo", "pipefail", "-c", shrink(code)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{section} block failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    output = proc.stdout + proc.stderr
    if "fairseq-eval-lm" in code:
        evaluated = re.search(r"Evaluated ([0-9,]+) tokens", output)
        assert evaluated and int(evaluated.group(1).replace(",", "")) > 0, output[-3000:]
    if "fairseq-generate" in code:
        assert len(re.findall(r"^H-\d+\t", output, re.M)) == 2 * PAIRS    # both models, every test pair
