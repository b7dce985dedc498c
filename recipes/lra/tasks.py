"""The five LRA tasks as the recipe trains them: how each split is built (offline; three of them
substitutes, named as such), and the two sizes.

--full: the paper's sequence lengths (§4.3: ListOps 2K, Text 4K, Retrieval 4K, Image 1K,
Pathfinder 1K; our Image substitute has 784 pixels) and the training schedule of the
configuration §4.3 follows (Xiong et al. 2021, Nyströmformer's `lra_config.py`: AdamW at 1e-4,
linear warmup then linear decay, no weight decay; batch, warmup and steps per task).
Small (default, CPU minutes per model): shorter sequences (ListOps up to 63 tokens of depth ≤ 6,
256-byte passages, 14×14 digits, 32×32 easy Pathfinder max-pooled to 16×16), one or two thousand
training examples, 150-200 steps at 1e-3.
"""
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from recipes.common.corpora import austen_documents
from recipes.image_generation.data import download_cifar10, downsample

from . import listops, pathfinder
from .image import IMAGE_SUBSTITUTE, image_substitute, load_cifar10
from .text import (
    RETRIEVAL_SUBSTITUTE,
    TEXT_SUBSTITUTE,
    aan_examples,
    imdb_examples,
    retrieval_substitute,
    text_substitute,
)

SPLITS = ("train", "val", "test")
DATA_SEED = 0          # one data set per size; the run seeds vary the model and the batch order
PAPER_LENGTHS = {"listops": "2K", "text": "4K", "retrieval": "4K", "image": "1K", "pathfinder": "1K"}


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int
    lr: float
    warmup: int          # linear warmup steps, then linear decay to 0 at `steps`
    steps: int
    eval_every: int      # steps between validation points
    weight_decay: float = 0.0
    eval_batch_size: int = 64


@dataclass(frozen=True)
class TaskSize:
    """length: ListOps' longest expression (tokens), Text / Retrieval passage bytes, Image and
    Pathfinder image side (pixels); n_*: examples per split (None: all there are)."""

    length: int
    n_train: Optional[int]
    n_val: Optional[int]
    n_test: Optional[int]
    training: TrainConfig
    max_depth: int = 10          # ListOps
    min_length: int = 500        # ListOps: shortest expression + 1
    difficulty: str = "hard"     # Pathfinder
    pool: int = 1                # Pathfinder: images max-pooled by pool × pool after drawing


FULL = {
    "listops": TaskSize(2000, 96_000, 2000, 2000, TrainConfig(32, 1e-4, 1000, 5000, 50)),
    "text": TaskSize(4000, None, None, None, TrainConfig(32, 1e-4, 8000, 20_000, 500)),
    "retrieval": TaskSize(4000, None, None, None, TrainConfig(32, 1e-4, 800, 30_000, 300)),
    "image": TaskSize(28, None, None, None, TrainConfig(256, 1e-4, 175, 35_000, 175)),
    "pathfinder": TaskSize(32, 160_000, 20_000, 20_000, TrainConfig(256, 1e-4, 312, 62_400, 312)),
}
SMALL = {
    "listops": TaskSize(64, 2000, 200, 400, TrainConfig(32, 1e-3, 20, 200, 50), max_depth=6, min_length=10),
    "text": TaskSize(256, 2000, None, None, TrainConfig(16, 1e-3, 20, 150, 50)),
    "retrieval": TaskSize(256, 2000, None, None, TrainConfig(16, 1e-3, 20, 150, 50)),
    "image": TaskSize(14, None, 400, None, TrainConfig(16, 1e-3, 20, 150, 50)),
    "pathfinder": TaskSize(32, 1000, 200, 400, TrainConfig(16, 1e-3, 20, 150, 50), difficulty="easy", pool=2),
}


def sizes(full: bool) -> Dict[str, TaskSize]:
    return FULL if full else SMALL


@dataclass(frozen=True)
class TaskInfo:
    """What the model needs to know of a task, and how the report names it."""

    vocab_size: int
    n_classes: int
    padding_id: Optional[int]     # None: every position is real (pixels)
    dual: bool
    length: int                   # positions per sequence
    description: str              # the real task, or "substitute for …"
    substitute: bool


Splits = Dict[str, Tuple[torch.Tensor, torch.Tensor]]


def first(n: Optional[int], tokens: torch.Tensor, labels: torch.Tensor):
    return (tokens, labels) if n is None else (tokens[:n], labels[:n])


def build_listops(size: TaskSize) -> Tuple[TaskInfo, Splits]:
    counts = [size.n_train, size.n_val, size.n_test]
    trees = listops.generate(sum(counts), DATA_SEED, max_depth=size.max_depth, min_length=size.min_length,
                             max_length=size.length)
    splits, start = {}, 0
    for split, n in zip(SPLITS, counts):
        rows = [(listops.to_source(t, parens=False), listops.tree_value(t)) for t in trees[start:start + n]]
        encoded = listops.encode(rows, max_length=size.length)
        splits[split] = (encoded.tokens, encoded.labels)
        start += n
    description = (f"ListOps (generated, {size.min_length + 1}-{size.length - 1} tokens, "
                   f"depth ≤ {size.max_depth})")
    info = TaskInfo(len(listops.VOCAB), listops.N_CLASSES, listops.TOKEN_ID[listops.PAD], False,
                    max(int(t.shape[1]) for t, _ in splits.values()), description, False)
    return info, splits


def max_pool(images: torch.Tensor, pool: int) -> torch.Tensor:
    """(N, S, S) uint8 → (N, S / pool, S / pool): a lit pixel stays lit, so paths stay drawn (a
    gap or the 3-pixel space between two paths may shrink to nothing: a shortcut for CPU runs)."""
    if pool == 1:
        return images
    return torch.nn.functional.max_pool2d(images[:, None].float(), pool)[:, 0].to(torch.uint8)


def build_pathfinder(size: TaskSize) -> Tuple[TaskInfo, Splits]:
    settings = pathfinder.Settings.for_difficulty(size.difficulty, size=size.length)
    splits, start = {}, 0
    for split, n in zip(SPLITS, [size.n_train, size.n_val, size.n_test]):
        data = pathfinder.generate(n, DATA_SEED, settings, start=start)
        images = max_pool(torch.from_numpy(data.images), size.pool)
        splits[split] = (images.reshape(n, -1), torch.from_numpy(data.labels))
        start += n
    side = size.length // size.pool
    pooled = f", max-pooled {size.pool}×{size.pool} to {side}×{side}" if size.pool > 1 else ""
    description = f"Pathfinder (own generator, {size.length}×{size.length}, {size.difficulty}{pooled})"
    return TaskInfo(256, 2, None, False, side ** 2, description, False), splits


def build_text(size: TaskSize, cache: Path) -> Tuple[TaskInfo, Splits]:
    books, examples = text_substitute(austen_documents(cache), passage_bytes=size.length, seed=DATA_SEED)
    counts = dict(zip(SPLITS, [size.n_train, size.n_val, size.n_test]))
    splits = {s: first(counts[s], *examples[s]) for s in SPLITS}
    description = TEXT_SUBSTITUTE.replace("4,000", f"{size.length:,}")
    return TaskInfo(257, len(books), 0, False, size.length, description, True), splits


def build_retrieval(size: TaskSize, cache: Path) -> Tuple[TaskInfo, Splits]:
    examples = retrieval_substitute(austen_documents(cache), passage_bytes=size.length, seed=DATA_SEED)
    counts = dict(zip(SPLITS, [size.n_train, size.n_val, size.n_test]))
    splits = {s: first(counts[s], *examples[s]) for s in SPLITS}
    description = RETRIEVAL_SUBSTITUTE.replace("4,000", f"{size.length:,}")
    return TaskInfo(257, 2, 0, True, size.length, description, True), splits


def build_image(size: TaskSize, dataset: str) -> Tuple[TaskInfo, Splits]:
    examples = image_substitute(dataset)
    counts = dict(zip(SPLITS, [size.n_train, size.n_val, size.n_test]))
    splits = {}
    for split in SPLITS:
        tokens, labels = first(counts[split], *examples[split])
        side = int(round(tokens.shape[1] ** 0.5))
        images = tokens.to(torch.uint8).view(-1, side, side, 1)
        splits[split] = (downsample(images, size.length).reshape(len(labels), -1), labels)
    description = IMAGE_SUBSTITUTE.format(dataset=dataset).replace(
        "784 pixels", f"{size.length}×{size.length} = {size.length ** 2} pixels")
    return TaskInfo(256, 10, None, False, size.length ** 2, description, True), splits


def build_task(task: str, size: TaskSize, *, corpus_cache: Path,
               image_dataset: str) -> Tuple[TaskInfo, Splits]:
    if task == "listops":
        return build_listops(size)
    if task == "pathfinder":
        return build_pathfinder(size)
    if task == "text":
        return build_text(size, corpus_cache)
    if task == "retrieval":
        return build_retrieval(size, corpus_cache)
    if task == "image":
        return build_image(size, image_dataset)
    raise ValueError(f"task must be one of listops, text, retrieval, image, pathfinder, got {task!r}")


def capped(size: TaskSize, examples) -> Splits:
    counts = dict(zip(SPLITS, [size.n_train, size.n_val, size.n_test]))
    return {s: first(counts[s], *examples[s]) for s in SPLITS}


def build_real(task: str, size: TaskSize, source: Path) -> Tuple[TaskInfo, Splits]:
    """The LRA task from the user's copy of its data (`source`, README.md's table), cut to the
    size's lengths and example counts: ListOps `lra_release/listops-1000`, Text the unpacked IMDB
    or its parquet files, Retrieval `lra_release/tsv_data`, Image a folder for the CIFAR-10
    archive (downloaded there if missing), Pathfinder `lra_release/pathfinder32`."""
    if task == "listops":
        splits = {}
        for split, n in zip(SPLITS, [size.n_train, size.n_val, size.n_test]):
            encoded = listops.load_split(source, split, max_length=size.length)
            splits[split] = first(n, encoded.tokens, encoded.labels)
        length = max(int(t.shape[1]) for t, _ in splits.values())
        return TaskInfo(len(listops.VOCAB), listops.N_CLASSES, 0, False, length,
                        f"ListOps (LRA release files, cut at {size.length} tokens)", False), splits
    if task in ("text", "retrieval"):
        read = imdb_examples if task == "text" else aan_examples
        splits = capped(size, read(source, max_length=size.length))
        name = "Text (IMDB)" if task == "text" else "Retrieval (AAN)"
        return TaskInfo(257, 2, 0, task == "retrieval", size.length,
                        f"{name}, bytes cut at {size.length}", False), splits
    if task == "image":
        splits = {}
        for split, (tokens, labels) in capped(size, load_cifar10(download_cifar10(source))).items():
            images = tokens.to(torch.uint8).view(-1, 32, 32, 1)
            splits[split] = (downsample(images, size.length).reshape(len(labels), -1), labels)
        return TaskInfo(256, 10, None, False, size.length ** 2,
                        f"Image (CIFAR-10 grey levels, {size.length}×{size.length})", False), splits
    if task == "pathfinder":
        data, _ = pathfinder.load_release(source, size.difficulty)
        splits = {}
        for (split, part), n in zip(pathfinder.release_splits(data).items(),
                                    [size.n_train, size.n_val, size.n_test]):
            images = max_pool(torch.from_numpy(part.images), size.pool)
            splits[split] = first(n, images.reshape(len(images), -1), torch.from_numpy(part.labels))
        side = int(splits["train"][0].shape[1] ** 0.5)
        return TaskInfo(256, 2, None, False, side ** 2,
                        f"Pathfinder (LRA release, {size.difficulty}, {side}×{side})", False), splits
    raise ValueError(f"task must be one of listops, text, retrieval, image, pathfinder, got {task!r}")


def data_params(task: str, size: TaskSize, image_dataset: str, source: Optional[Path] = None) -> dict:
    """The cache key of a task's data: what builds it (the training schedule is not part of it);
    the user's data by its path (`source`)."""
    params = {k: v for k, v in asdict(size).items() if k != "training"}
    if source is not None:
        return {"task": task, "source": str(Path(source).resolve()), **params}
    # the image key names the shuffled training order (image_substitute), not the class-sorted one
    dataset = {"dataset": image_dataset, "train_order": "shuffled, seed 0"} if task == "image" else {}
    return {"task": task, "seed": DATA_SEED, **params, **dataset}


def save(folder: Path, info: TaskInfo, splits: Splits) -> None:
    tensors = {s: {"tokens": t.contiguous(), "labels": y.contiguous()} for s, (t, y) in splits.items()}
    torch.save(tensors, folder / "data.pt")
    (folder / "info.json").write_text(json.dumps(asdict(info), indent=1))


def load(folder: Path) -> Tuple[TaskInfo, Splits]:
    data = torch.load(folder / "data.pt")
    info = TaskInfo(**json.loads((folder / "info.json").read_text()))
    return info, {split: (d["tokens"], d["labels"]) for split, d in data.items()}
