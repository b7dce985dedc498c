"""Training words/s and generation tokens/s of the fairseq_momentum architectures against
fairseq's own at equal sizes, on CPU, in one process (ratios are same-run).

- momentum_transformer (cross-attention momentum, and softmax) vs transformer, source
  lengths 64 -> 2048: 2+2 layers, d_model 256, 4 heads, FFN 1024.
- momentum_lstm vs lstm (translation, 1 layer, 256 units), source length 64.
- momentum_lstm_lm vs lstm_lm (2 layers, 256 units), 64-token blocks.

Training: forward + backward + Adam step on a random batch; words/s counts target tokens
(fairseq's wps). Generation: fairseq's SequenceGenerator, beam 4, exactly GEN_LEN new
tokens per sentence; tokens/s counts the best hypothesis' tokens (batch x GEN_LEN).
Each cell is the median of REPEATS timed runs after one warm-up; the models of one row are
timed alternately, so their ratio is measured under the same machine load.

    .venv/bin/python benchmarks/fairseq_speed.py            # lengths 64 ... 2048
    .venv/bin/python benchmarks/fairseq_speed.py --quick    # lengths 64, 256, fewer repeats
"""
import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fairseq import options, tasks  # noqa: E402
from fairseq.sequence_generator import SequenceGenerator  # noqa: E402

import fairseq_momentum  # noqa: E402

VOCAB, BATCH, GEN_LEN, BEAM = 8000, 4, 32, 4
TRANSFORMER = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "256",
               "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
               "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
               "--decoder-attention-heads", "4", "--max-source-positions", "4096",
               "--max-target-positions", "4096"]
LSTM = ["--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-hidden-size", "256",
        "--decoder-hidden-size", "256", "--decoder-out-embed-dim", "256"]
LSTM_LM = ["--decoder-embed-dim", "256", "--decoder-hidden-size", "256", "--decoder-layers", "2",
           "--decoder-out-embed-dim", "256"]
TRANSLATION = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt"]
LM = ["--task", "language_modeling", "--tokens-per-sample", "4096"]


def build(data, task_args, arch_args):
    model, task, _ = build_with_args(data, task_args, arch_args)
    return model, task


def build_with_args(data, task_args, arch_args):
    """(model, task, parsed arguments) of a fairseq-train command line without dropout."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data), "--user-dir", fairseq_momentum.__path__[0],
                                                "--cpu", "--dropout", "0", *task_args, *arch_args])
    task = tasks.setup_task(args)
    return task.build_model(args), task, args


def write_dicts(directory):
    words = "".join(f"w{i} 1\n" for i in range(VOCAB - 4))
    for name in ("dict.txt", "dict.src.txt", "dict.tgt.txt"):
        (directory / name).write_text(words)


def random_batch(task, batch, src_len, tgt_len, generator):
    d = task.target_dictionary
    src = torch.randint(d.nspecial, len(d), (batch, src_len), generator=generator)
    tgt = torch.randint(d.nspecial, len(d), (batch, tgt_len), generator=generator)
    prev = torch.cat([torch.full((batch, 1), d.eos()), tgt[:, :-1]], 1)
    return src, prev, tgt


def train_step_fn(model, task, src_len, tgt_len, seq2seq):
    g = torch.Generator().manual_seed(0)
    src, prev, tgt = random_batch(task, BATCH, src_len, tgt_len, g)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    lengths = torch.full((BATCH,), src_len)

    def step():
        model.train()
        out = model(src, lengths, prev)[0] if seq2seq else model(prev)[0]
        loss = F.cross_entropy(out.reshape(-1, out.size(-1)), tgt.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return tgt.numel()
    return step


def generate_fn(model, task, src_len, seq2seq):
    g = torch.Generator().manual_seed(1)
    src, _, _ = random_batch(task, BATCH, src_len if seq2seq else 1, 1, g)
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=BEAM, max_len_a=0,
                                  max_len_b=GEN_LEN, min_len=GEN_LEN)
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.full((BATCH,), src.size(1))}}

    def step():
        model.eval()
        with torch.no_grad():
            hyps = generator.generate([model], sample)
        return sum(len(h[0]["tokens"]) - 1 for h in hyps)
    return step


def timed_rate(steps, repeats):
    """Per step function: median over repeats of work units / s, run alternately."""
    for step in steps:
        step()
    rates = [[] for _ in steps]
    for _ in range(repeats):
        for i, step in enumerate(steps):
            start = time.perf_counter()
            units = step()
            rates[i].append(units / (time.perf_counter() - start))
    return [statistics.median(r) for r in rates]


def row(data, name, configs, seq2seq, src_len, tgt_len, repeats):
    models = [build(data, task_args, arch_args) for task_args, arch_args in configs]
    train = timed_rate([train_step_fn(m, t, src_len, tgt_len, seq2seq) for m, t in models], repeats)
    gen = timed_rate([generate_fn(m, t, src_len, seq2seq) for m, t in models], repeats)
    return [name, src_len if seq2seq else f"({tgt_len}-token blocks)"] + train + gen


def fmt(r, n):
    name, length, vals = r[0], r[1], r[2:]
    train, gen = vals[:n], vals[n:]
    cells = [f"{v:,.0f}" for v in train] + [f"{train[i] / train[0]:.2f}" for i in range(1, n)]
    cells += [f"{v:,.0f}" for v in gen] + [f"{gen[i] / gen[0]:.2f}" for i in range(1, n)]
    return f"| {name} | {length} | " + " | ".join(cells) + " |"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="lengths 64 and 256, 2 repeats")
    parser.add_argument("--lengths", type=int, nargs="+", help="source lengths of the transformer rows")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on a shared, oversubscribed machine 2 threads stall)")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    lengths = a.lengths or ([64, 256] if a.quick else [64, 128, 256, 512, 1024, 2048])
    repeats = 2 if a.quick else a.repeats
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        write_dicts(data)
        print(f"fairseq speed, {date.today()}, {platform.processor() or platform.machine()}, "
              f"{a.threads} threads, batch {BATCH}, beam {BEAM}, {GEN_LEN} generated tokens\n")
        print("| model (vs baseline) | src len | train wps: transformer | momentum | softmax-cross "
              "| ratio m | ratio s | gen tok/s: transformer | momentum | softmax-cross | ratio m | ratio s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for n in lengths:
            tgt = min(n, 256)
            r = row(data, "momentum_transformer", [
                (TRANSLATION, ["--arch", "transformer", *TRANSFORMER]),
                (TRANSLATION, ["--arch", "momentum_transformer", *TRANSFORMER]),
                (TRANSLATION, ["--arch", "momentum_transformer", *TRANSFORMER,
                               "--cross-attention", "softmax"]),
            ], True, n, tgt, repeats)
            print(fmt(r, 3), flush=True)
        print("\n| model (vs baseline) | src len | train wps: baseline | momentum | ratio "
              "| gen tok/s: baseline | momentum | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        r = row(data, "momentum_lstm vs lstm", [
            (TRANSLATION, ["--arch", "lstm", *LSTM]),
            (TRANSLATION, ["--arch", "momentum_lstm", *LSTM, "--lstm-cell", "momentum"]),
        ], True, 64, 64, repeats)
        print(fmt(r, 2), flush=True)
        r = row(data, "momentum_lstm_lm vs lstm_lm", [
            (LM, ["--arch", "lstm_lm", *LSTM_LM]),
            (LM, ["--arch", "momentum_lstm_lm", *LSTM_LM, "--lstm-cell", "momentum"]),
        ], False, 64, 64, repeats)
        print(fmt(r, 2), flush=True)


if __name__ == "__main__":
    main()
