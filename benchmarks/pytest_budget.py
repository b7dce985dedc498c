"""A pytest plugin for `make gpu-check`'s tests part: once the time in GPU_CHECK_DEADLINE (seconds
since the epoch) has passed, tests not yet started are skipped with REASON, so pytest ends inside
the part's budget and still writes its report (killing it would lose every result)."""
import os
import time

import pytest

REASON = "gpu-check: the tests part's time budget was spent"


def pytest_runtest_setup(item):
    deadline = os.environ.get("GPU_CHECK_DEADLINE")
    if deadline and time.time() > float(deadline):
        pytest.skip(REASON)
