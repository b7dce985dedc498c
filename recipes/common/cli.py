"""argparse value types shared by the recipes."""
import argparse
import warnings

import torch

from plugins.transformer.config import LAYER_TYPES, kinds_from_layer_types


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
    """A torch device string that this machine can use ("cpu", "cuda", "cuda:1", …), or "auto":
    cuda when a CUDA device is present, else cpu."""
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError as error:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} ({error})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r} requested but CUDA is not available")
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected auto, cpu or cuda[:n], got {text!r}")
    return device


def fairseq_device(text: str) -> torch.device:
    """available_device without an index: fairseq-train picks its GPUs itself (all the visible
    ones; CUDA_VISIBLE_DEVICES chooses them)."""
    device = available_device(text)
    if device.index is not None:
        raise argparse.ArgumentTypeError(f"fairseq uses every visible GPU, got {text!r}: use cuda, "
                                         "and CUDA_VISIBLE_DEVICES to choose the GPUs")
    return device


class DeprecatedGpuFlag(argparse.Action):
    """--gpu of the older fairseq recipes, kept so that their commands still run: it means
    --device cuda, with a FutureWarning."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="deprecated spelling of --device cuda")

    def __call__(self, parser, namespace, values, option_string=None):
        warnings.warn(f"{option_string} is deprecated: use --device cuda", FutureWarning, stacklevel=2)
        try:
            namespace.device = fairseq_device("cuda")
        except argparse.ArgumentTypeError as error:
            parser.error(f"argument {option_string}: {error}")


def add_fairseq_device_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """--device {auto,cpu,cuda} (default cpu) of the recipes that run fairseq, and --gpu, its
    deprecated spelling."""
    parser.add_argument("--device", type=fairseq_device, default=torch.device("cpu"),
                        metavar="{auto,cpu,cuda}",
                        help=f"{what}: cpu (default), cuda, or auto (cuda when a CUDA device is present)")
    parser.add_argument("--gpu", action=DeprecatedGpuFlag)


def require_distinct(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """Exit with an argparse error if a list option (--seeds, --models, …) repeats a value:
    repeats would be averaged as if they were independent runs."""
    for name in names:
        values = getattr(args, name)
        if len(set(values)) != len(values):
            parser.error(f"argument --{name}: values must be distinct, got {' '.join(map(str, values))}")


class VerifyCache(argparse.Action):
    """--verify: every reused cached artefact is first rebuilt from its source and compared
    (recipes/common/cache.py), which catches a file replaced together with its manifest digest."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from . import cache
        cache.VERIFY = True
        setattr(namespace, self.dest, True)


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verify", action=VerifyCache,
                        help="rebuild each reused cached corpus and data-bin from its source and stop if a "
                             "file differs (slower; the cache alone only protects against accidents)")


def add_layer_types_argument(parser: argparse.ArgumentParser) -> None:
    """--layer-types KIND,... of the §4 recipes (transformers' vocabulary, one per layer)."""
    parser.add_argument("--layer-types", type=lambda text: text.split(","), metavar="KIND,...",
                        help=f"attention of each layer, comma-separated, one of {', '.join(LAYER_TYPES)}: "
                             "the --models entry's own attention or softmax (default: all linear_attention)")


def check_layer_types(parser: argparse.ArgumentParser, layer_types, layers: int) -> None:
    """Exit with an argparse error naming --layer-types unless it is absent or gives one known
    kind per layer of the recipe's `layers`."""
    if layer_types is None:
        return
    try:
        kinds_from_layer_types(layer_types, "softmax", layers, name="--layer-types")
    except ValueError as error:
        parser.error(str(error))
