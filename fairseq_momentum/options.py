"""Command-line arguments shared by the momentum architectures.

Every value is checked by its argparse `type`, so a bad value stops `fairseq-train` at
argument parsing with fairseq's usual message, e.g.
`error: argument --attention-momentum: must be in [0, 1), got 1.0`.
"""
import argparse
import math
import sys

from plugins import validation
from plugins.connection import (
    CONNECTIONS,
    DEFAULT_ADAPTIVE_DELTA,
    DEFAULT_CONNECTION_MOMENTUM,
    DEFAULT_CONNECTION_STEP_SIZE,
)
from plugins.rnn.variants import VARIANTS, cell_names, check_restart

FEATURE_MAP_CHOICES = ("elu", "relu")
CONNECTION_CHOICES = CONNECTIONS
CROSS_ATTENTION_CHOICES = ("softmax", "linear", "momentum")


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


def add_momentum_attention_args(parser, *, cross_attention=True):
    """Arguments of momentum attention and the momentum connection
    (Momentum Transformer, eq. 12-15, 18; docs/equations.md)."""
    group = parser
    group.add_argument("--attention-momentum", type=momentum_value, metavar="B",
                       help="momentum beta of momentum attention (eq. 12-14), in [0, 1); "
                            "0 with step size 1 is linear attention (default 0.6; 0 for linear_* presets)")
    group.add_argument("--attention-step-size", type=positive_float, metavar="G",
                       help="step size gamma > 0 of momentum attention (eq. 12-14) "
                            "(default 1; 0.6 for the NAT presets, Table 1)")
    group.add_argument("--feature-map", choices=FEATURE_MAP_CHOICES,
                       help="feature map phi of linear attention (eq. 5); elu = elu(x) + 1 (default)")
    group.add_argument("--attention-chunk-size", type=positive_int, metavar="N",
                       help="block length of the chunked causal kernel, speed only (default 64)")
    group.add_argument("--connection", choices=CONNECTION_CHOICES,
                       help="residual of the self-attention block: none (x + A), momentum "
                            "(eq. 15, constant momentum) or adaptive (eq. 15 with eq. 18) (default none)")
    group.add_argument("--connection-momentum", type=momentum_value, metavar="MU",
                       help="momentum of the momentum connection (eq. 15), in [0, 1) "
                            f"(default {DEFAULT_CONNECTION_MOMENTUM}, Table 1)")
    group.add_argument("--connection-step-size", type=positive_float, metavar="G",
                       help="step size of the momentum / adaptive connection (eq. 15) "
                            f"(default {DEFAULT_CONNECTION_STEP_SIZE}, Table 1)")
    group.add_argument("--connection-delta", type=delta_value, metavar="D",
                       help="adaptive momentum is clamped to [0, 1 - delta] (eq. 18) "
                            f"(default {DEFAULT_ADAPTIVE_DELTA:g})")
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


def momentum_attention_defaults(args, *, momentum=0.6, step_size=1.0, cross_attention="momentum"):
    """Fill the momentum arguments an architecture preset left unset."""
    fill_unset(args, attention_momentum=momentum, attention_step_size=step_size, feature_map="elu",
               attention_chunk_size=64, connection="none",
               connection_momentum=DEFAULT_CONNECTION_MOMENTUM,
               connection_step_size=DEFAULT_CONNECTION_STEP_SIZE,
               connection_delta=DEFAULT_ADAPTIVE_DELTA, cross_attention=cross_attention)


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
                            + " (default momentum)")
    group.add_argument("--lstm-momentum", type=momentum_value, metavar="MU",
                       help="momentum mu of the momentum / adam cells (eq. 9, 15), in [0, 1) "
                            "(default 0.6; 0 in momentum_lstm_lm_ptb, Table 7)")
    group.add_argument("--lstm-step-size", type=positive_float, metavar="S",
                       help="step size s > 0 of the momentum cells (eq. 9, 15) "
                            "(default 1; 0.6 in momentum_lstm_lm_ptb, Table 7)")
    group.add_argument("--lstm-beta", type=momentum_value, metavar="B",
                       help="decay beta of the second moment of adam / rmsprop cells (eq. 15) (default 0.9)")
    group.add_argument("--lstm-restart", type=positive_int, metavar="F",
                       help="restart frequency F of nag / sr cells (Section 2.4); "
                            "required by sr, optional for nag, refused by the other cells "
                            "(default: no restart)")


def lstm_cell_defaults(args, *, cell="momentum", momentum=0.6, step_size=1.0):
    """Fill the cell arguments a preset left unset, then apply the cell/restart rule.

    fairseq calls the architecture function (and so this) inside `parse_args_and_arch`, so a
    restart given to the wrong cell stops the command at parsing, like argparse's own errors:
    usage line, `error: --lstm-restart ...`, exit status 2."""
    fill_unset(args, lstm_cell=cell, lstm_momentum=momentum, lstm_step_size=step_size, lstm_beta=0.9,
               lstm_restart=None)
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
    """The cell/restart rule of plugins.rnn.variants (sr needs --lstm-restart, only nag and sr
    take one); ValueError otherwise."""
    check_restart(args.lstm_cell, args.lstm_restart, flag="--lstm-restart")


def lstm_cell_kwargs(args):
    """Keyword arguments of plugins.rnn.MomentumLSTM from the parsed arguments."""
    return dict(cell=args.lstm_cell, momentum=args.lstm_momentum, step_size=args.lstm_step_size,
                beta=args.lstm_beta, restart=args.lstm_restart)
