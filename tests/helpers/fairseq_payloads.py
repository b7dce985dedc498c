"""A tiny fairseq LM's flags, a code payload and a checkpoint reader shared by the config-safety tests."""
import torch

from .fairseq_cli import preprocess_lm, train, write_lm_text

TINY_LM = ["--task", "language_modeling", "--arch", "momentum_transformer_lm", "--decoder-layers", "1",
           "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "16", "--decoder-attention-heads", "2",
           "--tokens-per-sample", "16", "--batch-size", "8", "--optimizer", "adam", "--lr", "0.001"]


def payload(marker) -> str:
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


def load_state(path):
    return torch.load(path)


def train_tiny_lm(root):
    """(checkpoint_last.pt, data-bin) of a real one-update fairseq-train run of TINY_LM under `root`."""
    data = preprocess_lm(write_lm_text(root / "text", sizes=(("train", 40), ("valid", 8), ("test", 8))),
                         root / "bin")
    train(data, root / "save", *TINY_LM, "--max-update", "1")
    return root / "save" / "checkpoint_last.pt", data
