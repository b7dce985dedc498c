"""`--task language_modeling_bptt`: language modelling with truncated backpropagation through time over
contiguous streams, as AWD-LSTM trains and evaluates (Merity et al.; MomentumRNN's PTB and WikiText
setups, Appendix A.3).

The split's text is one token stream (every line ends with `</s>`, fairseq-preprocess's way), cut
into equal streams, `--batch-size` of them per rank (the remainder, fewer tokens than streams, is
dropped). Batch t of a rank holds chunk t of each of its streams: `--tokens-per-sample` tokens (the
BPTT length; the last chunk may be shorter; `--variable-bptt` draws each training chunk's length as
AWD-LSTM does and scales its update's learning rate), in stream order, never shuffled. The model's
recurrent state at the end of one chunk starts the next (detached: gradients stop at the chunk's
start), so every token is predicted once, from the whole stream before it. Each epoch and each
validation start the streams from a zero state. Validation (and `fairseq-validate --valid-subset
test --batch-size 1`, AWD-LSTM's test protocol) carries the state the same way.

The carried state is part of where the training iterator is: a checkpoint saved inside an epoch
holds it (every rank's streams, gathered after each update), and a resumed run continues from it
exactly. The model's decoder must take `carried_state` (momentum_lstm_lm).

With `--optimizer nt_asgd` (AWD-LSTM's NT-ASGD, fairseq_momentum/optim/nt_asgd.py), each validation
scores the average of the iterates once the optimizer averages them, and the checkpoint saved after it
holds that average as its model; the next training step puts the iterate back.
"""
import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from fairseq import utils
from fairseq.data import FairseqDataset, data_utils, iterators
from fairseq.distributed import utils as distributed_utils
from fairseq.tasks import TASK_REGISTRY, register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from plugins.bptt import chunk_bounds, random_chunk_lengths, stream_length
from plugins.rnn import RecurrentState

from ..modules.recurrent_state import buffer_to_states, states_to_buffer
from ..optim.nt_asgd import nt_asgd_in

NAME = "language_modeling_bptt"
logger = logging.getLogger(__name__)


class CarriedState:
    """The recurrent state a decoder hands from one chunk of its streams to the next (`state`: one
    RecurrentState per layer, or None for a zero state); `epoch`: the epoch it belongs to."""

    def __init__(self, state: Optional[List[RecurrentState]] = None, epoch: Optional[int] = None):
        self.state, self.epoch = state, epoch

    def to(self, device) -> "CarriedState":
        if self.state is not None:
            self.state = [RecurrentState(*(None if t is None else t.to(device) for t in layer))
                          for layer in self.state]
        return self


class StreamDataset(FairseqDataset):
    """A split's tokens as one stream (`</s>` first, as the context of the first token): inputs
    stream[:-1], targets stream[1:]. `arrange(streams_per_shard, shards)` cuts it into that many
    streams per shard and returns the batches; item s * chunks + t is chunk t of stream s.
    `training`: the split fairseq trains on (the one it loads with combine=True)."""

    def __init__(self, tokens: torch.Tensor, bptt: int, pad: int, split: str, training: bool = False):
        self.stream = tokens
        self.bptt, self.pad, self.split, self.training = bptt, pad, split, training
        self.streams = self.length = self.chunks = 0
        self.bounds = [0]

    def arrange(self, streams_per_shard: int, shards: int,
                lengths: Optional[Callable[[int], List[int]]] = None) -> List[np.ndarray]:
        """The batches in order: batch t * shards + r holds chunk t of shard r's streams (fairseq's
        iterator gives shard r every shards-th batch, so each rank walks its own streams). Chunks are
        --tokens-per-sample long, or `lengths(stream_length)` long (the last one cut to fit)."""
        self.streams = streams_per_shard * shards
        self.length = stream_length(self.stream.numel(), self.streams, self.split,
                                    f"--batch-size {streams_per_shard} on each of {shards} ranks")
        self.bounds = chunk_bounds(self.length, self.bptt,
                                   lengths(self.length) if lengths is not None else None)
        self.chunks = len(self.bounds) - 1
        return [np.arange(shard * streams_per_shard, (shard + 1) * streams_per_shard) * self.chunks + chunk
                for chunk in range(self.chunks) for shard in range(shards)]

    def __len__(self):
        return self.streams * self.chunks

    def __getitem__(self, index):
        stream, chunk = divmod(int(index), self.chunks)
        begin = stream * self.length + self.bounds[chunk]
        end = stream * self.length + self.bounds[chunk + 1]
        return {"id": index, "source": self.stream[begin:end].long(),
                "target": self.stream[begin + 1:end + 1].long()}

    def collater(self, samples):
        if not samples:
            return {}
        source = torch.stack([s["source"] for s in samples])
        target = torch.stack([s["target"] for s in samples])
        return {"id": torch.tensor([s["id"] for s in samples]), "nsentences": len(samples),
                "ntokens": target.numel(), "split": self.split,
                "net_input": {"src_tokens": source,
                              "src_lengths": torch.full((len(samples),), source.shape[1])},
                "target": target}

    def num_tokens(self, index):
        return self.bptt

    def size(self, index):
        return self.bptt

    @property
    def sizes(self):
        return np.full(len(self), self.bptt)


class StreamIterator(iterators.EpochBatchIterator):
    """fairseq's epoch iterator over a StreamDataset in its fixed order, whose state (what a
    checkpoint keeps of where training is) also holds the carried state of every stream."""

    def __init__(self, task: "BPTTLanguageModelingTask", **kwargs):
        super().__init__(disable_shuffling=True, **kwargs)
        self.task = task

    def state_dict(self):
        state = super().state_dict()
        if state["iterations_in_epoch"] > 0:
            state["carried_state"] = self.task.saved_train_state()
        return state

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self.task.restore_train_state(state_dict.get("carried_state"), state_dict["epoch"],
                                      self.shard_id, self.num_shards)


def rows(state: List[RecurrentState], begin: int, end: int) -> List[RecurrentState]:
    """Streams [begin, end) of a state (batch: dim 1 of h, c, v, m; dim 0 of step)."""
    return [RecurrentState(*(None if t is None else (t[begin:end] if name == "step" else t[:, begin:end])
                             for name, t in zip(RecurrentState._fields, layer))) for layer in state]


@dataclass
class BPTTLanguageModelingConfig(LanguageModelingConfig):
    variable_bptt: bool = field(default=False, metadata={
        "help": "AWD-LSTM's random BPTT length in training: each chunk is N(L, 5) tokens long (L = "
                "--tokens-per-sample, or L/2 with probability 0.05; at least 5), drawn per epoch from "
                "--seed, and its update's learning rate is scaled by its length / L"})


class BPTTLanguageModelingTask(LanguageModelingTask):
    """LanguageModelingTask over StreamDatasets, carrying each stream's state between batches."""

    def __init__(self, args, dictionary, output_dictionary=None, targets=None):
        super().__init__(args, dictionary, output_dictionary, targets)
        if args.sample_break_mode not in (None, "none"):
            raise ValueError(f"--task {NAME} reads the text as one stream: --sample-break-mode must be "
                             f"none, got {args.sample_break_mode}")
        if getattr(args, "add_bos_token", False):
            raise ValueError(f"--task {NAME}: --add-bos-token is not supported (the stream starts with </s>)")
        self.train_state = CarriedState()
        self.valid_states: Dict[str, CarriedState] = {}
        self.gathered: Optional[List[RecurrentState]] = None
        self.update_lengths: List[int] = []
        self.averaging = None            # the NT-ASGD optimizer whose average validation scores

    def build_model(self, args, from_checkpoint=False):
        model = super().build_model(args, from_checkpoint)
        if not getattr(model.decoder, "carries_state", False):
            raise ValueError(f"--task {NAME} carries each stream's recurrent state from one batch to the "
                             "next: it needs a decoder that takes carried_state (--arch momentum_lstm_lm "
                             f"and its presets), got {type(model.decoder).__name__}")
        return model

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.args.data)
        path = f"{paths[(epoch - 1) % len(paths)]}/{split}"
        lines = data_utils.load_indexed_dataset(path, self.dictionary, self.args.dataset_impl,
                                                combine=combine)
        if lines is None:
            raise FileNotFoundError(f"Dataset not found: {split} ({path})")
        eos = torch.tensor([self.dictionary.eos()], dtype=torch.int32)
        tokens = torch.cat([eos] + [lines[i].to(torch.int32) for i in range(len(lines))])
        self.datasets[split] = StreamDataset(tokens, self.args.tokens_per_sample, self.dictionary.pad(),
                                             split, training=combine)

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None, num_shards=1, shard_id=0,
                           seed=1, num_workers=0, epoch=1, data_buffer_size=0, **kwargs):
        if not isinstance(dataset, StreamDataset):
            return super().get_batch_iterator(dataset, max_tokens=max_tokens, max_sentences=max_sentences,
                                              num_shards=num_shards, shard_id=shard_id, seed=seed,
                                              num_workers=num_workers, epoch=epoch,
                                              data_buffer_size=data_buffer_size, **kwargs)
        if not max_sentences:
            raise ValueError(f"--task {NAME} needs --batch-size (and --batch-size-valid for validation): "
                             "the number of streams of each rank")
        lengths = None
        if self.args.variable_bptt and dataset.training:
            def lengths(length):
                with data_utils.numpy_seed(seed, epoch):   # the same on every rank and on resuming
                    return random_chunk_lengths(self.args.tokens_per_sample, length, np.random)
        batches = dataset.arrange(max_sentences, num_shards, lengths)
        return StreamIterator(self, dataset=dataset, collate_fn=dataset.collater, batch_sampler=batches,
                              seed=seed, num_shards=num_shards, shard_id=shard_id, num_workers=num_workers,
                              epoch=epoch, buffer_size=data_buffer_size)

    def eval_lm_dataloader(self, dataset, **kwargs):
        """fairseq-eval-lm scores blocks as --task language_modeling does (its scorer carries no state;
        --context-window gives each block the tokens before it): the split is loaded as that task
        loads it. The carried-state perplexity is fairseq-validate's."""
        if isinstance(dataset, StreamDataset):
            LanguageModelingTask.load_dataset(self, dataset.split)
            dataset = self.datasets[dataset.split]
        return super().eval_lm_dataloader(dataset, **kwargs)

    def begin_epoch(self, epoch, model):
        super().begin_epoch(epoch, model)
        if self.train_state.epoch != epoch:         # a resumed epoch keeps the state it was saved with
            self.train_state = CarriedState(epoch=epoch)

    def begin_valid_epoch(self, epoch, model):
        super().begin_valid_epoch(epoch, model)
        self.valid_states = {}
        if self.averaging is not None and self.averaging.use_average(True):
            logger.info(f"NT-ASGD: validating the average of the last {self.averaging.averaged_steps} "
                        "iterates")

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        nt_asgd = nt_asgd_in(optimizer)
        if nt_asgd is not None:
            nt_asgd.task_swaps = True
            self.averaging = nt_asgd.optimizer
            self.averaging.use_average(False)
        # a dummy batch (ignore_grad) must not move the streams on
        carried = CarriedState(self.train_state.state) if ignore_grad else self.train_state
        if not ignore_grad and sample:
            self.update_lengths.append(sample["net_input"]["src_tokens"].shape[1])
        return super().train_step(with_state(sample, carried), model, criterion, optimizer, update_num,
                                  ignore_grad)

    def valid_step(self, sample, model, criterion):
        carried = self.valid_states.setdefault(sample.get("split"), CarriedState())
        return super().valid_step(with_state(sample, carried), model, criterion)

    def optimizer_step(self, optimizer, model, update_num):
        lengths, self.update_lengths = self.update_lengths, []
        if self.args.variable_bptt and lengths:
            # AWD-LSTM scales the rate of a chunk's update by its length
            rate = optimizer.get_lr()
            optimizer.set_lr(rate * sum(lengths) / len(lengths) / self.args.tokens_per_sample)
            super().optimizer_step(optimizer, model, update_num)
            optimizer.set_lr(rate)
        else:
            super().optimizer_step(optimizer, model, update_num)
        if self.train_state.state is not None and distributed_utils.get_data_parallel_world_size() > 1:
            # checkpoints are written by one rank: every rank's streams go into it
            group = distributed_utils.get_data_parallel_group()
            buffer = states_to_buffer(self.train_state.state)
            gathered = {}
            for name, value in buffer.items():
                parts = distributed_utils.all_gather(value.contiguous(), group)
                gathered[name] = torch.cat(parts, 0 if name.startswith("step") else 1)
            self.gathered = buffer_to_states(gathered, len(self.train_state.state))
        else:
            self.gathered = self.train_state.state

    def saved_train_state(self) -> Optional[dict]:
        """Every stream's carried state on the host, as a flat dict of tensors (a checkpoint's)."""
        if self.gathered is None:
            return None
        return {name: value.detach().cpu() for name, value in states_to_buffer(self.gathered).items()}

    def restore_train_state(self, saved: Optional[dict], epoch: int, shard_id: int, num_shards: int) -> None:
        if saved is None:
            return
        layers = 1 + max(int(name[len("h"):]) for name in saved if name.startswith("h"))
        state = buffer_to_states(saved, layers)
        streams = state[0].h.shape[1]
        if streams % num_shards:
            raise ValueError(f"the checkpoint carries {streams} streams, which {num_shards} ranks cannot "
                             "share: resume with the world size and --batch-size it was trained with")
        per_shard = streams // num_shards
        self.train_state = CarriedState(rows(state, shard_id * per_shard, (shard_id + 1) * per_shard), epoch)
        self.gathered = state


def with_state(sample, carried: CarriedState):
    """The sample with `carried` in its net_input (on the sample's device)."""
    if not sample:
        return sample
    carried.to(sample["net_input"]["src_tokens"].device)
    return {**sample, "net_input": {**sample["net_input"], "carried_state": carried}}


if NAME not in TASK_REGISTRY:
    register_task(NAME, dataclass=BPTTLanguageModelingConfig)(BPTTLanguageModelingTask)
