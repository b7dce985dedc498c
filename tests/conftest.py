import builtins
import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    # Without a GPU the Triton kernels run on CPU tensors through Triton's interpreter. Set before
    # any test module imports triton (importing torch does not).
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # make test runs one pytest-xdist worker per core: one intra-op thread each, not a core each
    torch.set_num_threads(1)


@pytest.fixture
def make_generator(request):
    """A generator seeded from the test's id: fresh inputs per case, reproducible per run."""
    def make(extra: str = "") -> torch.Generator:
        return torch.Generator().manual_seed(zlib.crc32((request.node.nodeid + extra).encode()))
    return make


@pytest.fixture
def inductor_cpp_without_simd():
    """Inductor's C++ code generation without vector instructions, for the tests that compile with
    inductor on the CPU: its search for vectorised loop tilings (sympy simplification under symbolic
    shapes) took more than half of such a compile here (packed rows' forward and backward: 84 s with
    it, 38 s without; torch 2.13). These tests check our graphs through inductor's lowering, its
    saved tensors and strides, not its vectoriser."""
    import torch._inductor.config as inductor_config
    with inductor_config.patch({"cpp.simdlen": 1}):      # no vector ISA has 1 bit: none is picked
        yield


def _process_state():
    """What one test could leave changed for every later test of its worker: (reading, undo)."""
    return {
        "builtins.__dict__ holds '__builtins__'": (
            "__builtins__" in vars(builtins), lambda was: vars(builtins).pop("__builtins__", None)),
        "torch.get_default_dtype()": (torch.get_default_dtype(), torch.set_default_dtype),
        "torch.is_grad_enabled()": (torch.is_grad_enabled(), torch.set_grad_enabled),
        "torch.get_float32_matmul_precision()": (torch.get_float32_matmul_precision(),
                                                 torch.set_float32_matmul_precision),
        "torch.are_deterministic_algorithms_enabled()": (torch.are_deterministic_algorithms_enabled(),
                                                         torch.use_deterministic_algorithms),
        "torch.is_autocast_enabled('cpu')": (torch.is_autocast_enabled("cpu"),
                                             lambda was: torch.set_autocast_enabled("cpu", was)),
        "torch.get_num_threads()": (torch.get_num_threads(), torch.set_num_threads),
        "os.getcwd()": (os.getcwd(), os.chdir),
    }


@pytest.fixture(autouse=True)
def process_state_left_as_found():
    """Fails the test that leaves process-wide state changed, and undoes the change, so that no
    later test of its worker runs in it. One such leak failed CI (stop 80): exec of code defining a
    dataclass in a namespace without `__name__` left builtins' dict holding itself as
    `__builtins__` (run such code through helpers.code_blocks.run_as_module), and a later
    torch.compile recursed without end in dynamo."""
    before = _process_state()
    yield
    changed = []
    for name, (now, undo) in _process_state().items():
        was = before[name][0]
        if now != was:
            changed.append(f"{name}: {was!r} -> {now!r}")
            undo(was)
    if changed:
        pytest.fail("this test left process-wide state changed (undone now): " + "; ".join(changed))


def pytest_collection_modifyitems(config, items):
    """Tests marked `slow` go first, so that under pytest-xdist no long test starts at the end of
    the run (make test's --dist loadscope --no-loadscope-reorder sends modules in this order).
    Tests marked `gpu` need a CUDA device; elsewhere they are skipped with the reason shown."""
    items.sort(key=lambda item: "slow" not in item.keywords)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine); "
                                   "runs where torch.cuda.is_available()")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
