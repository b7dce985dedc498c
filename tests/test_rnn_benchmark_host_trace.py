"""benchmarks/rnn.py --host-trace (a step of gpu_call.sh): one forward+backward of each variant at the
first shape, its host self time by kind (benchmarks/host_trace.py), where the momentum cell's own
Python shows as the library's and nn.LSTM called one layer at a time has none of it; the CLI prints
one section per variant in place of the timing table."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import rnn  # noqa: E402
import torch  # noqa: E402

LIBRARY = "momentum-plugins (Python)"
TORCH = tuple(int(part) for part in torch.__version__.split(".")[:2])


def test_each_variant_is_traced_and_only_the_momentum_cell_runs_the_librarys_python():
    traces = dict(rnn.host_traces("tiny", ["nn.LSTM-per-layer", "momentum"], "cpu"))
    assert list(traces) == ["Host trace: nn.LSTM-per-layer, tiny, forward+backward",
                            "Host trace: momentum, tiny, forward+backward"]
    per_layer, momentum = traces.values()
    assert per_layer["steps"] == momentum["steps"] == 5
    assert per_layer["kinds"]["aten ops"] > 0 and momentum["kinds"]["aten ops"] > 0
    assert per_layer["kinds"][LIBRARY] == 0
    # torch 2.11 under Python 3.12 records no Python frames (host_trace says so in its section)
    assert momentum["kinds"][LIBRARY] > 0 or (not momentum["python_frames"] and TORCH < (2, 13))


def test_the_cli_prints_a_section_per_variant_instead_of_the_table():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rnn.py"), "--host-trace", "--shapes",
                           "tiny", "--variants", "nn.LSTM-per-layer", "momentum", "--threads", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    titles = [line for line in proc.stdout.splitlines() if line.startswith("Host trace:")]
    assert titles == ["Host trace: nn.LSTM-per-layer, tiny, forward+backward",
                      "Host trace: momentum, tiny, forward+backward"]
    assert "| kind | µs per step | share |" in proc.stdout and "× nn.LSTM" not in proc.stdout
