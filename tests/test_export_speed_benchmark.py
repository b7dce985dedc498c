"""benchmarks/export_speed.py at its quick sizes: every row's exported program and onnxruntime
model agree with eager (the benchmark times what it claims to), and each time is a measurement."""
import math

import pytest

from benchmarks.export_speed import main


def test_every_timed_program_equals_eager():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    rows = main(["--quick", "--rounds", "1"])
    assert [row[0].split()[0] for row in rows] == ["attention"] * 2 + ["MomentumLSTM"] * 6
    for name, length, eager, program, runtime, e_program, e_runtime in rows:
        assert e_program < 1e-4 and e_runtime < 1e-4, (name, length)
        assert all(math.isfinite(x) and x > 0 for x in (eager, program, runtime)), (name, length)
