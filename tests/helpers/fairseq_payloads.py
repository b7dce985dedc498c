"""A tiny fairseq LM's flags, a code payload and a checkpoint reader shared by the config-safety tests."""
import torch

TINY_LM = ["--task", "language_modeling", "--arch", "momentum_transformer_lm", "--decoder-layers", "1",
           "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "16", "--decoder-attention-heads", "2",
           "--tokens-per-sample", "16", "--batch-size", "8", "--optimizer", "adam", "--lr", "0.001"]


def payload(marker) -> str:
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


def load_state(path):
    return torch.load(path)
