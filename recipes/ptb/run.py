"""Word-level language modelling with MomentumLSTM variants (MomentumRNN, §3.4, Table 3).

LSTM vs MomentumLSTM vs SRLSTM (and Adam/RMSProp LSTMs) through `fairseq-train --user-dir
fairseq_momentum --arch momentum_lstm_lm`. `--full` is the paper's setting (3 layers, 1150
hidden, 400 embedding, AWD-LSTM regularisation, NT-ASGD at lr 30, batch 20, BPTT 70, 500 epochs;
Appendix A.3, Tables 6–7) on Penn Treebank; the default is a small model for 2 CPU cores on the
offline Jane Austen corpus (PTB-style tokens, 10k vocabulary). Both train and evaluate as AWD-LSTM
does: `--task language_modeling_bptt` carries the state over contiguous streams, and the test
perplexity is fairseq-validate's over the test split in one stream.

    .venv/bin/python -m recipes.ptb.run                      # small, Austen, ~10 min on 2 cores
    .venv/bin/python -m recipes.ptb.run --corpus ptb --full  # the paper's run (GPU, days)
"""
import argparse
import sys
from pathlib import Path

from recipes.common.cli import (
    add_cache_arguments,
    add_fairseq_device_arguments,
    non_negative_int,
    positive_int,
    require_distinct,
)
from recipes.common.corpora import lm_corpus
from recipes.common.fairseq_runs import REPO, preprocess_lm, validate_lm
from recipes.common.lm_experiment import plot_lm_runs, summarize, train_lm_models

# Table 7: MomentumLSTM on PTB uses μ = 0, s = 0.6; SRLSTM restarts every 2 steps with s = 0.6.
# The paper reports Adam/RMSProp LSTM perplexities on PTB (§3.5) without their constants; we use
# μ = 0 / s = 0.6 as for MomentumLSTM and β = 0.999 as in its other Adam/RMSProp runs (Tables 8–9).
CELLS = {
    "LSTM": ["--lstm-cell", "lstm"],
    "MomentumLSTM": ["--lstm-cell", "momentum", "--lstm-momentum", "0.0", "--lstm-step-size", "0.6"],
    "SRLSTM": ["--lstm-cell", "sr", "--lstm-restart", "2", "--lstm-step-size", "0.6"],
    "AdamLSTM": ["--lstm-cell", "adam", "--lstm-momentum", "0.0", "--lstm-step-size", "0.6",
                 "--lstm-beta", "0.999"],
    "RMSPropLSTM": ["--lstm-cell", "rmsprop", "--lstm-step-size", "0.6", "--lstm-beta", "0.999"],
}
# AWD-LSTM's NT-ASGD: SGD at lr 30 until the validation loss stops improving, then the average of
# the iterates (fairseq_momentum/optim/nt_asgd.py)
FULL = ["--arch", "momentum_lstm_lm_ptb", "--variable-bptt", "--optimizer", "nt_asgd", "--lr", "30",
        "--clip-norm", "0.25", "--weight-decay", "1.2e-6", "--batch-size", "20", "--max-epoch", "500",
        "--lr-scheduler", "nt_asgd", "--nonmono", "5"]
SMALL = ["--arch", "momentum_lstm_lm", "--decoder-embed-dim", "200", "--decoder-hidden-size", "400",
         "--decoder-out-embed-dim", "200", "--decoder-layers", "2", "--share-decoder-input-output-embed",
         "--decoder-dropout-in", "0.3", "--decoder-dropout-hidden", "0.2", "--decoder-dropout-out", "0.3",
         "--weight-drop", "0.2", "--optimizer", "sgd", "--lr", "20", "--clip-norm", "0.25",
         "--lr-scheduler", "reduce_lr_on_plateau", "--lr-shrink", "0.25", "--batch-size", "20"]
# AWD-LSTM's protocol: truncated BPTT over contiguous streams, the state carried from batch to batch,
# validation in 10 streams and the test split in one (fairseq_momentum/tasks/language_modeling_bptt.py)
COMMON = ["--task", "language_modeling_bptt", "--cpu", "--batch-size-valid", "10", "--log-interval", "20",
          "--num-workers", "0", "--no-epoch-checkpoints", "--no-last-checkpoints"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=["austen", "ptb", "shakespeare"], default="austen",
                        help="ptb downloads Penn Treebank (needs internet); austen/shakespeare are offline")
    parser.add_argument("--full", action="store_true", help="the paper's model and schedule (Tables 6–7)")
    parser.add_argument("--models", nargs="+", choices=list(CELLS),
                        default=["LSTM", "MomentumLSTM", "SRLSTM"])
    parser.add_argument("--seeds", nargs="+", type=non_negative_int, default=[1])
    parser.add_argument("--epochs", type=positive_int, default=None,
                        help="override the number of epochs (small: 3)")
    parser.add_argument("--max-train-tokens", type=non_negative_int, default=None,
                        help="first N training tokens, 0 = all (small default: 240k; --full: all)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "outputs" / "ptb")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "momentum_plugins")
    add_fairseq_device_arguments(parser, "where fairseq trains")
    add_cache_arguments(parser)
    args = parser.parse_args(argv)
    require_distinct(parser, args, "models", "seeds")
    return args


def main(argv=None):
    args = parse_args(argv)
    log = lambda msg: print(f"[ptb] {msg}", flush=True)  # noqa: E731
    max_train_tokens = (args.max_train_tokens if args.max_train_tokens is not None
                        else (0 if args.full else 240_000))
    source, paths = lm_corpus(args.corpus, args.cache_dir, args.out_dir, log=log,
                              **({} if args.corpus == "ptb" else {"max_train_tokens": max_train_tokens}))
    data_bin = preprocess_lm(paths, args.out_dir, log=log)
    common = [c for c in COMMON if not (args.device.type == "cuda" and c == "--cpu")]
    schedule = FULL if args.full else [*SMALL, "--max-epoch", "3"]
    if args.epochs is not None:
        schedule = [*schedule, "--max-epoch", str(args.epochs)]
    models = {name: CELLS[name] for name in args.models}
    log(f"{len(models)} models × {len(args.seeds)} seeds on {source} "
        f"({'full' if args.full else 'small'} setting)")
    runs = train_lm_models(models, data_bin, args.out_dir, [*common, *schedule], tokens_per_sample=70,
                           seeds=args.seeds, log=log, test_ppl=validate_lm)
    table = summarize(runs, args.out_dir,
                      f"Word-level LM on {source} ({'full' if args.full else 'small'} setting)")
    plots = plot_lm_runs(runs, args.out_dir, source)
    print(f"\n{table}\n")
    log(f"results: {args.out_dir / 'results.md'}; plots: {', '.join(map(str, plots))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
