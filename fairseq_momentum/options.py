"""Command-line arguments shared by the momentum architectures.

Every value is checked by its argparse `type`, so a bad value stops `fairseq-train` at
argument parsing with fairseq's usual message, e.g.
`error: argument --attention-momentum: must be in [0, 1), got 1.0`.
"""
import argparse
import dataclasses
import math
import sys

from omegaconf import OmegaConf

from plugins import validation
from plugins.connection import (
    CONNECTION_READS,
    CONNECTIONS,
    DEFAULT_ADAPTIVE_DELTA,
    DEFAULT_CONNECTION_MOMENTUM,
    DEFAULT_CONNECTION_STEP_SIZE,
    unread_connection_fields,
)
from plugins.rnn.variants import (
    DEFAULT_CELL,
    DEFAULTS,
    VARIANTS,
    cell_names,
    check_restart,
    unread_hyperparameters,
)
from plugins.transformer.config import (
    DEFAULT_ATTENTION_MOMENTUM,
    DEFAULT_ATTENTION_STEP_SIZE,
    BlockConfig,
    block_feature_maps,
)

# The shared block's defaults (plugins.transformer.BlockConfig), so both integrations agree.
BLOCK_DEFAULTS = {field.name: field.default for field in dataclasses.fields(BlockConfig)}
CONNECTION_CHOICES = CONNECTIONS
CROSS_ATTENTION_CHOICES = ("softmax", "linear", "momentum")
CONNECTION_FLAGS = {"momentum": "--connection-momentum", "step_size": "--connection-step-size",
                    "delta": "--connection-delta"}
CONNECTION_DEFAULTS = {"momentum": DEFAULT_CONNECTION_MOMENTUM, "step_size": DEFAULT_CONNECTION_STEP_SIZE,
                       "delta": DEFAULT_ADAPTIVE_DELTA}
# --layer-types, in transformers' vocabulary as the HF config's layer_types: momentum attention
# (the --attention-* values) or fairseq's own softmax MultiheadAttention.
LAYER_TYPES = ("linear_attention", "full_attention")


def number(text, kind=float):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def validated(check, kind=float, **limits):
    """An argparse type running a `plugins.validation` check on the parsed number, so a bad
    value is refused at parsing with the library's own rule and message."""
    def parse(text):
        value = number(text, kind)
        try:
            return check(value, "value", **limits)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix("value "))
    parse.__name__ = check.__name__.removeprefix("check_")
    return parse


# The argument types: plugins.validation's rules and messages, applied at parsing.
momentum_value = validated(validation.check_momentum)
positive_float = validated(validation.check_positive)
positive_int = validated(validation.check_int, int, low=1)
probability = validated(validation.check_number, low=0.0, high=1.0)
delta_value = validated(validation.check_number, low=0.0, high=1.0, low_open=True)


def layer_types(text):
    """--layer-types: a comma-separated list of LAYER_TYPES, one per layer."""
    kinds = [kind.strip() for kind in text.split(",")]
    unknown = [kind for kind in kinds if kind not in LAYER_TYPES]
    if unknown:
        raise argparse.ArgumentTypeError(f"each entry must be one of {', '.join(LAYER_TYPES)}, got "
                                         f"{', '.join(map(repr, unknown))}")
    return kinds


def kept_layers(cfg, stack: str):
    """The indices of --encoder-layers-to-keep / --decoder-layers-to-keep (fairseq's pruning of a
    trained stack, usually a --model-overrides at inference), or None."""
    keep = getattr(getattr(cfg, stack, None), "layers_to_keep", None)
    if keep is None or keep == "":
        return None
    return [int(index) for index in (keep.split(",") if isinstance(keep, str) else keep)]


def layer_kinds(cfg, layers: int, stack: str):
    """The self-attention kind of each of a stack's `layers` layers from --layer-types (None: all
    momentum attention): of the kept layers where the stack was pruned (fairseq sets its layer
    count to theirs); ValueError naming --layer-types when its length differs."""
    kinds = getattr(cfg, "layer_types", None)
    if kinds is None:
        return ["linear_attention"] * layers
    keep = kept_layers(cfg, stack)
    if keep is not None and len(keep) == layers and len(kinds) != layers:
        if max(keep) >= len(kinds):
            raise ValueError(f"--{stack}-layers-to-keep {','.join(map(str, keep))} names a layer past the "
                             f"{len(kinds)} of --layer-types")
        return [kinds[index] for index in keep]
    if len(kinds) != layers:
        raise ValueError(f"--layer-types has {len(kinds)} entries but the {stack} has {layers} layers; "
                         f"give one of {', '.join(LAYER_TYPES)} per layer")
    return list(kinds)


def add_momentum_attention_args(parser, *, cross_attention=True):
    """Arguments of momentum attention and the momentum connection
    (Momentum Transformer, eq. 12-15, 18; docs/equations.md)."""
    group = parser
    group.add_argument("--attention-momentum", type=momentum_value, metavar="B",
                       help="momentum beta of momentum attention (eq. 12-14), in [0, 1); 0 with step "
                            f"size 1 is linear attention (default {DEFAULT_ATTENTION_MOMENTUM:g}; "
                            "0 for linear_* presets)")
    group.add_argument("--attention-step-size", type=positive_float, metavar="G",
                       help="step size gamma > 0 of momentum attention (eq. 12-14) "
                            f"(default {DEFAULT_ATTENTION_STEP_SIZE:g}; 0.6 for the NAT presets, Table 1)")
    group.add_argument("--feature-map", choices=block_feature_maps(),
                       help="feature map phi of linear attention (eq. 5); elu = elu(x) + 1 "
                            f"(default {BLOCK_DEFAULTS['feature_map']})")
    group.add_argument("--attention-chunk-size", type=positive_int, metavar="N",
                       help="block length of the chunked causal kernel, speed only "
                            f"(default {BLOCK_DEFAULTS['chunk_size']})")
    group.add_argument("--connection", choices=CONNECTION_CHOICES,
                       help="residual of the self-attention block: none (x + A), momentum "
                            "(eq. 15, constant momentum) or adaptive (eq. 15 with eq. 18) "
                            f"(default {BLOCK_DEFAULTS['connection']})")
    group.add_argument("--connection-momentum", type=momentum_value, metavar="MU",
                       help="momentum of the momentum connection (eq. 15), in [0, 1); read by "
                            f"--connection momentum only (default {DEFAULT_CONNECTION_MOMENTUM}, Table 1)")
    group.add_argument("--connection-step-size", type=positive_float, metavar="G",
                       help="step size of the momentum / adaptive connection (eq. 15); not read by "
                            f"--connection none (default {DEFAULT_CONNECTION_STEP_SIZE}, Table 1)")
    group.add_argument("--connection-delta", type=delta_value, metavar="D",
                       help="adaptive momentum is clamped to [0, 1 - delta] (eq. 18); read by "
                            f"--connection adaptive only (default {DEFAULT_ADAPTIVE_DELTA:g})")
    group.add_argument("--layer-types", type=layer_types, metavar="KIND,...",
                       help="self-attention of each layer, comma-separated: linear_attention (momentum "
                            "attention, the --attention-* values) or full_attention (fairseq's softmax "
                            "attention); one per layer of the encoder and of the decoder "
                            "(default: all linear_attention)")
    if cross_attention:
        group.add_argument("--cross-attention", choices=CROSS_ATTENTION_CHOICES,
                           help="decoder attention over the encoder: softmax (fairseq's), "
                                "linear (eq. 5) or momentum (eq. 14) (default momentum; "
                                "linear for linear_* presets)")


def fill_unset(args, **defaults):
    """Set each argument that the command line (or an earlier preset) left unset (absent or
    None) to its default; the one rule of every architecture preset here."""
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    return args


def momentum_attention_defaults(args, *, momentum=DEFAULT_ATTENTION_MOMENTUM,
                                step_size=DEFAULT_ATTENTION_STEP_SIZE, cross_attention="momentum"):
    """Fill the momentum arguments an architecture preset left unset, with the shared block's
    defaults. A --connection-* flag that the chosen connection never reads (`--connection none
    --connection-momentum 0.3`) is refused, at parsing as the --lstm-* ones are, and otherwise
    stays unset (None): it is not filled with a default either. In a fairseq-hydra-train
    `model:` section the refusal is a ValueError naming the key."""
    fill_unset(args, attention_momentum=momentum, attention_step_size=step_size,
               feature_map=BLOCK_DEFAULTS["feature_map"], attention_chunk_size=BLOCK_DEFAULTS["chunk_size"],
               connection=BLOCK_DEFAULTS["connection"], cross_attention=cross_attention)
    reads = CONNECTION_READS.get(args.connection, ())
    fill_unset(args, **{f"connection_{name}": CONNECTION_DEFAULTS[name] for name in reads})
    hydra = OmegaConf.is_config(args)
    try:
        check_connection_args(args, hydra=hydra)
    except ValueError as error:
        if hydra:
            raise
        parser_error(error, "--connection KIND [--connection-momentum MU] [--connection-step-size G] "
                            "[--connection-delta D]")


def check_connection_args(args, *, hydra=False):
    """ValueError naming a --connection-* value that --connection never reads (unread flags
    were silently ignored before); `hydra` names the `model:` keys instead of the flags."""
    kind = args.connection
    for name in unread_connection_fields(kind):
        key = f"connection_{name}"
        if _field(args, key) is None:
            continue
        given, choose = (f"model.{key}", "model.connection=") if hydra else (CONNECTION_FLAGS[name],
                                                                              "--connection ")
        users = " or ".join(k for k, reads in CONNECTION_READS.items() if name in reads)
        raise ValueError(f"{given} is not read by {choose}{kind} and would be ignored; drop {given} or "
                         f"use {choose}{users}")


def lstm_cells():
    """Table entries of the cells --lstm-cell accepts, in the table's order."""
    return [VARIANTS[name] for name in cell_names("lstm")]


def add_lstm_cell_args(parser):
    """Arguments of the MomentumLSTM family (MomentumRNN, eq. 9, 15 and Section 2.4; docs/equations.md)."""
    group = parser
    # choices and help are read from the cell table when the parser is built
    group.add_argument("--lstm-cell", choices=cell_names("lstm"),
                       help="recurrent cell of the table plugins.rnn.variants: "
                            + "; ".join(f"{v.name} ({v.summary})" for v in lstm_cells())
                            + f" (default {DEFAULT_CELL})")
    group.add_argument("--lstm-momentum", type=momentum_value, metavar="MU",
                       help="momentum mu of the momentum / adam cells (eq. 9, 15), in [0, 1) "
                            f"(default {DEFAULTS.momentum:g}; 0 in momentum_lstm_lm_ptb, Table 7)")
    group.add_argument("--lstm-step-size", type=positive_float, metavar="S",
                       help="step size s > 0 of the momentum cells (eq. 9, 15) "
                            f"(default {DEFAULTS.step_size:g}; 0.6 in momentum_lstm_lm_ptb, Table 7)")
    group.add_argument("--lstm-beta", type=momentum_value, metavar="B",
                       help="decay beta of the second moment of adam / rmsprop cells (eq. 15) "
                            f"(default {DEFAULTS.beta:g})")
    group.add_argument("--lstm-restart", type=positive_int, metavar="F",
                       help="restart frequency F of nag / sr cells (Section 2.4); "
                            "required by sr, optional for nag, refused by the other cells "
                            "(default: no restart)")


LSTM_HYPERPARAMETER_FLAGS = {"momentum": "--lstm-momentum", "step_size": "--lstm-step-size",
                              "beta": "--lstm-beta"}


def lstm_cell_defaults(args, *, cell=DEFAULT_CELL, momentum=DEFAULTS.momentum, step_size=DEFAULTS.step_size):
    """Fill the cell arguments a preset left unset (defaults: plugins.rnn.variants.DEFAULTS), then
    apply the cell rules.

    A flag that the cell never reads (`--lstm-momentum` with `--lstm-cell lstm`, rmsprop, nag or
    sr; `--lstm-beta` without a second moment) is refused and stays unset (None), so it is not
    filled with a default either. fairseq calls the architecture function (and so this) inside
    `parse_args_and_arch`, so a wrong combination stops the command at parsing, like argparse's
    own errors: usage line, `error: --lstm-restart ...`, exit status 2."""
    fill_unset(args, lstm_cell=cell, lstm_restart=None)
    defaults = {"momentum": momentum, "step_size": step_size, "beta": DEFAULTS.beta}
    unread = set(unread_hyperparameters(args.lstm_cell)) if args.lstm_cell in VARIANTS else set()
    fill_unset(args, **{f"lstm_{name}": value for name, value in defaults.items() if name not in unread})
    try:
        check_lstm_cell_args(args)
    except ValueError as error:
        parser_error(error, "--lstm-cell CELL [--lstm-restart F]")


def parser_error(error, usage):
    """Stop the command as argparse stops it: usage line, `error: ...`, exit status 2 (fairseq
    runs the architecture presets inside `parse_args_and_arch`)."""
    prog = argparse.ArgumentParser().prog
    print(f"usage: {prog} [...] {usage}\n{prog}: error: {error}", file=sys.stderr)
    raise SystemExit(2)


def check_lstm_cell_args(args):
    """The cell rules of plugins.rnn.variants: sr needs --lstm-restart, only nag and sr take one,
    and a hyperparameter flag must be one the cell reads; ValueError otherwise."""
    check_restart(args.lstm_cell, args.lstm_restart, flag="--lstm-restart")
    for name in unread_hyperparameters(args.lstm_cell):
        flag = LSTM_HYPERPARAMETER_FLAGS.get(name)
        if flag is not None and getattr(args, f"lstm_{name}", None) is not None:
            raise ValueError(f"{flag} is not read by --lstm-cell {args.lstm_cell} and would be ignored; "
                             f"drop {flag} or choose a cell that uses it (docs/cells.md)")


def lstm_cell_kwargs(args):
    """Keyword arguments of plugins.rnn.MomentumLSTM from the parsed arguments (a hyperparameter
    the cell does not read is unset and keeps the layer's default)."""
    given = {name: getattr(args, f"lstm_{name}", None) for name in LSTM_HYPERPARAMETER_FLAGS}
    return dict(cell=args.lstm_cell, restart=args.lstm_restart,
                **{name: value for name, value in given.items() if value is not None})


def _field(config, key):
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)
