"""numpy values of a checkpoint rebuilt by torch's safe unpickler without trusting their bytes.

fairseq's checkpoints hold numpy scalars (best_loss, meters) and, with `--eval-bleu`, small
numeric arrays. numpy pickles a dtype as `np.dtype(spec)` followed by a state tuple that
`dtype.__setstate__` copies into the object, flags and fields included: allowlisting np.dtype
let a crafted pickle mark an int64 dtype as holding objects, and then 8 bytes of the file were
read as a Python object pointer (SIGSEGV, issue 28).

Here the names a numpy pickle uses map to stand-ins: `numpy.dtype` builds a `DtypeRecipe` that
only records a plain numeric spec and a byte order, checked against the exact state numpy writes
for such a dtype; `scalar` and `_reconstruct` accept only a recipe and bytes of the right length,
and build the real dtype themselves, so no attacker-chosen flag, field or subarray reaches numpy.
Arrays come back as `CheckedArray` (an ndarray subclass that pickles as a plain ndarray).

Another allowlist can name the same numpy globals: transformers' Trainer enters one with numpy's
own `_reconstruct`, `ndarray` and `dtype` to load its RNG state. torch keeps the allowlist in a
set and maps each name to whichever entry it meets last, which varies from process to process;
a mix (numpy's `_reconstruct` and `ndarray` with our dtype, or the reverse) failed to load. So
`install` makes every weights-only load resolve these names to the stand-ins wherever they are
allowlisted (tests/test_fairseq_checkpoint_numpy.py).
"""
import math
import pickle

import numpy as np
import torch._weights_only_unpickler as weights_only_unpickler

# One code per plain numeric type, as numpy writes it in a pickled dtype ("i8", "f4", "b1", ...).
NUMERIC_SPECS = frozenset(np.dtype(t).str[1:] for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128))
_BYTE_ORDERS = ("<", ">", "|", "=")


def _refuse(what: str):
    raise pickle.UnpicklingError(f"refusing a numpy value in the checkpoint: {what}; only plain numeric "
                                 f"dtypes ({', '.join(sorted(NUMERIC_SPECS))}) without fields are allowed")


class DtypeRecipe:
    """A pickled `np.dtype(spec, align, copy)` and its state, checked, before any dtype exists."""

    def __init__(self, spec, align=False, copy=True):
        if not isinstance(spec, str) or spec not in NUMERIC_SPECS:
            _refuse(f"dtype {spec!r}")
        self.spec, self.order = spec, "|"

    def __setstate__(self, state):
        # The state numpy writes for a plain dtype: version 3, byte order, no subarray, names or
        # fields, no explicit size or alignment, no flags.
        if (not isinstance(state, tuple) or len(state) != 8 or state[0] != 3 or state[1] not in _BYTE_ORDERS
                or state[2:] != (None, None, None, -1, -1, 0)):
            _refuse(f"dtype {self.spec!r} with state {state!r}")
        self.order = state[1]

    def dtype(self) -> np.dtype:
        plain = np.dtype(self.spec)
        return plain.newbyteorder(self.order) if self.order in "<>" else plain


def _checked_dtype(dtype) -> np.dtype:
    if not isinstance(dtype, DtypeRecipe):
        _refuse(f"a dtype given as {type(dtype).__name__}")
    real = dtype.dtype()
    if real.hasobject or real.fields is not None or real.subdtype is not None:
        _refuse(f"dtype {real}")
    return real


def scalar(dtype, data=None):
    """numpy's `multiarray.scalar(dtype, bytes)`, for a checked dtype and exactly its itemsize of bytes."""
    real = _checked_dtype(dtype)
    if not isinstance(data, bytes) or len(data) != real.itemsize:
        _refuse(f"a {real} scalar from {type(data).__name__} of the wrong size")
    return np.frombuffer(data, dtype=real)[0].copy()


class CheckedArray(np.ndarray):
    """An array whose pickled state is checked before numpy reads it."""

    def __new__(cls, *args, **kwargs):
        # Reached only by a pickle that calls numpy.ndarray(...) itself, which numpy never writes.
        _refuse("a direct numpy.ndarray(...) call")

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) != 5 or state[0] != 1:
            _refuse("an array state numpy does not write")
        _, shape, dtype, is_fortran, data = state
        real = _checked_dtype(dtype)
        if (not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape)
                or type(is_fortran) is not bool or not isinstance(data, bytes)
                or len(data) != math.prod(shape) * real.itemsize):
            _refuse(f"a {real} array whose shape and bytes disagree")
        np.ndarray.__setstate__(self, (1, shape, real, is_fortran, data))

    def __reduce__(self):
        return self.view(np.ndarray).__reduce__()


def reconstruct(subtype, shape, typecode):
    """numpy's `multiarray._reconstruct`: an empty CheckedArray that the pickle's state then fills."""
    if subtype is not CheckedArray or shape != (0,) or typecode != b"b":
        _refuse("an array reconstructed in a way numpy does not write")
    return np.core.multiarray._reconstruct(CheckedArray, (0,), b"b")


# numpy moved its multiarray module in numpy 2 (numpy._core); pickles use either name.
SAFE_GLOBALS = [
    (DtypeRecipe, "numpy.dtype"), (CheckedArray, "numpy.ndarray"),
    *[(reconstruct, f"{module}.multiarray._reconstruct") for module in ("numpy.core", "numpy._core")],
    *[(scalar, f"{module}.multiarray.scalar") for module in ("numpy.core", "numpy._core")],
]


def plain_numbers(obj):
    """`obj` with numpy scalars replaced by Python numbers, so a new checkpoint needs no numpy to load."""
    if isinstance(obj, np.generic):
        return obj.item()
    if type(obj) is dict:
        return {k: plain_numbers(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(plain_numbers(v) for v in obj)
    return obj


def install() -> None:
    """Resolve the numpy names of SAFE_GLOBALS to the stand-ins in every weights-only load where they
    are allowlisted, whatever else names them (once per process)."""
    allowed = getattr(weights_only_unpickler, "_get_user_allowed_globals", None)
    if allowed is None or getattr(allowed, "numpy_stand_ins", False):
        return

    def with_stand_ins():
        names = allowed()
        for stand_in, name in SAFE_GLOBALS:
            if name in names:
                names[name] = stand_in
        return names

    with_stand_ins.numpy_stand_ins = True
    weights_only_unpickler._get_user_allowed_globals = with_stand_ins
