"""A stand-in Triton driver for a machine without a GPU: Triton's real launch path — the binder
that specialises each argument, the autotuner over every config its pruning keeps, compilation
to a cubin for a chosen target with the bundled ptxas, the shared-memory and thread checks —
runs on CPU tensors, and only the launch itself is a no-op. TRITON_INTERPRET=1 and a direct
`triton.compile(ASTSource(...))` both skip the binder, so a kernel whose arguments the binder
cannot take (one named `params`, say) passes them and crashes at its first GPU launch.

Used by tests/test_triton_launch.py in a subprocess (triton must be imported without
TRITON_INTERPRET). The launched kernels do not run: outputs are whatever the buffers held."""
import functools
import subprocess
import tempfile
from pathlib import Path

import torch
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime.driver import driver

# What get_device_properties reports per target (CUDA's values for the H100 and A100 SXM).
DEVICES = {
    90: {"max_shared_mem": 232448, "max_num_regs": 65536, "multiprocessor_count": 132, "warpSize": 32,
         "sm_clock_rate": 1980000, "mem_clock_rate": 2619000, "mem_bus_width": 5120},
    80: {"max_shared_mem": 166912, "max_num_regs": 65536, "multiprocessor_count": 108, "warpSize": 32,
         "sm_clock_rate": 1410000, "mem_clock_rate": 1593000, "mem_bus_width": 5120},
}


class _Utils:
    def __init__(self, arch: int):
        self.arch = arch
        self.loaded = []          # (kernel name, shared memory bytes) of every kernel "loaded"

    def get_device_properties(self, device):
        return dict(DEVICES[self.arch])

    def load_binary(self, name, kernel, shared, device):
        # (module, function, n_regs, n_spills, n_max_threads); the real numbers come from ptxas -v
        self.loaded.append((name, shared))
        return 1, 1, 0, 0, 1024

    def unload_module(self, module):
        pass


class _NoLaunch:
    """The launcher the CUDA driver would build from the kernel's signature: takes the launch
    (grid, stream, function, metadata, hooks, the bound arguments) and does nothing."""
    launches = 0
    record = None           # a list: each launch's (kernel name, compiled hash, grid, arguments)

    def __init__(self, src, metadata):
        self.metadata = metadata

    def __call__(self, grid_0, grid_1, grid_2, stream, function, packed_metadata, launch_metadata,
                 enter_hook, exit_hook, *args):
        for size in (grid_0, grid_1, grid_2):
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"grid dimension {size!r}: must be a positive int")
        if grid_1 > 65535 or grid_2 > 65535:
            raise ValueError("grid dimensions 2 and 3 are limited to 65535 by CUDA")
        if enter_hook is not None:              # as the CUDA launcher: the hooks around the launch
            enter_hook(launch_metadata)
        _NoLaunch.launches += 1
        if _NoLaunch.record is not None:
            _NoLaunch.record.append((self.metadata.name, self.metadata.hash, (grid_0, grid_1, grid_2),
                                     tuple(_described(arg) for arg in args)))
        if exit_hook is not None:
            exit_hook(launch_metadata)


def _described(arg):
    """A launch argument as a comparable value: a tensor by dtype, shape, strides and alignment."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, tuple(arg.shape), arg.stride(), arg.data_ptr() % 16
    return arg


def _benchmarker(kernel_call, quantiles=None, **kwargs):
    """The autotuner's timing: each config is launched (so compiled and checked) once."""
    kernel_call()
    return [1.0, 1.0, 1.0] if quantiles else 1.0


class StandInDriver(DriverBase):
    """Reports one CUDA device of compute capability `arch` (90: H100, 80: A100)."""

    def __init__(self, arch: int):
        super().__init__()
        self.arch = arch
        self.utils = _Utils(arch)
        self.launcher_cls = _NoLaunch

    @classmethod
    def is_active(cls):
        return True

    def map_python_to_cpp_type(self, ty: str) -> str:
        from triton.backends.nvidia.driver import ty_to_cpp
        return ty_to_cpp(ty)

    def get_current_target(self):
        return GPUTarget("cuda", self.arch, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda

    def get_benchmarker(self):
        return _benchmarker

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device):
        return 0

    def get_device_capability(self, device=None):
        return divmod(self.arch, 10)


def activate(arch: int) -> StandInDriver:
    stand_in = StandInDriver(arch)
    driver.set_active(stand_in)
    return stand_in


def compiled_kernels(jit_function):
    """Every CompiledKernel a @triton.jit (or autotuned) function holds, with its constants."""
    fn = jit_function
    while not hasattr(fn, "device_caches"):
        fn = fn.fn
    for kernel_cache, *_ in fn.device_caches.values():
        yield from kernel_cache.values()


@functools.cache
def _ptxas(arch: int) -> str:
    """The ptxas Triton itself uses for `arch` (triton ≥ 3.5 bundles one per architecture range)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return get_ptxas(arch).path
    except ImportError:
        from triton import knobs
        return knobs.nvidia.ptxas.path


def registers_and_spills(kernel) -> tuple[int, int, int]:
    """(registers per thread, spill store bytes, spill load bytes) from `ptxas -v` on the kernel's PTX."""
    arch = kernel.metadata.target.arch
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(kernel.asm["ptx"])
        gpu = f"sm_{arch}{'a' if arch == 90 else ''}"
        cubin = str(Path(tmp) / "k.cubin")
        done = subprocess.run([_ptxas(arch), "-v", f"--gpu-name={gpu}", str(ptx), "-o", cubin],
                              capture_output=True, text=True, check=True)
    log = done.stderr
    regs = int(log.split("Used ")[1].split(" registers")[0])
    stores = int(log.split("bytes spill stores")[0].split()[-1])
    loads = int(log.split("bytes spill loads")[0].split()[-1])
    return regs, stores, loads


def named_constants(kernel) -> dict:
    """A CompiledKernel's constexprs by argument name (Triton keys them by argument index)."""
    names = kernel.src.fn.arg_names
    return {names[k[0]] if isinstance(k, tuple) else k: v for k, v in kernel.src.constants.items()}


def prefetched_loads(kernel) -> int:
    """Loads of a CompiledKernel that Triton's software pipeline issues ahead, as asynchronous copies
    into shared memory (0: each loop iteration's loads wait in line before its arithmetic)."""
    return kernel.asm["ttgir"].count("async_copy_global_to_local")
