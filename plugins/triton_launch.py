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
`pin` it: the first launch goes through `direct`, the others call the launcher of the kernel
compiled for it without computing that key (on the 2-core CPU machine a third of an Adam LSTM's
host time), on the stream current at the first launch.
A launcher that makes several launches per call can run them under `launch_plan(signature)`,
where the signature describes the call's inputs (`described`): the n-th launch of a plan is then
keyed by (signature, device, n) alone, its arguments' key and its grid computed only the first
time.
A hit calls the compiled kernel's launcher itself (`CompiledKernel.run`, as Triton's runner
does) where no launch hook is set (Triton's profiling hooks get Triton's own runner).
Triton compiles each kernel with COMPILE_OPTIONS (FMA contraction on), whatever its version's default.
Under TRITON_INTERPRET, for anything that is not a Triton kernel (a test's recorder), and where a
config has a pre-hook, `direct` returns the kernel as it is."""
import os
import re
import threading

import torch

try:
    from triton import knobs
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction
except ImportError:                                # no triton: nothing to launch
    Autotuner = JITFunction = driver = knobs = None

ENABLED = os.environ.get("TRITON_INTERPRET") != "1"
# Every planned launch also computes its arguments' key and its grid and checks that they name the
# kernel and the grid the plan launched (tests/triton_direct_launch_check.py): a signature that
# misses what a launch specialises on or its grid depends on fails there instead of launching a
# kernel compiled for other arguments, or on another grid.
VERIFY_PLANS = os.environ.get("MOMENTUM_VERIFY_LAUNCH_PLANS") == "1"
VERIFIED = 0                                       # planned launches checked so far
PLANNED_KEYS = 4096                                # per kernel; at this many the planned keys start over
_LAUNCHERS = {}                                    # id(kernel) → DirectLaunch (the kernel kept inside)
_PLANS = threading.local()                         # .current: the innermost launch_plan, or None
_LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg", "num_buffers_warp_spec",
                   "num_consumer_groups", "reg_dec_producer", "reg_inc_consumer", "ir_override"}
# Every kernel is compiled with FMA contraction (a * b + c rounded once), as Triton's default compiled
# them through 3.9, and as every exactness test and GPU timing here saw them: Triton 3.9 warns where
# a launch leaves it to that default, and 3.10 turns the default off. A launch's own option, and
# TRITON_FORCE_DISABLE_FP_FUSION=1 (Triton 3.9 on), still turn it off.
COMPILE_OPTIONS = {"enable_fp_fusion": True}


# Triton's interpreter runs these kernels on CPU tensors from Triton 3.8 on. Before it, the autotuner
# times even the one config left after pruning, through a GPU driver that a machine without a GPU lacks
# ("0 active drivers"), and Triton 3.6's interpreter fails every loop over a run-time size under
# numpy 2.4 or later. Compiled kernels on CUDA tensors run with Triton 3.6 and later.
INTERPRETER_FLOOR = (3, 8)


def check_interpreter(path: str) -> None:
    """Refuses Triton's interpreter, before any launch, where the installed Triton cannot run the
    kernels in it; `path` names what the caller can use instead."""
    import triton
    version = tuple(int(part) for part in re.findall(r"\d+", triton.__version__)[:2])
    if version < INTERPRETER_FLOOR:
        floor = ".".join(map(str, INTERPRETER_FLOOR))
        raise RuntimeError(f"Triton's interpreter (TRITON_INTERPRET=1, CPU tensors) runs these kernels from "
                           f"Triton {floor} on; this is Triton {triton.__version__}. Install triton>={floor} "
                           f"or use {path}")


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


def described(*values) -> tuple:
    """A launch plan's signature of a call's inputs: each tensor by its dtype, shape and whether its
    address is 16-byte aligned (what Triton specialises a pointer on), None as None, any other value
    as it is. The launcher adds what else its launches depend on (flags, sizes, the precision)."""
    # a list comprehension: one call, where a generator resumes once per value (5 signatures a layer call)
    return tuple([(v.dtype, v.shape, not v.data_ptr() & 15) if isinstance(v, torch.Tensor) else v
                  for v in values])


class launch_plan:
    """`with launch_plan(signature):` the direct launches inside are numbered, and the n-th is keyed
    by (signature, current device, n): a call whose signature was seen launches each kernel compiled
    for it then, on the grid it was launched on then, without its arguments' key or its grid
    function. The signature must determine everything those launches specialise on and their
    grids: their count and order, every int and constant they take, and each tensor argument's
    dtype and alignment (buffers allocated inside are aligned; inputs are described).
    Without Triton, under TRITON_INTERPRET and while a launch hook is set, it plans nothing."""
    __slots__ = ("signature", "prefix", "position", "device", "stream", "outer")

    def __init__(self, signature):
        self.signature = signature

    def __enter__(self):
        self.outer = getattr(_PLANS, "current", None)
        if ENABLED and driver is not None and not _launch_hooks():
            self.device = device = driver.active.get_current_device()
            self.prefix = (self.signature, device)
            self.position = 0
            self.stream = driver.active.get_current_stream(device)
            _PLANS.current = self
        else:
            _PLANS.current = None
        return self

    def __exit__(self, *exc):
        _PLANS.current = self.outer


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
        self.planned = {}                          # (plan prefix, position) → an entry of compiled
        self.tuner_cache = None

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args, kwargs):
        if not self.specialised.isdisjoint(kwargs):    # an argument Triton specialises, by name
            return self.kernel[grid](*args, **{**COMPILE_OPTIONS, **kwargs})
        if self.tuner is not None:
            seen = (id(self.tuner.cache), len(self.tuner.cache))
            if seen != self.tuner_cache:            # the autotuner started over: so do we
                self.compiled.clear()
                self.planned.clear()
                self.tuner_cache = seen
        plan = getattr(_PLANS, "current", None)
        if plan is not None:
            planned = (plan.prefix, plan.position)
            plan.position += 1
            hit = self.planned.get(planned)              # (entry, the grid it was launched on)
            if hit is not None:
                if VERIFY_PLANS:
                    self.verify(hit, planned, grid, args, kwargs)
                return _run(hit[0], hit[1], args, plan.device, plan.stream)
        key = self.key(args, kwargs)
        entry = self.compiled.get(key)
        if entry is None:
            compiled = self.first_launch(key, grid, args, kwargs)
            entry = self.compiled.get(key)
            xyz = None if entry is None or plan is None else _grid(entry, grid, self.names, args)
        else:
            xyz = _grid(entry, grid, self.names, args)
            compiled = _run(entry, xyz, args, key[0])
        if plan is not None and entry is not None:
            if len(self.planned) >= PLANNED_KEYS:      # many shapes seen: start over
                self.planned.clear()
            self.planned[planned] = (entry, xyz)
        return compiled

    def verify(self, hit, planned, grid, args, kwargs):
        global VERIFIED
        VERIFIED += 1
        entry, kept = hit
        if self.compiled.get(self.key(args, kwargs)) is not entry:
            raise AssertionError(f"launch plan {planned} of {self.names[:3]}…: its arguments' key names "
                                 "another compiled kernel (the plan's signature misses what they "
                                 "specialise on)")
        xyz = _grid(entry, grid, self.names, args)
        if xyz != kept:
            raise AssertionError(f"launch plan {planned} of {self.names[:3]}…: its grid is {xyz}, the "
                                 f"plan's {kept} (the plan's signature misses what the grid depends on)")

    def pin(self, grid, args, kwargs):
        """`pin` for this launcher: after one launch, the compiled kernel's launcher with the
        arguments after the positional ones bound once, on the stream current at that launch (no
        launch hook set; with one, Triton's runner)."""
        self.launch(grid, args, kwargs)
        entry = self.compiled.get(self.key(args, kwargs)) if self.specialised.isdisjoint(kwargs) else None
        if entry is None:                             # not kept (a config's pre-hook, a keyword Triton
            return lambda grid, *new: self.launch(grid, new, kwargs)   # specialises): launch each time
        device, names = driver.active.get_current_device(), self.names
        if _launch_hooks():                           # Triton's runner calls the hooks
            return lambda grid, *new: _run(entry, _grid(entry, grid, names, new), new, device)
        # the loop runs on the stream current now, as launch plans do; _grid and _run inlined: this
        # runs once per time step (1650 function calls fewer per Adam LSTM forward+backward)
        compiled, tail = entry[0], entry[2]
        run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
        stream = driver.active.get_current_stream(device)

        def again(grid, *new):
            size = len(grid)
            run(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1, stream, function, metadata,
                None, None, None, *new, *tail)
        return again

    def first_launch(self, key, grid, args, kwargs):
        """Through Triton (compiling and autotuning as needed), keeping what it launched and the
        arguments after the positional ones, by name: defaults, the keyword arguments (all taken
        by value, so the key fixes them) and the autotuner's choice."""
        compiled = self.kernel[grid](*args, **{**COMPILE_OPTIONS, **kwargs})
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
            after = {name: bound[name] for name in self.names[len(args):]}
            self.compiled[key] = (compiled, after, tuple(after.values()))
        return compiled

    def key(self, args, kwargs):
        """Per positional argument its value where taken by value, else what Triton specialises
        on; the keyword arguments (constexprs and launch options) by value."""
        parts = [driver.active.get_current_device()]
        add = parts.append
        for value, by_value in zip(args, self.by_value):
            if by_value:
                add(value)
            elif value.__class__ is int:               # most arguments: _specialisation's, inlined
                add((int, value == 1, value & 15 == 0, -2 ** 31 <= value < 2 ** 31))
            elif isinstance(value, torch.Tensor):
                add((value.dtype, not value.data_ptr() & 15))
            else:
                add(_specialisation(value))
        add(tuple(kwargs.items()))
        return tuple(parts)


def _grid(entry, grid, names, args) -> tuple:
    """`grid` (a tuple, or a function of the launch's _Meta) as (x, y, z) for a kept entry."""
    if callable(grid):
        grid = grid(_Meta(entry[1], names, args))
    size = len(grid)
    return grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1


def _run(entry, xyz, args, device, stream=None):
    """Launches a kept (compiled, arguments after the positional ones, their values) on the grid
    `xyz` and `stream` (a launch plan's, whose start found no launch hook; None: the current one
    of `device`, the current device). Without a launch hook, through the compiled kernel's
    launcher as Triton's runner calls it; with one, through Triton's runner."""
    compiled, _, tail = entry
    if stream is None:
        if _launch_hooks():
            compiled[xyz](*args, *tail)
            return compiled
        stream = driver.active.get_current_stream(device)
    compiled.run(*xyz, stream, compiled.function, compiled.packed_metadata, None, None, None, *args, *tail)
    return compiled


def _launch_hooks() -> bool:
    """Whether a launch hook is set: Triton keeps them in HookChains, set when they hold a call."""
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return bool((enter is not None and getattr(enter, "calls", True))
                or (leave is not None and getattr(leave, "calls", True)))


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
