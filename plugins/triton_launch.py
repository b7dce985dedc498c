"""Launching a Triton kernel with less host work per call: `direct(kernel)[grid](*args, **kwargs)`
does what `kernel[grid](*args, **kwargs)` does, and after the first launch of a specialisation it
launches the compiled kernel Triton chose then (`CompiledKernel[grid](*args)`), skipping the
autotuner's key, the binder and the cache lookup.

Why: on an H200 (docs/benchmarks.md, 2026-11-27) a momentum-attention forward+backward kept the
GPU busy 0.76 of 2.34 ms at B16-H16-T1k: the rest is the host's. An autotuned launch through
Triton's launcher took the 2-core CPU machine 110-145 µs (a timer around each launch of a
forward+backward on the stand-in driver of tests/triton_standin.py), more than most of these
kernels take on the device.

The cache key is finer than what Triton specialises on, so a hit never reuses a kernel compiled
for other arguments: per positional argument, a tensor's dtype and whether its address is 16-byte
aligned, an int's equality to 1, divisibility by 16 and 32-bit range; the value of a constexpr, of
a launch option and of the autotuner's key arguments; the keyword arguments by value; the current
device; and, for an autotuned kernel, the autotuner's own cache (cleared or replaced: start over).
A keyword argument that Triton specialises on (not a constexpr) sends the launch through Triton's
own dispatch. A hit appends the arguments after the positional ones, bound at the first launch,
and gives a grid function the positional arguments only when it asks for one by name.
A loop that launches one kernel many times on arguments that specialise alike at every call can
`pin` it: the first launch goes through `direct`, the others launch the kernel compiled for it
without computing that key (on the 2-core CPU machine a third of an Adam LSTM's host time).
Under TRITON_INTERPRET, for anything that is not a Triton kernel (a test's recorder), and where a
config has a pre-hook, `direct` returns the kernel as it is."""
import os

import torch

try:
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction
except ImportError:                                # no triton: nothing to launch
    Autotuner = JITFunction = driver = None

ENABLED = os.environ.get("TRITON_INTERPRET") != "1"
_LAUNCHERS = {}                                    # id(kernel) → DirectLaunch (the kernel kept inside)
_LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg", "num_buffers_warp_spec",
                   "num_consumer_groups", "reg_dec_producer", "reg_inc_consumer", "ir_override"}


def pin(kernel, grid, args, kwargs):
    """Launches kernel[grid](*args, **kwargs) and returns `again(grid, *args)`, which launches the
    kernel compiled for this call on new positional arguments with the same kwargs. The caller
    guarantees that the new arguments specialise as these did: the same dtypes, tensors alike
    16-byte aligned or not, and no int Triton specialises on that changes its value class."""
    kernel = direct(kernel)                           # a DirectLaunch stays as it is
    if isinstance(kernel, DirectLaunch):
        return kernel.pin(grid, args, kwargs)
    kernel[grid](*args, **kwargs)
    return lambda grid, *new: kernel[grid](*new, **kwargs)


def direct(kernel):
    """The direct launcher of `kernel` (a @triton.jit or autotuned function), or `kernel` itself
    where launching directly does not apply."""
    if not ENABLED or Autotuner is None:
        return kernel
    launcher = _LAUNCHERS.get(id(kernel))
    if launcher is None or launcher.kernel is not kernel:
        jit = kernel
        while isinstance(jit, Autotuner):
            jit = jit.fn
        if not isinstance(jit, JITFunction):          # the interpreter's, or no Triton kernel
            return kernel
        launcher = _LAUNCHERS[id(kernel)] = DirectLaunch(kernel, jit)
    return launcher


class DirectKernels:
    """A module's kernels, each through `direct`: `K = DirectKernels(chunk_kernels)`, then
    `K.fwd_h[grid](...)`. An attribute set on it (a test's recorder) takes the kernel's place."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return direct(getattr(self._module, name))


class DirectLaunch:
    def __init__(self, kernel, jit):
        self.kernel = self.fn = kernel
        self.names = list(jit.arg_names)
        self.tuner = kernel if isinstance(kernel, Autotuner) else None
        # taken by value: constexprs, the autotuner's key arguments, and launch options (num_warps)
        by_value = {param.name for param in jit.params if param.is_constexpr}
        by_value |= set(self.tuner.keys if self.tuner is not None else ())
        self.by_value = [name in by_value for name in self.names]
        self.specialised = set(self.names) - by_value
        self.defaults = {param.name: param.default for param in jit.params if param.has_default}
        self.compiled = {}
        self.tuner_cache = None

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args, kwargs):
        if not self.specialised.isdisjoint(kwargs):    # an argument Triton specialises, by name
            return self.kernel[grid](*args, **kwargs)
        if self.tuner is not None:
            seen = (id(self.tuner.cache), len(self.tuner.cache))
            if seen != self.tuner_cache:            # the autotuner started over: so do we
                self.compiled.clear()
                self.tuner_cache = seen
        key = self.key(args, kwargs)
        entry = self.compiled.get(key)
        if entry is None:
            return self.first_launch(key, grid, args, kwargs)
        compiled, after = entry
        if callable(grid):
            grid = grid(_Meta(after, self.names, args))
        compiled[tuple(grid) + (1,) * (3 - len(grid))](*args, *after.values())
        return compiled

    def pin(self, grid, args, kwargs):
        """`pin` for this launcher: after one launch, the compiled kernel with the arguments after
        the positional ones bound once."""
        self.launch(grid, args, kwargs)
        entry = self.compiled.get(self.key(args, kwargs)) if self.specialised.isdisjoint(kwargs) else None
        if entry is None:                             # not kept (a config's pre-hook, a keyword Triton
            return lambda grid, *new: self.launch(grid, new, kwargs)   # specialises): launch each time
        compiled, tail = entry[0], list(entry[1].values())

        def again(grid, *new):
            compiled[tuple(grid) + (1,) * (3 - len(grid))](*new, *tail)
        return again

    def first_launch(self, key, grid, args, kwargs):
        """Through Triton (compiling and autotuning as needed), keeping what it launched and the
        arguments after the positional ones, by name: defaults, the keyword arguments (all taken
        by value, so the key fixes them) and the autotuner's choice."""
        compiled = self.kernel[grid](*args, **kwargs)
        config = {}
        if self.tuner is not None:
            chosen = self.tuner.best_config
            if chosen.pre_hook is not None:
                return compiled
            config = {name: value for name, value in chosen.all_kwargs().items()
                      if name not in _LAUNCH_OPTIONS}
            self.tuner_cache = (id(self.tuner.cache), len(self.tuner.cache))
        if compiled is not None and hasattr(compiled, "launch_metadata"):
            bound = dict(self.defaults)
            bound.update(kwargs)
            bound.update(config)
            self.compiled[key] = (compiled, {name: bound[name] for name in self.names[len(args):]})
        return compiled

    def key(self, args, kwargs):
        """Per positional argument its value where taken by value, else what Triton specialises
        on; the keyword arguments (constexprs and launch options) by value."""
        parts = [driver.active.get_current_device()]
        add = parts.append
        for value, by_value in zip(args, self.by_value):
            if by_value:
                add(value)
            elif isinstance(value, torch.Tensor):
                add((value.dtype, not value.data_ptr() & 15))
            else:
                add(_specialisation(value))
        add(tuple(kwargs.items()))
        return tuple(parts)


class _Meta(dict):
    """What a grid function reads: the launch's keyword arguments, defaults and autotuned config,
    and, looked up only when asked for, its positional arguments by name (Triton's grid gets them
    all; copying them into the dict at every launch costs host time that the grids here never use)."""
    __slots__ = ("names", "args")

    def __init__(self, fixed, names, args):
        super().__init__(fixed)
        self.names, self.args = names, args

    def __missing__(self, name):
        if name in self.names[:len(self.args)]:
            return self.args[self.names.index(name)]
        raise KeyError(name)


def _specialisation(value):
    if value is None or value.__class__ is bool:
        return value
    if isinstance(value, int):
        return int, value == 1, value & 15 == 0, -2 ** 31 <= value < 2 ** 31
    return type(value)


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ on the host (`triton.cdiv` is a constexpr function: about 10 µs per host call)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two ≥ n (≥ 1), on the host (as cdiv, for `triton.next_power_of_2`)."""
    return 1 << max(n - 1, 0).bit_length()
