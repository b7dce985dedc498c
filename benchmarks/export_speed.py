"""What an export with a dynamic length costs at run time, against eager in the same run (CPU):
causal momentum attention (`momentum_attention`, PyTorch path; under export its chunks are
gathered and the states entering them carried by a cumulative sum and a scan over the chunks) and a
two-layer MomentumLSTM per cell (under export each layer is a scan of its step). Each is
exported once with `Dim("length")`, then timed at several lengths three ways: eager, the
torch.export program (`.module()`) and onnxruntime on `torch.onnx.export(dynamo=True)`'s model.
Eager and the program take turns `--rounds` times so that load from other processes falls on both
alike, then onnxruntime runs its rounds (see `compare`); medians are reported, with each
program's largest difference from eager.

    python benchmarks/export_speed.py                  # the sizes in docs/benchmarks.md
    python benchmarks/export_speed.py --quick          # a few seconds
"""
import argparse
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import time_once_ms  # noqa: E402
from plugins.attention import momentum_attention  # noqa: E402
from plugins.rnn import MomentumLSTM  # noqa: E402


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return momentum_attention(q, k, v, momentum=0.6, backend="torch")


class LSTMOutput(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)[0]


def onnx_session(module, inputs, dynamic_shapes, directory):
    import onnxruntime
    path = os.path.join(directory, "model.onnx")
    torch.onnx.export(module, inputs, dynamic_shapes=dynamic_shapes, dynamo=True, verbose=False).save(path)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = onnxruntime.InferenceSession(path, options)
    names = [i.name for i in session.get_inputs()]
    return lambda *xs: torch.from_numpy(session.run(None, {n: x.numpy() for n, x in zip(names, xs)})[0])


def medians(runs, rounds):
    """{key: median ms}: the callables take turns, `rounds` times."""
    times = {key: [] for key in runs}
    for _ in range(rounds):
        for key, run in runs.items():
            times[key].append(time_once_ms(run, "cpu"))
    return {key: statistics.median(values) for key, values in times.items()}


def compare(name, module, make_inputs, length_dims, lengths, rounds):
    """Rows (name, length, eager ms, × eager of the program and of onnxruntime, their max |diff|).
    onnxruntime runs after every torch timing of the op: its idle threads spin on the cores for a
    while after each run (its default, which users get), which would slow a torch turn after it."""
    traced = make_inputs(lengths[0])
    dims = tuple({d: torch.export.Dim("length", min=1, max=65536)} for d in length_dims)
    program = torch.export.export(module, traced, dynamic_shapes=dims).module()
    inputs = {length: make_inputs(length) for length in lengths}
    want = {length: module(*xs) for length, xs in inputs.items()}
    torch_ms = {length: medians({"eager": lambda: module(*xs), "export": lambda: program(*xs)}, rounds)
                for length, xs in inputs.items()}
    with tempfile.TemporaryDirectory() as directory:
        runtime = onnx_session(module, traced, dims, directory)
        rows = []
        for length, xs in inputs.items():
            error = {key: (run(*xs) - want[length]).abs().max().item()
                     for key, run in (("export", program), ("onnxruntime", runtime))}
            ort_ms = medians({"onnxruntime": lambda: runtime(*xs)}, rounds)["onnxruntime"]
            eager = torch_ms[length]["eager"]
            rows.append((name, length, eager, torch_ms[length]["export"] / eager, ort_ms / eager,
                         error["export"], error["onnxruntime"]))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, three rounds")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7, quick 3)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rounds = args.rounds or (3 if args.quick else 7)
    heads, dim, hidden, batch = (2, 16, 32, 2) if args.quick else (4, 64, 256, 8)
    attention_lengths = (100, 300) if args.quick else (1024, 4096, 16384)
    lstm_lengths = (20, 60) if args.quick else (128, 512, 2048)
    rows = []
    with torch.no_grad():
        qkv = lambda n: tuple(torch.randn(1, heads, n, dim) for _ in range(3))
        rows += compare(f"attention B1-H{heads}-D{dim}", Attention().eval(), qkv, (2, 2, 2),
                        attention_lengths, rounds)
        for cell in ("lstm", "momentum", "adam"):
            layer = LSTMOutput(MomentumLSTM(hidden, hidden, 2, cell=cell)).eval()
            sequence = lambda n: (torch.randn(n, batch, hidden),)
            rows += compare(f"MomentumLSTM {cell} 2x{hidden} B{batch}", layer, sequence, (0,), lstm_lengths,
                            rounds)
    print("| op | length | eager ms | export × eager | onnxruntime × eager | max diff export / ort |")
    print("|---|---|---|---|---|---|")
    for name, length, eager, program, runtime, e_program, e_runtime in rows:
        print(f"| {name} | {length} | {eager:.1f} | {program:.2f} | {runtime:.2f} | "
              f"{e_program:.1e} / {e_runtime:.1e} |")
    return rows


if __name__ == "__main__":
    main()
