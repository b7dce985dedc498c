"""Train one classifier on sequential (P)MNIST; loss and test accuracy per epoch."""
import time
from dataclasses import dataclass, field
from typing import List

import torch
from torch.nn import functional as F
from tqdm import tqdm

from recipes.common.timing import synchronize

from .config import MnistConfig
from .model import PixelClassifier
from .variants import cell_specs


@dataclass
class History:
    epochs: List[int] = field(default_factory=list)
    seconds: List[float] = field(default_factory=list)  # training time only
    train_loss: List[float] = field(default_factory=list)
    test_loss: List[float] = field(default_factory=list)
    test_accuracy: List[float] = field(default_factory=list)


@torch.no_grad()
def evaluate(model, x, y, batch_size: int):
    model.eval()
    loss, correct = 0.0, 0
    for start in range(0, len(x), batch_size):
        logits = model(x[start:start + batch_size])
        target = y[start:start + batch_size]
        loss += F.cross_entropy(logits, target, reduction="sum").item()
        correct += int((logits.argmax(-1) == target).sum())
    model.train()
    return loss / len(x), correct / len(x)


def train_classifier(name: str, task: str, config: MnistConfig, train_x, train_y, test_x, test_y,
                     seed: int, progress: bool = True, on_step=None):
    """Returns (History, trained model). x: (N, T, 1) float, y: (N,) long, both on the device
    to train on. on_step(iteration, model) is called before training (iteration 0) and after
    every optimiser step; its time is not counted as training time."""
    torch.manual_seed(seed)
    device = train_x.device
    model = PixelClassifier(cell_specs(task, config.hidden_size)[name], config.hidden_size).to(device)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=config.lr, alpha=config.rmsprop_alpha)
    generator = torch.Generator().manual_seed(seed)
    history, elapsed, iteration = History(), 0.0, 0
    if on_step is not None:
        on_step(0, model)
    batches = (len(train_x) + config.batch_size - 1) // config.batch_size
    bar = tqdm(total=config.epochs * batches, desc=f"{task} {name} seed {seed}",
               disable=not progress, leave=False)
    for epoch in range(1, config.epochs + 1):
        order = torch.randperm(len(train_x), generator=generator)
        total = 0.0
        for start in range(0, len(order), config.batch_size):
            idx = order[start:start + config.batch_size].to(device)
            synchronize(device)
            begin = time.perf_counter()
            loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm)
            optimizer.step()
            synchronize(device)
            elapsed += time.perf_counter() - begin
            iteration += 1
            if on_step is not None:
                on_step(iteration, model)
            total += loss.item() * len(idx)
            bar.update()
        test_loss, test_acc = evaluate(model, test_x, test_y, 4 * config.batch_size)
        history.epochs.append(epoch)
        history.seconds.append(elapsed)
        history.train_loss.append(total / len(order))
        history.test_loss.append(test_loss)
        history.test_accuracy.append(test_acc)
        bar.set_postfix(loss=f"{history.train_loss[-1]:.3f}", acc=f"{test_acc:.3f}")
    bar.close()
    return history, model
