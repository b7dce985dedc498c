"""Train one copy-task model with the recipes' shared accelerate loop (recipes/common/training.py)
and record Figure 1's curves (loss / accuracy vs step and training time)."""
import itertools
from dataclasses import dataclass, field
from typing import List

import torch
from torch.nn import functional as F

from recipes.common.training import fit, make_accelerator

from .config import CopyConfig
from .data import CopyBatch, copy_batch
from .model import VARIANTS, CopyTransformer

TEST_SEED_OFFSET = 1_000_003


@dataclass
class History:
    steps: List[int] = field(default_factory=list)
    seconds: List[float] = field(default_factory=list)   # training time only, no evaluation
    train_loss: List[float] = field(default_factory=list)
    test_loss: List[float] = field(default_factory=list)
    test_accuracy: List[float] = field(default_factory=list)


def masked_loss_and_accuracy(logits, batch: CopyBatch):
    """Cross-entropy and next-token accuracy over the second copy of w only."""
    mask = batch.loss_mask
    picked, targets = logits[mask], batch.targets[mask]
    loss = F.cross_entropy(picked, targets)
    accuracy = (picked.argmax(-1) == targets).float().mean()
    return loss, accuracy


def to_device(batch: CopyBatch, device) -> CopyBatch:
    return CopyBatch(*(t.to(device) for t in batch))


def test_set(config: CopyConfig, seed: int, device="cpu") -> List[CopyBatch]:
    generator = torch.Generator().manual_seed(seed + TEST_SEED_OFFSET)
    return [to_device(copy_batch(config.batch_size, config.max_length, config.n_symbols,
                                 generator), device) for _ in range(config.eval_batches)]


@torch.no_grad()
def evaluate(model, batches: List[CopyBatch]):
    model.eval()
    losses, accs = zip(*(masked_loss_and_accuracy(model(b.tokens), b) for b in batches))
    model.train()
    return float(torch.stack(losses).mean()), float(torch.stack(accs).mean())


def train_copy_model(name: str, config: CopyConfig, seed: int, progress: bool = True,
                     device="cpu") -> History:
    """RAdam, lr / 10 from `config.lr_drop_step`; the test loss and accuracy every `eval_every`
    steps on a fixed test set. Fresh batches come from a generator seeded by `seed`."""
    accelerator = make_accelerator(device)
    torch.manual_seed(seed)
    model = CopyTransformer(VARIANTS[name], n_symbols=config.n_symbols,
                            max_length=config.max_length, layers=config.layers,
                            heads=config.heads, head_dim=config.head_dim, dropout=config.dropout,
                            layer_types=config.layer_types)
    optimizer = torch.optim.RAdam(model.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 1.0 if step < config.lr_drop_step else 0.1)
    generator = torch.Generator().manual_seed(seed)
    tests = test_set(config, seed, accelerator.device)
    batches = (copy_batch(config.batch_size, config.max_length, config.n_symbols, generator)
               for _ in itertools.count())

    def loss_fn(model, batch: CopyBatch):
        batch = to_device(batch, accelerator.device)
        return masked_loss_and_accuracy(model(batch.tokens), batch)[0]

    def test_metrics(model):
        return dict(zip(("test_loss", "test_accuracy"), evaluate(model, tests)))

    _, run = fit(model, optimizer, batches, loss_fn, accelerator=accelerator, steps=config.steps,
                 eval_every=config.eval_every, evaluate=test_metrics, schedule=schedule, progress=progress,
                 desc=f"{name} seed {seed}")
    return History(steps=run.steps, seconds=run.seconds, train_loss=run.train["loss"],
                   test_loss=run.eval["test_loss"], test_accuracy=run.eval["test_accuracy"])
