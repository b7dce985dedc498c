"""`--bptt` of recipes/hf/train_clm.py: truncated backpropagation through time over contiguous
streams, as AWD-LSTM trains and evaluates (Merity et al.; MomentumRNN's PTB setup, Appendix A.3) and
as fairseq_momentum's `--task language_modeling_bptt` does for fairseq.

A split's tokens are one stream, cut into equal streams, `--per_device_batch_size` of them per rank
(the remainder, fewer tokens than streams, is dropped). Batch t of a rank holds chunk t of each of
its streams: `--block_size` tokens (the last chunk may be shorter), in stream order, never
shuffled. `--variable_bptt` draws each training pass's chunk lengths as AWD-LSTM does (seeded by
`--seed` and the pass, so every rank and a resumed run draw the same) and scales each update's
learning rate by its chunks' length over `--block_size`. The LSTM's state at the end of one chunk
starts the next, detached (gradients stop at the chunk's start), so every token is predicted once,
from the whole stream before it. Each epoch and each evaluation start the streams from a zero
state.

The carried state is part of where training is: a checkpoint holds every rank's streams' state in
`carried_state.safetensors` (no pickle), and a resumed run continues from it exactly."""
import math
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from accelerate.data_loader import DataLoaderShard
from safetensors import safe_open
from safetensors.torch import save_file
from torch.utils.data import Dataset

from plugins.bptt import chunk_bounds, random_chunk_lengths, stream_length

CARRIED_FILE = "carried_state.safetensors"


def stream_pairs(tokens: torch.Tensor, streams: int, split: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each (streams, L): stream s holds the L input tokens from s·L on, and
    their next tokens. Refused with fewer than one pair per stream."""
    length = stream_length(tokens.numel(), streams, split,
                           "--per_device_batch_size times the number of processes")
    n = streams * length
    return tokens[:n].view(streams, length), tokens[1:n + 1].view(streams, length)


class StreamChunks(Dataset):
    """One rank's batches: item t is chunk t of each of its `rows` streams ({"input_ids", "targets"}
    (rows, chunk length), "chunk": t). The rank's streams are rows rank·rows … of all ranks' streams.
    Chunks are `bptt` tokens long, the last one cut to fit; with `seed`, each pass's lengths are
    AWD-LSTM's random ones, drawn from (seed, pass) when `set_epoch(pass)` is called."""

    def __init__(self, tokens: torch.Tensor, bptt: int, rows: int, rank: int, ranks: int, split: str,
                 seed: Optional[int] = None):
        inputs, targets = stream_pairs(tokens, rows * ranks, split)
        mine = slice(rank * rows, (rank + 1) * rows)
        self.inputs, self.targets, self.bptt, self.seed = inputs[mine], targets[mine], bptt, seed
        self.bounds = chunk_bounds(self.inputs.shape[1], bptt)

    def set_epoch(self, epoch: int) -> None:
        if self.seed is not None:
            lengths = random_chunk_lengths(self.bptt, self.inputs.shape[1],
                                           np.random.default_rng([self.seed, epoch]))
            self.bounds = chunk_bounds(self.inputs.shape[1], self.bptt, lengths)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, t: int) -> Dict[str, object]:
        cut = slice(self.bounds[t], self.bounds[t + 1])
        return {"input_ids": self.inputs[:, cut], "targets": self.targets[:, cut], "chunk": t}


def stream_loader(tokens: torch.Tensor, bptt: int, rows: int, rank: int, ranks: int, split: str,
                  seed: Optional[int] = None) -> DataLoaderShard:
    """The chunks in order, one per batch, in accelerate's DataLoader class but not sharded again
    (each rank's streams are its own): accelerate syncs the gradients at its end, as at a prepared
    loader's, and skips the chunks a resumed run already trained on. Its own generator: a
    DataLoader's iterator draws a seed, which from torch's global generator would move the dropout
    masks of a resumed run (whose skipping loader is a second iterator)."""
    return DataLoaderShard(StreamChunks(tokens, bptt, rows, rank, ranks, split, seed), batch_size=1,
                           shuffle=False, collate_fn=_only, generator=torch.Generator().manual_seed(0))


def _only(items: List[Dict[str, object]]) -> Dict[str, object]:
    return items[0]


class RateByLength:
    """AWD-LSTM's learning rate for random chunk lengths: an update's rate times its chunks' mean
    length over `bptt`. `add` each chunk's length, and call `updated` after each optimizer step (also
    one a gradient scaler skipped). The rate is scaled inside the optimizer's step and put back after
    it, through torch's step hooks, so schedules and logs see the unscaled rate."""

    def __init__(self, optimizer: torch.optim.Optimizer, bptt: int):
        self.bptt, self.lengths, self.rates = bptt, [], []
        optimizer.register_step_pre_hook(self._scale)
        optimizer.register_step_post_hook(self._restore)

    def add(self, length: int) -> None:
        self.lengths.append(length)

    def updated(self) -> None:
        self.lengths = []

    def _scale(self, optimizer, args, kwargs) -> None:
        factor = sum(self.lengths) / len(self.lengths) / self.bptt if self.lengths else 1.0
        self.rates = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * factor

    def _restore(self, optimizer, args, kwargs) -> None:
        for group, rate in zip(optimizer.param_groups, self.rates):
            group["lr"] = rate


class CarriedState:
    """The stack's state (a MomentumLSTMCache's state tensors, batch-first) after chunk `chunk` − 1
    of this rank's streams; `cache_class(config)` builds the cache a forward continues."""

    def __init__(self, cache_class, config):
        self.cache_class, self.config = cache_class, config
        self.states: Optional[list] = None
        self.chunk = 0

    def cache_for(self, chunk: int):
        """The cache to continue before chunk `chunk` (None: a zero state, at each pass's start)."""
        if chunk == 0:
            self.states, self.chunk = None, 0
        elif chunk != self.chunk:
            raise RuntimeError(f"--bptt: the batch is chunk {chunk} of the streams, but the carried state "
                               f"is the one before chunk {self.chunk} (a checkpoint of another run?)")
        if self.states is None:
            return None
        cache = self.cache_class(self.config)
        cache.set_states(0, list(self.states))
        return cache

    def keep(self, cache, chunk: int) -> None:
        """The state after chunk `chunk`, detached: the next chunk's gradients stop at its start."""
        self.states = [t.detach() for t in cache.get_states(0)]
        self.chunk = chunk + 1

    def save(self, folder: Path, accelerator) -> None:
        """Every rank's streams' state, in rank order, to `folder`/CARRIED_FILE (by the main process;
        every rank must call this)."""
        tensors = {}
        if self.states is not None:
            tensors = {f"state_{i}": _gathered(t, accelerator) for i, t in enumerate(self.states)}
        if accelerator.is_main_process:
            save_file(tensors, str(Path(folder) / CARRIED_FILE), metadata={"chunk": str(self.chunk)})

    def load(self, folder: Path, rank: int, rows: int, ranks: int, device) -> None:
        """This rank's rows of the state saved by `save`. The streams are cut by their number alone,
        so a checkpoint resumes under another split of the same number over processes."""
        path = Path(folder) / CARRIED_FILE
        if not path.is_file():
            raise FileNotFoundError(f"--bptt: {folder} has no {CARRIED_FILE} (a checkpoint saved without "
                                    "--bptt?)")
        with safe_open(str(path), "pt") as f:
            self.chunk = int(f.metadata()["chunk"])
            states = [f.get_tensor(f"state_{i}") for i in range(len(f.keys()))]
        if states and states[0].shape[0] != rows * ranks:
            raise ValueError(f"--bptt: {path} holds the state of {states[0].shape[0]} streams; this run has "
                             f"{rows * ranks} (--per_device_batch_size {rows} on each of {ranks} processes)")
        for i, t in enumerate(states):      # the stack trusts its carried step counters (it made them)
            if not t.is_floating_point() and bool((t < 0).any()):
                raise ValueError(f"--bptt: {path} holds negative step counts (state_{i}): not a state "
                                 "that --bptt saved")
        self.states = [t[rank * rows:(rank + 1) * rows].to(device) for t in states] or None


def _gathered(t: torch.Tensor, accelerator) -> torch.Tensor:
    """Every rank's rows of `t` (alike in shape on every rank), on the host. An empty field (a cell's
    unused state) is formed here, not sent: no collective of zero bytes, whose support differs
    between backends."""
    if t.numel() == 0:
        return t.new_empty((t.shape[0] * accelerator.num_processes, *t.shape[1:]), device="cpu")
    return accelerator.gather(t.contiguous()).cpu()


def chunk_loss(model, batch: Dict[str, object], carried: CarriedState, device, reduction: str = "mean"):
    """Cross-entropy of the chunk's targets, the forward continuing the carried state, which then
    becomes the state after this chunk."""
    out = model(input_ids=batch["input_ids"].to(device), past_key_values=carried.cache_for(batch["chunk"]),
                use_cache=True)
    carried.keep(out.past_key_values, batch["chunk"])
    logits = out.logits.flatten(0, 1)
    logits = logits.float() if logits.element_size() < 4 else logits      # fp16 / bf16 logits: in float32
    return F.cross_entropy(logits, batch["targets"].to(device).flatten(), reduction=reduction)


def evaluate_streams(model, loader: DataLoaderShard, carried: CarriedState,
                     accelerator) -> Tuple[float, float]:
    """Loss per target token and perplexity over every rank's validation streams, the state carried
    from a zero start, as training carries it."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
    with torch.no_grad():
        for batch in loader:
            loss = chunk_loss(model, batch, carried, accelerator.device, reduction="sum")
            count = loss.new_tensor(batch["targets"].numel(), dtype=torch.float64)
            total += torch.stack([loss.double(), count])
    model.train()
    total = accelerator.reduce(total, "sum")
    loss = (total[0] / total[1]).item()
    return loss, math.exp(min(loss, 50.0))
