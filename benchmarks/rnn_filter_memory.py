"""Peak memory of the momentum filters on long sequences (plugins.rnn.filters).

The momentum of eq. 9 / Section 2.4 over a whole sequence is s Σ_k M[t, k] g_k; the layers
form M only chunk by chunk from its closed form (O(T·chunk) memory), never as a T × T matrix
(T = 50,000 in float64 would be 20 GB). For each T and cell, one subprocess builds a
MomentumLSTM(4 → 8, μ = 0.999, batch 2, carried momentum, rows at different step counts) and
runs one forward (+ backward unless --no-grad); its peak resident set size minus the resident
size just before the call is reported, next to the plain cell ("lstm", no filter) at the
same T, the baseline of the same run.

    python benchmarks/rnn_filter_memory.py                 # T = 1,000 … 50,000
    python benchmarks/rnn_filter_memory.py --lengths 20000 --cells momentum sr
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CELLS = ["lstm", "momentum", "nag", "sr"]


def current_rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def worker(cell, length, grad):
    import torch

    sys.path.insert(0, str(ROOT))
    from plugins.rnn import MomentumLSTM, RecurrentState
    from plugins.rnn.variants import read_hyperparameters

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layer = MomentumLSTM(4, 8, cell=cell, restart=2 if cell == "sr" else None,
                         **read_hyperparameters(cell, momentum=0.999))
    state = RecurrentState(torch.zeros(1, 2, 8), torch.zeros(1, 2, 8),
                           None if cell == "lstm" else torch.randn(1, 2, 32), None,
                           torch.tensor([0, 5]))
    layer(torch.randn(8, 2, 4), state)[0].sum().backward()
    x = torch.randn(length, 2, 4)
    before = current_rss_kib()
    start = time.perf_counter()
    with torch.set_grad_enabled(grad):
        out, _ = layer(x, state)
        if grad:
            out.sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(cell=cell, T=length, peak_mib=(peak - before) / 1024, seconds=seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", nargs="+", type=int, default=[1000, 10000, 50000])
    parser.add_argument("--cells", nargs="+", choices=CELLS, default=CELLS)
    parser.add_argument("--no-grad", action="store_true", help="forward only")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), not args.no_grad)))
        return
    cells = ["lstm"] + [c for c in args.cells if c != "lstm"]
    print(f"{'T':>7} {'cell':<9} {'peak MiB':>9} {'x lstm':>7} {'seconds':>8} {'T×T f64 would be':>17}")
    for length in args.lengths:
        base = None
        for cell in cells:
            cmd = [sys.executable, __file__, "--worker", cell, str(length)]
            cmd += ["--no-grad"] if args.no_grad else []
            result = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            base = result["peak_mib"] if cell == "lstm" else base
            ratio = result["peak_mib"] / base if base else float("nan")
            dense = length * length * 8 / 2 ** 20
            print(f"{length:>7} {cell:<9} {result['peak_mib']:>9.1f} {ratio:>7.2f} "
                  f"{result['seconds']:>8.2f} {dense:>13.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
