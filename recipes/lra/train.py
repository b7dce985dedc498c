"""Train one LRA classifier with the recipes' shared loop (recipes/common/training.py) and report
its test accuracy at the best validation point, as LRA does.

AdamW (betas 0.9 / 0.999, eps 1e-6) with linear warmup then linear decay to 0
(`transformers.get_linear_schedule_with_warmup`), cross-entropy on the labels; validation
accuracy every `eval_every` steps; the weights of the best validation point are kept and scored
on the test split at the end.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from transformers import get_linear_schedule_with_warmup

from recipes.common.training import History, fit, make_accelerator

from .model import ClassifierConfig, LRAClassifier
from .tasks import Splits, TaskInfo, TrainConfig


@dataclass
class Result:
    history: History
    best_step: int
    val_accuracy: float     # at the best validation point
    test_accuracy: float    # of the weights of that point


def classifier_config(info: TaskInfo, layer_types: Optional[Sequence[str]] = None) -> ClassifierConfig:
    """§4.3's sizes for a task (the dropout and head of ClassifierConfig's defaults); layer_types:
    transformers' vocabulary per layer (None: every layer the model's own attention)."""
    return ClassifierConfig(vocab_size=info.vocab_size, max_length=info.length, n_classes=info.n_classes,
                            padding_id=info.padding_id, dual=info.dual, layer_types=layer_types)


def batch_loss(model, batch):
    """Cross-entropy and accuracy of one (tokens, labels) batch."""
    tokens, labels = batch
    logits = model(tokens.long())
    loss = F.cross_entropy(logits.float(), labels)
    return loss, {"accuracy": (logits.argmax(-1) == labels).float().mean()}


def accuracy(model, loader, accelerator) -> float:
    """Accuracy over every example of `loader` (every rank's share gathered, duplicates dropped)."""
    hits = []
    for tokens, labels in loader:
        predictions = model(tokens.long()).argmax(-1)
        hits.append(accelerator.gather_for_metrics(predictions == labels))
    return float(torch.cat(hits).float().mean())


def train_classifier(name: str, task: str, info: TaskInfo, splits: Splits, training: TrainConfig, seed: int,
                     device="cpu", progress: bool = True, model_config: Optional[ClassifierConfig] = None
                     ) -> Result:
    """Train model `name` on `splits` ({split: (tokens, labels)}) of `task` from seed `seed`."""
    accelerator = make_accelerator(device)
    config = model_config or classifier_config(info)
    torch.manual_seed(seed)
    model = LRAClassifier(name, task, config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=training.lr, betas=(0.9, 0.999), eps=1e-6,
                                  weight_decay=training.weight_decay)
    schedule = get_linear_schedule_with_warmup(optimizer, training.warmup, training.steps)
    generator = torch.Generator().manual_seed(seed)
    train_loader = DataLoader(TensorDataset(*splits["train"]), batch_size=training.batch_size, shuffle=True,
                              generator=generator, drop_last=len(splits["train"][1]) > training.batch_size)
    val_loader, test_loader = (accelerator.prepare(DataLoader(TensorDataset(*splits[s]),
                                                              batch_size=training.eval_batch_size))
                               for s in ("val", "test"))
    best: Dict = {"accuracy": -1.0, "step": 0, "state": None, "evaluations": 0}

    def evaluate(model) -> Dict[str, float]:
        value = accuracy(model, val_loader, accelerator)
        best["evaluations"] += 1
        if value > best["accuracy"]:
            state = accelerator.unwrap_model(model).state_dict()
            best.update(accuracy=value, step=best["evaluations"],
                        state={k: v.detach().clone() for k, v in state.items()})
        return {"val_accuracy": value}

    plain, history = fit(model, optimizer, train_loader, batch_loss, accelerator=accelerator,
                         steps=training.steps, eval_every=training.eval_every, evaluate=evaluate,
                         schedule=schedule, progress=progress, desc=f"{task} {name} seed {seed}")
    plain.load_state_dict(best["state"])
    plain.eval()
    with torch.no_grad(), accelerator.autocast():
        test = accuracy(plain, test_loader, accelerator)
    return Result(history, history.steps[best["step"] - 1], best["accuracy"], test)

