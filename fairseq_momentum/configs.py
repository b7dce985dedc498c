"""The checks every architecture of the user-dir runs on its config, whichever entry point built
it: the command line of fairseq-train (an argparse Namespace) or the `model:` section of a
fairseq-hydra-train yaml config (an omegaconf DictConfig).

fairseq's own `transformer` and `transformer_lm` read a hydra `model:` section through the
architecture preset (`_name`), which fills what the yaml leaves unset, so the momentum presets
work there unchanged. Two things a yaml skips that the command line does: argparse's checks of
each value, and its refusal of an unknown option. `check_model_section` applies both, with the
same rules and messages as the command line.
"""
import argparse
import importlib.util
from functools import cache, partial

import torch
from omegaconf import OmegaConf

from . import options
from .options import number

# the memory-efficient forms first: fairseq also sets --fp16 / --bf16 for them
HALF_PRECISION_FLAGS = ("memory_efficient_fp16", "memory_efficient_bf16", "fp16", "bf16")


def flag(name):
    return "--" + name.replace("_", "-")


def as_namespace(cfg):
    """A flat Namespace of a model config. fairseq's `TransformerConfig.from_namespace` keeps the
    options it does not declare (the momentum ones) only from a Namespace; from a DictConfig it
    drops them."""
    if not OmegaConf.is_config(cfg):
        return cfg
    return argparse.Namespace(**OmegaConf.to_container(cfg, resolve=True))


@cache
def _known_options(model_cls, preset):
    """Option names of `model_cls`'s command line, and the names `preset` adds (some presets
    set attributes that are not options, e.g. transformer_lm's add_bos_token)."""
    parser = argparse.ArgumentParser(add_help=False)
    model_cls.add_args(parser)
    actions = {action.dest: action for action in parser._actions}
    filled = argparse.Namespace()
    preset(filled)
    return actions, frozenset(vars(filled))


def check_model_section(cfg, model_cls, preset, arch):
    """Refuse an unknown key or a bad value in the `model:` section of a fairseq-hydra-train
    job before the preset fills it, with the message the command line would give (ValueError).
    A checkpoint's stored section is not checked: fairseq's presets fill some options with
    values of another type (transformer_lm's base_shuffle = False), and it was checked when
    it was trained."""
    if hydra_training_config(cfg) is None:
        return
    actions, filled = _known_options(model_cls, preset)
    for key, value in cfg.items():
        if key == "_name" or value is None:
            continue
        action = actions.get(key)
        if action is None:
            if key in filled:
                continue
            raise ValueError(f"model.{key}: {arch} has no option {flag(key)} (see "
                             f"`fairseq-train --arch {arch} --help`)")
        if action.choices is not None and value not in action.choices:
            raise ValueError(f"model.{key}: must be one of {', '.join(map(str, action.choices))}, "
                             f"got {value!r}")
        # the command line's own type checks (numbers, and the momentum ranges of options.py),
        # on the yaml value as the command line would read it
        parse = partial(number, kind=action.type) if action.type in (int, float) else action.type
        if action.type in (int, float) or getattr(action.type, "__module__", "") == options.__name__:
            try:
                parse(str(value))
            except argparse.ArgumentTypeError as error:
                raise ValueError(f"model.{key}: {error}") from None


def hydra_training_config(cfg):
    """The whole config of a running fairseq-hydra-train job if `cfg` is its `model:` section,
    else None (a command-line Namespace, or a checkpoint's stored config read outside a hydra
    job)."""
    from hydra.core.hydra_config import HydraConfig
    if not (OmegaConf.is_config(cfg) and HydraConfig.initialized()):
        return None
    root = cfg._get_root()
    return root if "common" in root else None


def check_precision(args):
    """--fp16 / --bf16 (and their memory-efficient forms) train on a CUDA GPU, and fairseq's
    command line reads --bf16 as TPU training (it sets --tpu: XLA); without that hardware
    fairseq 0.12 crashes deep in its optimizer or in XLA. Refuse them early, naming the flag and
    the fix (ValueError).

    Runs on the command line being parsed (a Namespace fairseq has not yet named with `_name`)
    and on the config of a running fairseq-hydra-train job, never on a stored checkpoint config,
    whose flags describe the machine that trained it."""
    if isinstance(args, argparse.Namespace) and not hasattr(args, "_name"):
        common, prefix = args, "--"
    else:
        root = hydra_training_config(args)
        if root is None:
            return
        common, prefix = root.common, "common."
    given = [name for name in HALF_PRECISION_FLAGS if getattr(common, name, False)]
    if not given:
        return
    name, cpu = (flag(given[0]), "--cpu") if prefix == "--" else (prefix + given[0], prefix + "cpu")
    fix = f"drop {name} to train in float32 on the CPU"
    if getattr(common, "tpu", False):
        if importlib.util.find_spec("torch_xla") is None:
            raise ValueError(f"{name}: fairseq trains bf16 on a TPU only (it sets --tpu), through "
                             f"torch_xla, which is not installed: {fix}, or use --fp16 on a CUDA GPU")
        return
    if getattr(common, "cpu", False):
        raise ValueError(f"{name} with {cpu}: half precision trains on a CUDA GPU; {fix}")
    if not torch.cuda.is_available():
        raise ValueError(f"{name} needs a CUDA GPU and torch sees none (torch.cuda.is_available() "
                         f"is False): {fix} (with {cpu})")
