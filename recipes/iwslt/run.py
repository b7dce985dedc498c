"""Translation: momentum vs linear vs softmax transformers, MomentumLSTM vs LSTM, through fairseq.

sentencepiece BPE → fairseq-preprocess → fairseq-train --user-dir fairseq_momentum →
fairseq-generate (beam 5) → sacrebleu, reporting BLEU and generation speed per model.
`--corpus iwslt14` prepares IWSLT'14 De→En like fairseq's examples/translation (needs internet);
the offline default is English→Spanish Bible verse pairs (Debian SWORD modules, whole books held
out). `--full` uses the *_iwslt_de_en presets and fairseq's IWSLT schedule; the default is a small
configuration for 2 CPU cores.

    .venv/bin/python -m recipes.iwslt.run                          # small, offline
    .venv/bin/python -m recipes.iwslt.run --corpus iwslt14 --full  # the IWSLT setting (GPU)
"""
import argparse
import re
import sys
from pathlib import Path

from recipes.common.cache import build_once, inputs_digest
from recipes.common.cli import (
    add_cache_arguments,
    add_fairseq_device_arguments,
    bounded_int,
    non_negative_int,
    positive_int,
    require_distinct,
)
from recipes.common.fairseq_runs import REPO, SPLITS, checkpoint_dir, run, tool, train
from recipes.common.parallel import LANGUAGES, parallel_corpus
from recipes.common.plots import plot_curves, write_results

MODELS = {
    "momentum transformer": ("momentum_transformer", "momentum_transformer_iwslt_de_en",
                             ["--attention-momentum", "0.6"]),
    "linear transformer": ("linear_transformer", "linear_transformer_iwslt_de_en", []),
    "softmax transformer": ("transformer", "transformer_iwslt_de_en", []),
    "MomentumLSTM": ("momentum_lstm", "momentum_lstm_wiseman_iwslt_de_en",
                     ["--lstm-cell", "momentum", "--lstm-momentum", "0.6", "--lstm-step-size", "0.6"]),
    "LSTM": ("lstm", "lstm_wiseman_iwslt_de_en", []),
}
SMALL_TRANSFORMER = ["--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
                     "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
                     "--encoder-layers", "2", "--decoder-layers", "2",
                     "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
SMALL_LSTM = ["--encoder-embed-dim", "128", "--decoder-embed-dim", "128", "--encoder-hidden-size", "256",
              "--decoder-hidden-size", "256", "--decoder-out-embed-dim", "128"]
COMMON = ["--task", "translation", "--share-all-embeddings", "--optimizer", "adam",
          "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0", "--lr-scheduler", "inverse_sqrt",
          "--warmup-updates", "4000", "--lr", "5e-4",
          "--dropout", "0.3", "--weight-decay", "0.0001", "--criterion", "label_smoothed_cross_entropy",
          "--label-smoothing", "0.1", "--max-tokens", "4096", "--num-workers", "0", "--log-interval", "20",
          "--no-epoch-checkpoints", "--no-last-checkpoints"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=["bible", "iwslt14"], default="bible")
    parser.add_argument("--full", action="store_true", help="IWSLT presets and schedule (GPU-sized)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--epochs", type=positive_int, default=None,
                        help="max epochs (small default: 4, full: 60)")
    parser.add_argument("--max-train-pairs", type=non_negative_int, default=0,
                        help="first N training pairs (0 = all)")
    parser.add_argument("--max-test-pairs", type=non_negative_int, default=0,
                        help="generate and score the first N test pairs only (0 = all)")
    parser.add_argument("--bpe-size", type=lambda text: bounded_int(text, 100), default=8000,
                        help="sentencepiece vocabulary size (>= 100)")
    parser.add_argument("--seed", type=non_negative_int, default=1)
    parser.add_argument("--out-dir", type=Path, default=REPO / "outputs" / "iwslt")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "momentum_plugins")
    add_fairseq_device_arguments(parser, "where fairseq trains and generates")
    add_cache_arguments(parser)
    args = parser.parse_args(argv)
    require_distinct(parser, args, "models")
    return args


def keep_first(prefix, langs, n):
    """Cut both sides of a split to its first n pairs (n = 0 keeps all)."""
    if not n:
        return
    for lang in langs:
        path = Path(f"{prefix}.{lang}")
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)[:n]
        path.write_text("".join(lines), encoding="utf-8")


def apply_bpe(prefixes, src, tgt, out, vocab_size):
    """Joint sentencepiece BPE trained on the training split; returns the encoded prefixes."""
    import sentencepiece as spm

    model = out / "spm"
    spm.SentencePieceTrainer.train(input=[f"{prefixes['train']}.{src}", f"{prefixes['train']}.{tgt}"],
                                   model_prefix=str(model), vocab_size=vocab_size, model_type="bpe",
                                   character_coverage=1.0, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=f"{model}.model")
    encoded = {}
    for split, prefix in prefixes.items():
        for lang in (src, tgt):
            lines = Path(f"{prefix}.{lang}").read_text(encoding="utf-8").splitlines()
            pieces = sp.encode(lines, out_type=str)
            Path(out / f"{split}.bpe.{lang}").write_text("".join(" ".join(p) + "\n" for p in pieces),
                                                         encoding="utf-8")
        encoded[split] = out / f"{split}.bpe"
    return encoded


def generate(data_bin, checkpoint, src, tgt, references, gpu, beam=5):
    """fairseq-generate on test, detokenised with sentencepiece; BLEU with sacrebleu; speed as
    fairseq reports it."""
    import sacrebleu

    output = run([tool("fairseq-generate"), data_bin, "--user-dir", REPO / "fairseq_momentum",
                  "--path", checkpoint, "--gen-subset", "test", "--beam", str(beam), "--batch-size", "64",
                  "--post-process", "sentencepiece", "--max-len-a", "1.2", "--max-len-b", "10",
                  "--source-lang", src, "--target-lang", tgt, *([] if gpu else ["--cpu"])])
    hyps = {}
    for line in output.splitlines():
        if line.startswith("D-"):
            idx, _, text = line[2:].split("\t", 2)
            hyps[int(idx)] = text
    hypotheses = [hyps.get(i, "") for i in range(len(references))]
    speed = re.search(r"Translated ([0-9,]+) sentences \(([0-9,]+) tokens\) in ([0-9.]+)s "
                      r"\(([0-9.]+) sentences/s, ([0-9.]+) tokens/s\)", output)
    tokens_per_s = float(speed.group(5)) if speed else float("nan")
    return sacrebleu.corpus_bleu(hypotheses, [references]).score, tokens_per_s


def prepare_data(args, log=print):
    """Raw pairs → sentencepiece BPE → fairseq-preprocess, each step in a folder of `--out-dir` keyed
    by its arguments and inputs (reused only when they match). Returns (src, tgt, raw prefixes, data-bin)."""
    out = args.out_dir
    src, tgt = LANGUAGES[args.corpus]

    def build_raw(folder: Path) -> None:
        _, _, _, written = parallel_corpus(args.corpus, args.cache_dir, folder)
        keep_first(written["train"], (src, tgt), args.max_train_pairs)
        keep_first(written["test"], (src, tgt), args.max_test_pairs)

    raw_params = {"source": args.corpus, "max_train_pairs": args.max_train_pairs,
                  "max_test_pairs": args.max_test_pairs}
    raw = build_once(out, f"raw-{args.corpus}", raw_params, build_raw, log=log)
    prefixes = {split: raw / split for split in SPLITS}
    raw_files = [Path(f"{prefixes[split]}.{lang}") for split in SPLITS for lang in (src, tgt)]
    bpe = build_once(out, "bpe", {"bpe_size": args.bpe_size, "inputs": inputs_digest(raw_files)},
                     lambda folder: apply_bpe(prefixes, src, tgt, folder, args.bpe_size), log=log)
    encoded = {split: bpe / f"{split}.bpe" for split in SPLITS}

    def binarize(folder: Path) -> None:
        run([tool("fairseq-preprocess"), "--source-lang", src, "--target-lang", tgt,
             "--trainpref", encoded["train"], "--validpref", encoded["valid"], "--testpref", encoded["test"],
             "--destdir", folder,
             "--joined-dictionary", "--workers", "2"], log=folder / "preprocess.log")

    bpe_files = [Path(f"{encoded[split]}.{lang}") for split in SPLITS for lang in (src, tgt)]
    data_bin = build_once(out, f"data-bin-{args.corpus}",
                          {"tool": "fairseq-preprocess --joined-dictionary",
                           "inputs": inputs_digest(bpe_files)},
                          binarize, log=log)
    return src, tgt, prefixes, data_bin


def main(argv=None):
    args = parse_args(argv)
    out = args.out_dir
    log = lambda msg: print(f"[iwslt] {msg}", flush=True)  # noqa: E731
    src, tgt, prefixes, data_bin = prepare_data(args, log)
    references = Path(f"{prefixes['test']}.{tgt}").read_text(encoding="utf-8").splitlines()
    epochs = args.epochs or (60 if args.full else 4)
    rows, curves = [], {}
    for i, name in enumerate(args.models, 1):
        small_arch, full_arch, extra = MODELS[name]
        sizes = SMALL_LSTM if "lstm" in small_arch else SMALL_TRANSFORMER
        arch = ["--arch", full_arch] if args.full else ["--arch", small_arch, *sizes]
        log(f"({i}/{len(args.models)}) training {name} for {epochs} epochs …")
        train_args = [*COMMON, *arch, *extra, "--max-epoch", str(epochs), "--seed", str(args.seed),
                      *([] if args.device.type == "cuda" else ["--cpu"])]
        save_dir = checkpoint_dir(out / "checkpoints", name, data_bin, train_args)
        result = train(name, data_bin, save_dir, train_args)
        bleu, speed = generate(data_bin, result.save_dir / "checkpoint_best.pt", src, tgt, references,
                               args.device.type == "cuda")
        log(f"    BLEU {bleu:.2f}, generation {speed:.0f} tokens/s, training {result.seconds:.0f} s")
        rows.append([name, f"{bleu:.2f}", f"{float(result.valid[-1]['valid_loss']):.3f}", f"{speed:.0f}",
                     f"{result.seconds:.0f}"])
        curves[name] = [(float(v["epoch"]), float(v["valid_loss"])) for v in result.valid]
    headers = ["model", "test BLEU", "valid loss", "generate tokens/s", "train time (s)"]
    table = write_results(
        out, f"Translation {src}→{tgt} on {args.corpus} ({'full' if args.full else 'small'})", headers, rows)
    plot = plot_curves(curves, out / "valid_loss.png", xlabel="epoch", ylabel="validation loss",
                       title=f"{src}→{tgt} on {args.corpus}: validation loss")
    print(f"\n{table}\n")
    log(f"results: {out / 'results.md'}; plot: {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
