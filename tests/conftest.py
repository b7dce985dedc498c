import zlib

import pytest
import torch


@pytest.fixture
def make_generator(request):
    """A generator seeded from the test's id: fresh inputs per case, reproducible per run."""
    def make(extra: str = "") -> torch.Generator:
        return torch.Generator().manual_seed(zlib.crc32((request.node.nodeid + extra).encode()))
    return make
