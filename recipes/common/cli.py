"""argparse value types shared by the recipes."""
import argparse

import torch


def bounded_int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    return bounded_int(text, 1)


def non_negative_int(text: str) -> int:
    return bounded_int(text, 0)


def available_device(text: str) -> torch.device:
    """A torch device string that this machine can use ("cpu", "cuda", "cuda:1", …)."""
    try:
        device = torch.device(text)
    except RuntimeError as error:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} ({error})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r} requested but CUDA is not available")
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu or cuda[:n], got {text!r}")
    return device


def require_distinct(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """Exit with an argparse error if a list option (--seeds, --models, …) repeats a value:
    repeats would be averaged as if they were independent runs."""
    for name in names:
        values = getattr(args, name)
        if len(set(values)) != len(values):
            parser.error(f"argument --{name}: values must be distinct, got {' '.join(map(str, values))}")
