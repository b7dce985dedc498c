"""Train one cell on the copying or adding task; training and held-out loss vs iteration."""
import time
from dataclasses import dataclass, field
from typing import List

import torch
from torch.nn import functional as F
from tqdm import tqdm

from recipes.common.timing import synchronize

from .config import TaskConfig
from .data import adding_batch, copying_batch
from .model import AddingModel, CopyingModel
from .variants import ADDING, copying_specs

TEST_SEED_OFFSET = 1_000_003


@dataclass
class History:
    steps: List[int] = field(default_factory=list)
    seconds: List[float] = field(default_factory=list)  # training time only
    train_loss: List[float] = field(default_factory=list)
    test_loss: List[float] = field(default_factory=list)


def make_batch(config: TaskConfig, generator: torch.Generator, device="cpu"):
    if config.task == "copying":
        batch = copying_batch(config.batch_size, symbols=config.symbols, delay=config.length,
                              n_symbols=config.n_symbols, generator=generator)
    else:
        batch = adding_batch(config.batch_size, length=config.length, generator=generator)
    return type(batch)(*(t.to(device) for t in batch))


def build_model(name: str, config: TaskConfig):
    if config.task == "copying":
        return CopyingModel(copying_specs(config.length)[name], config.n_symbols, config.hidden_size)
    return AddingModel(ADDING[name], config.hidden_size)


def task_loss(model, batch, task: str) -> torch.Tensor:
    """Copying: cross-entropy averaged over every step; adding: mean squared error."""
    if task == "copying":
        logits = model(batch.inputs)
        return F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten())
    return F.mse_loss(model(batch.inputs), batch.targets)


def make_optimizer(config: TaskConfig, parameters):
    if config.optimizer == "rmsprop":
        return torch.optim.RMSprop(parameters, lr=config.lr)
    if config.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=config.lr)
    raise ValueError(f"optimizer must be 'rmsprop' or 'adam', got {config.optimizer!r}")


@torch.no_grad()
def evaluate(model, batches, task: str) -> float:
    return float(torch.stack([task_loss(model, b, task) for b in batches]).mean())


def train_task_model(name: str, config: TaskConfig, seed: int, progress: bool = True,
                     device="cpu") -> History:
    torch.manual_seed(seed)
    model = build_model(name, config).to(device)
    optimizer = make_optimizer(config, model.parameters())
    generator = torch.Generator().manual_seed(seed)
    held_out = torch.Generator().manual_seed(seed + TEST_SEED_OFFSET)
    tests = [make_batch(config, held_out, device) for _ in range(config.eval_batches)]
    history, elapsed, window = History(), 0.0, []
    bar = tqdm(range(1, config.steps + 1), desc=f"{config.task} {name} seed {seed}",
               disable=not progress, leave=False)
    for step in bar:
        batch = make_batch(config, generator, device)
        synchronize(device)
        start = time.perf_counter()
        loss = task_loss(model, batch, config.task)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        synchronize(device)
        elapsed += time.perf_counter() - start
        window.append(loss.item())
        if step % config.eval_every == 0 or step == config.steps:
            history.steps.append(step)
            history.seconds.append(elapsed)
            history.train_loss.append(sum(window) / len(window))
            history.test_loss.append(evaluate(model, tests, config.task))
            bar.set_postfix(loss=f"{history.train_loss[-1]:.4f}")
            window = []
    return history
