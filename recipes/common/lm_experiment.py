"""Train several fairseq language models on one binarised corpus and summarise them: the
shared core of the demo and the PTB recipe."""
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Dict, List, Sequence

from .fairseq_runs import TrainResult, checkpoint_dir, eval_lm, train
from .plots import plot_curves, write_results
from .stats import mean_std


@dataclass
class LMRun:
    name: str
    seed: int
    result: TrainResult
    test_ppl: float


def train_lm_models(models: Dict[str, List[str]], data_bin: Path, out: Path, common: Sequence[str],
                    tokens_per_sample: int, seeds: Sequence[int] = (1,), log=print,
                    on_done=None, test_ppl=None) -> List[LMRun]:
    """fairseq-train each model once per seed (`common` must set --tokens-per-sample to
    `tokens_per_sample`), then score its best checkpoint on test: `test_ppl(data_bin, checkpoint)`,
    by default fairseq-eval-lm in blocks of the training length; `on_done(name, seed)` after each
    (progress reports)."""
    if test_ppl is None:
        test_ppl = partial(eval_lm, tokens_per_sample=tokens_per_sample)
    runs = []
    total = len(models) * len(seeds)
    for name, model_args in models.items():
        for seed in seeds:
            log(f"({len(runs) + 1}/{total}) training {name}, seed {seed} …")
            args = [*common, "--tokens-per-sample", str(tokens_per_sample), *model_args, "--seed", str(seed)]
            save_dir = checkpoint_dir(out / "checkpoints", f"{name}.seed{seed}", data_bin, args)
            result = train(name, data_bin, save_dir, args)
            test = test_ppl(data_bin, save_dir / "checkpoint_best.pt")
            log(f"    valid ppl {result.best_valid_ppl:.1f}, test ppl {test:.1f}, {result.seconds:.0f} s")
            runs.append(LMRun(name, seed, result, test))
            if on_done is not None:
                on_done(name, seed)
    return runs


def summarize(runs: List[LMRun], out: Path, title: str) -> str:
    """Markdown table (mean ± std over seeds) written to out/results.{md,csv}; returns the table."""
    names = list(dict.fromkeys(r.name for r in runs))
    headers = ["model", "seeds", "valid ppl", "test ppl", "train time (s)"]
    rows = []
    for name in names:
        mine = [r for r in runs if r.name == name]
        rows.append([name, len(mine), mean_std([r.result.best_valid_ppl for r in mine], 1),
                     mean_std([r.test_ppl for r in mine], 1), mean_std([r.result.seconds for r in mine], 0)])
    return write_results(out, title, headers, rows)


def plot_lm_runs(runs: List[LMRun], out: Path, corpus: str) -> List[Path]:
    """Training loss vs update and vs wall time, validation perplexity vs epoch (first seed)."""
    first = {}
    for r in runs:
        first.setdefault(r.name, r)
    train = {n: [(float(t["num_updates"]), float(t["loss"])) for t in r.result.train]
             for n, r in first.items()}
    wall = {n: [(float(t["wall"]), float(t["loss"])) for t in r.result.train] for n, r in first.items()}
    valid = {n: [(float(v["epoch"]), float(v["valid_ppl"])) for v in r.result.valid]
             for n, r in first.items()}
    return [
        plot_curves(train, out / "convergence.png", xlabel="update", ylabel="train loss (base 2)",
                    title=f"Language models on {corpus}: training loss"),
        plot_curves(wall, out / "convergence_wall.png", xlabel="wall time (s)", ylabel="train loss (base 2)",
                    title=f"Language models on {corpus}: training loss vs time"),
        plot_curves(valid, out / "valid_ppl.png", xlabel="epoch", ylabel="validation perplexity",
                    title=f"Language models on {corpus}: validation perplexity", logy=True),
    ]
