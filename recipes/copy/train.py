"""Train one copy-task model and record Figure 1's curves (loss / accuracy vs step and time)."""
import time
from dataclasses import dataclass, field
from typing import List

import torch
from torch.nn import functional as F
from tqdm import tqdm

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


def synchronize(device) -> None:
    """Wait for queued GPU work so that wall-clock times measure it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


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
    torch.manual_seed(seed)
    model = CopyTransformer(VARIANTS[name], n_symbols=config.n_symbols,
                            max_length=config.max_length, layers=config.layers,
                            heads=config.heads, head_dim=config.head_dim, dropout=config.dropout).to(device)
    optimizer = torch.optim.RAdam(model.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 1.0 if step < config.lr_drop_step else 0.1)
    generator = torch.Generator().manual_seed(seed)
    tests = test_set(config, seed, device)
    history, elapsed, window = History(), 0.0, []
    bar = tqdm(range(1, config.steps + 1), desc=f"{name} seed {seed}", disable=not progress,
               leave=False)
    for step in bar:
        batch = to_device(copy_batch(config.batch_size, config.max_length, config.n_symbols,
                                     generator), device)
        synchronize(device)
        start = time.perf_counter()
        loss, _ = masked_loss_and_accuracy(model(batch.tokens), batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        synchronize(device)
        elapsed += time.perf_counter() - start
        window.append(loss.item())
        if step % config.eval_every == 0 or step == config.steps:
            test_loss, test_acc = evaluate(model, tests)
            history.steps.append(step)
            history.seconds.append(elapsed)
            history.train_loss.append(sum(window) / len(window))
            history.test_loss.append(test_loss)
            history.test_accuracy.append(test_acc)
            bar.set_postfix(loss=f"{history.train_loss[-1]:.3f}", acc=f"{test_acc:.3f}")
            window = []
    return history
