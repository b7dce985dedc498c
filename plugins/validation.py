"""Argument checks shared by attention, connections, recurrent cells and both integrations.

One rule set everywhere: numbers are real ints/floats (or 0-d tensors / numpy scalars),
never bools and never NaN/inf; every failure is a ValueError that names the argument and
the allowed range. Each check returns the value converted to a plain Python type.
"""
import math
import numbers
from typing import Iterable, Mapping, Optional

import torch

# A step counter or length beyond this would wrap negative in int64 arithmetic.
MAX_INT = 2 ** 62


def _plain(value, name: str):
    """Unwrap a 0-d tensor / numpy scalar; refuse bools and non-numbers."""
    if type(value) in (int, float):
        return value        # a number torch.compile traces symbolically (dynamic=True) has no hasattr
    if hasattr(value, "numel") and hasattr(value, "item"):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    elif hasattr(value, "item") and getattr(value, "shape", None) == ():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return value


def is_finite(value) -> bool:
    """math.isfinite in a form torch.compile traces on a symbolic float (dynamic=True); False for NaN."""
    return -math.inf < value < math.inf


def check_number(value, name: str, *, low: Optional[float] = None, high: Optional[float] = None,
                 low_open: bool = False, high_open: bool = False) -> float:
    """A finite real number in the interval given by low/high (closed unless *_open)."""
    value = float(_plain(value, name))
    if not is_finite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if below or above:
        raise ValueError(f"{name} must be {_interval(low, high, low_open, high_open)}, got {value:g}")
    return value


def _interval(low, high, low_open: bool, high_open: bool) -> str:
    """"in [0, 1)" for two bounds; "> 0" or "<= 1" for one (an open end at ±inf would read
    as if inf were allowed)."""
    if high is None:
        return f"{'>' if low_open else '>='} {low:g}"
    if low is None:
        return f"{'<' if high_open else '<='} {high:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def check_momentum(value, name: str = "momentum") -> float:
    """A momentum / decay coefficient: [0, 1)."""
    return check_number(value, name, low=0.0, high=1.0, high_open=True)


def check_positive(value, name: str) -> float:
    """A finite number > 0 (step sizes, eps, learning rates)."""
    return check_number(value, name, low=0.0, low_open=True)


def check_probability(value, name: str) -> float:
    """A dropout-like probability: [0, 1)."""
    return check_number(value, name, low=0.0, high=1.0, high_open=True)


def check_int(value, name: str, *, low: Optional[int] = None, high: Optional[int] = None) -> int:
    """An integer (not a bool, not a float) in [low, high]; never beyond ±2^62."""
    value = _plain(value, name)
    if not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    lo = -MAX_INT if low is None else low
    hi = MAX_INT if high is None else min(high, MAX_INT)
    if not lo <= value <= hi:
        if high is None:
            raise ValueError(f"{name} must be an integer >= {lo}, got {value}")
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value}")
    return value


def check_bool(value, name: str) -> bool:
    """A real bool: a string such as "false" is refused, not read as True."""
    if hasattr(value, "item") and getattr(value, "shape", None) in ((), None):
        value = value.item()
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


_BOOL_ANNOTATIONS = {"bool": False, "bool|None": True, "None|bool": True, "Optional[bool]": True}


def check_bool_fields(obj) -> None:
    """Every attribute that obj's class or a base annotates `bool` is a real bool (None too
    where the annotation is `bool | None`): a config field set to "False", a truthy string, is
    refused instead of read as True."""
    for cls in type(obj).__mro__:
        for name, annotation in vars(cls).get("__annotations__", {}).items():
            text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__",
                                                                           str(annotation))
            optional = _BOOL_ANNOTATIONS.get(text.replace(" ", "").replace("typing.", ""))
            if optional is None or not hasattr(obj, name):
                continue
            value = getattr(obj, name)
            if not (optional and value is None):
                check_bool(value, name)


def check_choice(value, name: str, choices: Iterable[str]) -> str:
    """One of a fixed set of names."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


def check_tensors(parts: Mapping[str, object], owner: str) -> None:
    """The tensors of one state object (e.g. `state.s`, `state.z`, `state.m`): each a
    floating-point torch.Tensor, all of one dtype and on one device. Shapes are the owner's to
    check, since each state has its own layout."""
    first = None
    for name, value in parts.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{owner}.{name} must be a torch.Tensor, got {type(value).__name__}")
        if not value.is_floating_point():
            raise ValueError(f"{owner}.{name} must be a floating-point tensor, got dtype {value.dtype}")
        if first is None:
            first = name, value
        elif (value.dtype, value.device) != (first[1].dtype, first[1].device):
            raise ValueError(f"{owner}.{first[0]} and {owner}.{name} must have one dtype and device, got "
                             f"{first[1].dtype} on {first[1].device} and {value.dtype} on {value.device}")


def check_group(group, name: str = "process_group"):
    """A torch.distributed process group that contains this rank (context parallelism)."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"{name} needs torch.distributed initialised (init_process_group)")
    if not isinstance(group, dist.ProcessGroup):
        raise ValueError(f"{name} must be a torch.distributed ProcessGroup (e.g. dist.group.WORLD or "
                         f"dist.new_group(...)), got {type(group).__name__}")
    if dist.get_rank(group) < 0:
        raise ValueError(f"{name} does not contain this rank")
    return group


OFFSET_DTYPES = (torch.int32, torch.int64)


def check_offsets(cu_seqlens, length: int, *, name: str = "cu_seqlens", device=None,
                  batch: Optional[int] = None, host: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The n + 1 offsets of sequences packed in one row; see `check_offsets_on_host`, which also
    returns the host copy it checked."""
    return check_offsets_on_host(cu_seqlens, length, name=name, device=device, batch=batch, host=host)[0]


def check_offsets_on_host(cu_seqlens, length: int, *, name: str = "cu_seqlens", device=None,
                          batch: Optional[int] = None, host: Optional[torch.Tensor] = None):
    """The n + 1 offsets of sequences packed in one row (flash-attention's and fla's cu_seqlens;
    sequence s is steps [cu[s], cu[s+1])): a 1-D int32/int64 tensor, cu[0] = 0, non-decreasing
    (empty sequences allowed), cu[-1] = `length`; on `device` and over a batch of one row where
    those are given. Returns it as int64 on its device, and the int64 host copy checked (None
    under torch.compile). The value checks copy it to the host
    once (as fla's prepare_lens does); under torch.compile only type, shape, dtype and device
    are checked. `host`: a host copy of the same offsets, checked instead of copying them again."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"{name} must be a 1-D int32/int64 tensor of n + 1 offsets, got "
                         f"{type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name} must be a 1-D tensor of n + 1 >= 2 offsets (0, end of sequence 1, ..., "
                         f"total length), got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype not in OFFSET_DTYPES:
        raise ValueError(f"{name} must have dtype int32 or int64, got {cu_seqlens.dtype}")
    if device is not None and cu_seqlens.device != torch.device(device):
        raise ValueError(f"{name} must be on the input's device {device}, got {cu_seqlens.device}")
    if batch is not None and batch != 1:
        raise ValueError(f"{name} needs a batch of one row (batch 1, the sequences packed into it), got "
                         f"batch {batch}: concatenate the rows into one")
    cu = cu_seqlens.long().contiguous()  # a strided view would make searchsorted copy and warn
    if torch.compiler.is_compiling():
        return cu, None
    if host is not None and tuple(host.shape) != tuple(cu_seqlens.shape):
        raise ValueError(f"{name}_cpu must hold the same {cu_seqlens.numel()} offsets as {name}, got shape "
                         f"{tuple(host.shape)}")
    values = cu_seqlens.detach().to("cpu", torch.int64) if host is None else host.to(torch.int64)
    if int(values[0]) != 0:
        raise ValueError(f"{name} must start at 0, got {int(values[0])}")
    down = torch.nonzero(values.diff() < 0)
    if down.numel():
        at = int(down[0, 0])
        raise ValueError(f"{name} must be non-decreasing, got {int(values[at])} then {int(values[at + 1])} "
                         f"at index {at}")
    if int(values[-1]) != length:
        raise ValueError(f"{name} must end at the sequence length {length}, got {int(values[-1])}")
    return cu, values
