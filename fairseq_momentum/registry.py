"""Registration that tolerates a second import of the user-dir.

fairseq imports a user-dir by path (`--user-dir`), and a test or script may also import
it as the installed package, which runs every `register_model_architecture` twice and
raises "Cannot register duplicate model architecture". These wrappers register a name
only once. `momentum_preset` is the one way the transformer families declare a preset.
"""
import functools

from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY, register_model, register_model_architecture
from omegaconf import OmegaConf

from .configs import check_model_section, check_precision
from .options import momentum_attention_defaults, parser_error


def model(name):
    def wrap(cls):
        if name in MODEL_REGISTRY:
            return cls
        return register_model(name)(cls)
    return wrap


def architecture(model_name, arch_name):
    """Register `fn` as architecture `arch_name`; the registered preset first runs the checks of
    configs.py: half precision without a GPU, and a hydra `model:` section's keys and values."""
    def wrap(fn):
        if arch_name in ARCH_MODEL_REGISTRY:
            return fn

        @functools.wraps(fn)
        def checked(args):
            try:
                check_precision(args)
            except ValueError as error:
                if OmegaConf.is_config(args):
                    raise
                parser_error(error, "[--cpu | --fp16 | --bf16]")
            check_model_section(args, MODEL_REGISTRY[model_name], fn, arch_name)
            fn(args)

        register_model_architecture(model_name, arch_name)(checked)
        return fn
    return wrap


def momentum_preset(model_name, arch_name, base, **momentum):
    """Register architecture `arch_name` of `model_name`: the momentum-attention arguments the
    command line left unset get `momentum` (keywords of options.momentum_attention_defaults:
    momentum, step_size, cross_attention), then fairseq's `base` preset fills the rest."""

    def preset(args):
        momentum_attention_defaults(args, **momentum)
        base(args)

    preset.__name__ = preset.__qualname__ = arch_name
    return architecture(model_name, arch_name)(preset)
