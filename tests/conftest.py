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


@pytest.fixture(autouse=True)
def builtins_left_as_found():
    """Fails the test that leaves builtins' dict holding itself as `__builtins__` (exec of code that
    defines a dataclass in a namespace without `__name__` does: helpers.code_blocks), and undoes it:
    every later torch.compile in that worker could recurse without end in dynamo."""
    yield
    if vars(builtins).pop("__builtins__", None) is not None:
        pytest.fail("this test left builtins.__dict__['__builtins__'] set: run code through "
                    "helpers.code_blocks.run_as_module, whose namespace names its module")


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
