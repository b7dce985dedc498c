"""AWD-LSTM's regularisers (Merity et al. 2018; the PTB setup of MomentumRNN, Appendix A.3), for
the fairseq and the transformers LSTM language models alike:

- locked (variational) dropout: one Bernoulli mask per (sequence, feature), shared by every step of
  the sequence. Sequences stay apart however they arrive: a padded batch's rows, a PackedSequence's
  sequences, or the segments of one packed row each get their own mask;
- embedding dropout: whole words dropped from the embedding matrix (one mask per call);
- weight drop: DropConnect on the hidden-to-hidden matrices, handed to a layer as its
  `recurrent_weight`, so the layer still runs its fused recurrence.
"""
from typing import Callable, List, Optional

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.utils.rnn import PackedSequence


def locked_dropout(x: Tensor, p: float, training: bool, *, time_dim: Optional[int] = 0,
                   sequence_ids: Optional[Tensor] = None, sequences: Optional[int] = None) -> Tensor:
    """x (..., features) with a fraction p of each sequence's features zeroed at every step, the rest
    scaled by 1 / (1 - p). Without sequence_ids each batch row is one sequence: x is (T, B, F) with
    time_dim=0, (B, T, F) with time_dim=1, or one step (B, F) with time_dim=None. With them, x's
    positions hold the steps of `sequences` sequences, sequence_ids (x's shape less the features,
    int64, on x's device) naming each position's."""
    if not training or p == 0.0:
        return x
    if sequence_ids is None:
        shape = list(x.shape)
        if time_dim is not None:
            shape[time_dim] = 1
        mask = x.new_empty(shape).bernoulli_(1.0 - p) / (1.0 - p)
        return x * mask
    mask = x.new_empty(sequences, x.shape[-1]).bernoulli_(1.0 - p) / (1.0 - p)
    return x * mask[sequence_ids]


def sequence_dropout(x, p: float, training: bool, locked: bool, *, time_dim: Optional[int] = 0,
                     sequence_ids: Optional[Tensor] = None, sequences: Optional[int] = None):
    """Dropout p of x (a tensor or a PackedSequence) in training: per element as nn.Dropout's, or
    `locked`: one mask per sequence (`locked_dropout`, its other arguments naming the sequences; a
    PackedSequence's sequences are its own)."""
    if not training or p == 0.0:
        return x
    if isinstance(x, PackedSequence):
        if locked:
            sizes = x.batch_sizes
            sequences = int(sizes[0])          # batch_sizes live on the host
            sequence_ids = torch.cat([torch.arange(n) for n in sizes.tolist()]).to(x.data.device,
                                                                                  non_blocking=True)
        return x._replace(data=sequence_dropout(x.data, p, True, locked, sequence_ids=sequence_ids,
                                                sequences=sequences))
    if not locked:
        return F.dropout(x, p, True)
    return locked_dropout(x, p, True, time_dim=time_dim, sequence_ids=sequence_ids, sequences=sequences)


def segment_ids(offsets_cpu: Tensor, device) -> Tensor:
    """(offsets[-1],) int64 on `device`: the segment [offsets[s], offsets[s+1]) of each position of a
    packed row, from the offsets' host copy (nothing is read back from the device)."""
    counts = offsets_cpu.diff()
    return torch.repeat_interleave(torch.arange(counts.numel()), counts).to(device, non_blocking=True)


def embedding_dropout(embed: nn.Module, tokens: Tensor, p: float, training: bool) -> Tensor:
    """`embed(tokens)` with a fraction p of the vocabulary's rows set to zero (the rest scaled by
    1 / (1 - p)): a dropped word is dropped at every position of the batch. The module is called and
    its output scaled by each token's row of the mask, which equals looking the tokens up in the
    masked weight, so what wraps the module (transformers' NEFTune and enable_input_require_grads
    hooks, a LoRA adapter) still runs."""
    embedded = embed(tokens)
    if not training or p == 0.0:
        return embedded
    # the vocabulary from the weight, which an adapter wrapping the module (PEFT) passes through
    mask = embedded.new_empty(embed.weight.shape[0], 1).bernoulli_(1.0 - p) / (1.0 - p)
    return embedded * F.embedding(tokens, mask)


def weight_drop(p: float, training: bool) -> Optional[Callable[[int, Tensor], Tensor]]:
    """The `recurrent_weight` of a plugins layer for DropConnect p on every hidden-to-hidden matrix
    (a new mask per call), or None when nothing is dropped."""
    if not training or p == 0.0:
        return None
    return lambda k, weight_hh: F.dropout(weight_hh, p, True)


def drawn_weight_drop(p: float, training: bool, weights: List[Tensor],
                      device: Optional[torch.device] = None) -> Optional[Callable[[int, Tensor], Tensor]]:
    """`weight_drop` with its masks drawn now, from `weights`' shapes, and applied by the returned
    `recurrent_weight` later, to whatever matrix the layer then holds (an adapter's W + BA that a
    wrapper puts in place for its forward only). Each mask is dropout of ones: the same draws from the
    generator as `weight_drop`'s on the same matrices, and the same products. `device` (default: the
    weights'): where the layer will run, when its weights are not there yet (accelerate's offload
    brings them in its forward only)."""
    if not training or p == 0.0:
        return None
    masks = [F.dropout(torch.ones(w.shape, dtype=w.dtype, device=device or w.device), p, True)
             for w in weights]
    return lambda k, weight_hh: weight_hh * masks[k]
