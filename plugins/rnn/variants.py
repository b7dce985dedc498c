"""The one table of MomentumRNN cells: every cell of the family is described here once.

A `CellVariant` says which states the cell carries (the momentum v, the second moment m, a
time-step counter), whether it takes a restart frequency, how the momentum filter of its
whole-sequence form is built (`decay`, filters.py) and what one time step does to the input
pre-activation g_t = W x_t + b (`drive`). Everything else reads this table when it is used,
not when it is imported: the step-wise cells (lstm_cells.LSTMStepCell, the orthogonal cell),
the layers (MomentumLSTM, MomentumRNN, OrthogonalMomentumRNN) and their `step`, the HF
config's allowed values, fairseq's `--lstm-cell` choices and help, the tests' parametrisations
and the cell list of docs/cells.md (`cells_markdown`). A name that is not in it is refused with
the list of known cells.

Adding a cell: one `CellVariant` (with its drive, and a decay from filters.py) appended to
`_TABLE` here or passed to `register_cell`; its float64 transcription in tests/rnn_literal.py;
docs/cells.md regenerated (`make cells-doc`).

The plain recurrences ("lstm" for the LSTM family, "rnn" for the tanh and orthogonal
RNNs) are entries too: no v, no m, the drive is g_t itself.
"""
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ..validation import check_choice, check_int, check_momentum, check_positive
from .filters import (
    ConstantDecay,
    NAGDecay,
    adam_step,
    momentum_step,
    nag_momentum,
    restart_index,
)


class Hyper(NamedTuple):
    """Hyperparameters of a cell, already validated (`check_hyper`); None where the cell never
    reads one (`layer_hyper`)."""
    momentum: float | None
    step_size: float | None
    beta: float | None
    eps: float | None
    restart: int | None


# What a layer or step-wise cell uses for a hyperparameter its cell reads and the caller left None;
# the HF config and fairseq's options read their defaults (and the default cell) from here.
DEFAULTS = Hyper(momentum=0.6, step_size=1.0, beta=0.9, eps=1e-8, restart=None)
DEFAULT_CELL = "momentum"


@dataclass(frozen=True)
class CellVariant:
    """One cell of the family. The layers' whole-sequence form takes two shapes, chosen by
    `has_m`: without m the pre-activation is v_t itself, formed by the linear filter `decay`
    (eq. 9 and its schedules), so `drive` must return (v_t, v_t, None) with the v_t of that
    filter; with m it is eq. 15 (`adaptive_drive`, the fused Adam recurrence). A new cell of
    another shape needs its own layer path; tests/test_rnn_variants.py checks every entry's
    layers against its literal transcription and `step`."""

    name: str
    summary: str
    has_v: bool
    has_m: bool
    restart: str  # "required", "optional" or "refused"
    # decay(hyper, length, start_step (B,) int64) -> ConstantDecay / NAGDecay / None (μ ≡ 0):
    # the filter M[t, k] of v_t = Σ_k M[t, k] s g_k + M[t, 0] v_0 (filters.py).
    decay: Callable
    # drive(g, v, m, step, hyper) -> (pre-activation, v, m) for one time step; step (B,) is
    # the 1-based index of this step (read only by cells that count steps), v, m None where
    # the cell has none.
    drive: Callable[..., tuple[Tensor, Tensor | None, Tensor | None]]
    plain: bool = False
    fixed_momentum: float | None = None  # μ of a cell that has no momentum argument
    counts_steps: bool = False  # its drive reads the time-step counter (a schedule in t)

    @property
    def step_states(self) -> tuple[str, ...]:
        """States a step-wise cell takes and returns after (h, c), in this order."""
        return (("v",) * self.has_v + ("m",) * self.has_m + ("step",) * self.counts_steps)

    def hyper(self, momentum, step_size, beta, eps, restart) -> Hyper:
        """The hyperparameters as this cell's equations use them."""
        momentum = momentum if self.fixed_momentum is None else self.fixed_momentum
        return Hyper(momentum, step_size, beta, eps, restart)

    def input_scale(self, hyper: Hyper) -> float:
        """Factor of g in the momentum: s, or 1 for the plain recurrence."""
        return 1.0 if self.plain else hyper.step_size


def plain_drive(g, v, m, step, hyper):
    return g, None, None


def momentum_drive(g, v, m, step, hyper):
    """Eq. 9: v_t = μ v_{t-1} + s g_t; the drive is v_t."""
    v = momentum_step(v, g, hyper.momentum, hyper.step_size)
    return v, v, None


def nag_drive(g, v, m, step, hyper):
    """Section 2.4: eq. 9 with μ_t = (k−1)/(k+2), k the position of step t in its restart block."""
    mu = nag_momentum(restart_index(step, hyper.restart).to(g.dtype))
    v = momentum_step(v, g, mu[:, None] if mu.dim() == 1 else mu, hyper.step_size)
    return v, v, None


def adaptive_drive(g, v, m, step, hyper):
    """Eq. 15 as the authors coded it: v_t = μ v + s g; m_t = β m + (1−β) g⊙g; drive
    v_t / √(m_t + ε) (ε inside the root, no bias correction)."""
    return adam_step(v, m, g, hyper.momentum, hyper.step_size, hyper.beta, hyper.eps)


def no_decay(hyper, length, start_step):
    return None


def constant_momentum_decay(hyper, length, start_step):
    return None if hyper.momentum == 0 else ConstantDecay(hyper.momentum, length, start_step.device)


def nag_schedule_decay(hyper, length, start_step):
    """One decay group when every row starts at the same step. The rows are compared only in
    eager calls on the CPU: on an accelerator the comparison would make the host wait for the
    device, and a traced graph (torch.export, torch.compile) has no values to compare (export
    with a static length failed on it); there each row keeps its group unless the caller passes
    a single start step."""
    if start_step.device.type == "cpu" and not torch.compiler.is_compiling() and \
            bool((start_step == start_step[0]).all()):
        start_step = start_step[:1]
    return NAGDecay(start_step, hyper.restart, length)


_TABLE = (
    CellVariant("lstm", "plain LSTM (eq. 2)", has_v=False, has_m=False, restart="refused",
                decay=no_decay, drive=plain_drive, plain=True),
    CellVariant("rnn", "plain tanh / orthogonal RNN", has_v=False, has_m=False, restart="refused",
                decay=no_decay, drive=plain_drive, plain=True),
    CellVariant("momentum", "heavy-ball momentum, eq. 9", has_v=True, has_m=False, restart="refused",
                decay=constant_momentum_decay, drive=momentum_drive),
    CellVariant("adam", "Adam-style momentum, eq. 15", has_v=True, has_m=True, restart="refused",
                decay=constant_momentum_decay, drive=adaptive_drive),
    CellVariant("rmsprop", "RMSProp-style, eq. 15 with μ = 0", has_v=True, has_m=True, restart="refused",
                decay=constant_momentum_decay, drive=adaptive_drive, fixed_momentum=0.0),
    CellVariant("nag", "NAG momentum μ_t = (k−1)/(k+2), Section 2.4", has_v=True, has_m=False,
                restart="optional", decay=nag_schedule_decay, drive=nag_drive, counts_steps=True),
    CellVariant("sr", "NAG with a scheduled restart every F steps, Section 2.4", has_v=True, has_m=False,
                restart="required", decay=nag_schedule_decay, drive=nag_drive, counts_steps=True),
)
PLAIN_CELLS = ("lstm", "rnn")
VARIANTS = {variant.name: variant for variant in _TABLE}


def register_cell(variant: CellVariant) -> CellVariant:
    """Add a momentum cell to the table: from then on every layer family, the step-wise cells,
    the HF config and fairseq's --lstm-cell accept its name. A name already taken is refused."""
    if not isinstance(variant, CellVariant):
        raise TypeError(f"register_cell takes a CellVariant, got {type(variant).__name__}")
    if variant.name in VARIANTS:
        raise ValueError(f"cell {variant.name!r} is already in the table")
    if variant.plain:
        raise ValueError(f"the plain recurrences {PLAIN_CELLS} are fixed; {variant.name!r} cannot be plain")
    if variant.restart not in ("required", "optional", "refused"):
        raise ValueError(f"restart must be 'required', 'optional' or 'refused', got {variant.restart!r}")
    if variant.has_m and variant.drive is not adaptive_drive:
        # the layers' whole-sequence form of a cell with m is eq. 15 (the fused Adam recurrence)
        raise ValueError(f"cell {variant.name!r} carries m, so its drive must be eq. 15's adaptive_drive")
    VARIANTS[variant.name] = variant
    return variant


def cell_names(plain: str) -> tuple[str, ...]:
    """Cells a layer family accepts: its plain recurrence ("lstm" or "rnn") and every
    momentum cell of the table, read now (so registered cells are included)."""
    return (plain,) + tuple(name for name, v in VARIANTS.items() if not v.plain)


def get_variant(cell, plain: str) -> CellVariant:
    """The table entry of `cell`; ValueError listing the known cells otherwise."""
    return VARIANTS[check_choice(cell, "cell", cell_names(plain))]


def check_restart(cell: str, restart, flag: str = "restart") -> int | None:
    """The sr/restart rule: "sr" needs an integer F ≥ 1, "nag" takes one optionally (None or
    math.inf: no restart), every other cell refuses it. `flag` names the argument in errors."""
    rule = VARIANTS[check_choice(cell, "cell", VARIANTS)].restart
    if isinstance(restart, float) and restart == float("inf"):
        restart = None
    if restart is None:
        if rule == "required":
            raise ValueError(f"{flag} must be an integer >= 1 when cell={cell!r} (the restart frequency F)")
        return None
    if rule == "refused":
        allowed = ", ".join(repr(v.name) for v in VARIANTS.values() if v.restart != "refused")
        raise ValueError(f"{flag} applies to cell {allowed} only, not cell={cell!r}; got {restart!r}")
    return check_int(restart, flag, low=1)


def unread_hyperparameters(cell) -> tuple[str, ...]:
    """The hyperparameters among momentum, step_size, beta, eps that `cell`'s equations never
    read: all four for a plain recurrence; momentum for rmsprop (μ fixed at 0) and for the cells
    that count steps (nag, sr: μ_t from their schedule); beta and eps without a second moment.
    The integrations refuse a value given for one of them (it would be ignored silently)."""
    variant = VARIANTS[check_choice(cell, "cell", VARIANTS)]
    if variant.plain:
        return ("momentum", "step_size", "beta", "eps")
    unread = ("momentum",) if variant.fixed_momentum is not None or variant.counts_steps else ()
    return unread + (() if variant.has_m else ("beta", "eps"))


def check_hyper(cell, plain, momentum, step_size, beta, eps, restart) -> tuple[CellVariant, Hyper]:
    """Validate a cell name and its hyperparameters (plugins.validation rules)."""
    variant = get_variant(cell, plain)
    hyper = Hyper(check_momentum(momentum, "momentum"), check_positive(step_size, "step_size"),
                  check_momentum(beta, "beta"), check_positive(eps, "eps"),
                  check_restart(variant.name, restart))
    return variant, hyper


def read_hyperparameters(cell, **values) -> dict:
    """`values` (keyword arguments among momentum, step_size, beta, eps) less those that `cell`
    never reads: for callers that hold a value of every hyperparameter, as the HF config does."""
    unread = unread_hyperparameters(cell)
    return {name: value for name, value in values.items() if name not in unread}


def layer_hyper(cell, plain, momentum=None, step_size=None, beta=None, eps=None,
                restart=None) -> tuple[CellVariant, Hyper]:
    """The cell and hyperparameters of a layer or step-wise cell. None is the cell's default
    (`DEFAULTS`) for a hyperparameter it reads; a value given for one it never reads
    (`unread_hyperparameters`) is refused, as the integrations refuse it, since it would be
    ignored. The unread ones are None in the returned Hyper."""
    variant = get_variant(cell, plain)
    given = dict(momentum=momentum, step_size=step_size, beta=beta, eps=eps)
    unread = unread_hyperparameters(variant.name)
    for name in unread:
        if given[name] is not None:
            raise ValueError(f"{name}={given[name]!r} is not read by cell={variant.name!r} and would be "
                             f"ignored; leave {name} None or choose a cell that uses it (docs/cells.md)")
    filled = {name: getattr(DEFAULTS, name) if value is None else value for name, value in given.items()}
    variant, hyper = check_hyper(variant.name, plain, restart=restart, **filled)
    return variant, hyper._replace(**{name: None for name in unread})


def cells_markdown() -> str:
    """docs/cells.md, generated from the table (tests/test_rnn_layout.py checks the file)."""
    families = {"lstm": "MomentumLSTM", "rnn": "MomentumRNN, OrthogonalMomentumRNN"}
    rows = [f"| `{v.name}` | {v.summary} | {', '.join(v.step_states) or '—'} | {v.restart} | "
            f"{families.get(v.name, 'all three')} |" for v in VARIANTS.values()]
    return "\n".join([
        "# MomentumRNN cells",
        "",
        "Generated from the cell table `plugins/rnn/variants.py` by `make cells-doc`; every",
        "layer family, the step-wise cells, the HF config (`cell`) and fairseq (`--lstm-cell`)",
        "accept these names. Equations: docs/equations.md (MomentumRNN eq. 9, eq. 15, Section 2.4).",
        "",
        "| cell | what it is | states of LSTMStepCell | restart F | layer families |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ])
