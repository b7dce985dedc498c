"""Truncated backpropagation through time over contiguous streams, as AWD-LSTM trains (Merity et al.;
MomentumRNN's PTB and WikiText setups, Appendix A.3): a split's tokens cut into equal streams, and
each stream into chunks. fairseq_momentum's `--task language_modeling_bptt` and
recipes/hf/train_clm.py's `--bptt` both cut with these, so the two toolkits train on the same chunks.
"""
from itertools import accumulate
from typing import List, Optional, Sequence

__all__ = ["stream_length", "random_chunk_lengths", "chunk_bounds"]


def stream_length(tokens: int, streams: int, split: str, streams_from: str) -> int:
    """Input tokens per stream when a split of `tokens` tokens (inputs, then each input's next token)
    is cut into `streams` equal streams; the remainder is dropped. `streams_from` names the arguments
    that set `streams`, for the refusal of a split with fewer input tokens than streams."""
    length = (tokens - 1) // streams
    if length < 1:
        raise ValueError(f"the {split} split has {tokens - 1} input tokens, fewer than its {streams} streams "
                         f"({streams_from}): each stream needs one input and its target")
    return length


def random_chunk_lengths(bptt: int, length: int, rng) -> List[int]:
    """AWD-LSTM's training chunk lengths covering `length` tokens: N(bptt, 5), or N(bptt / 2, 5) with
    probability 0.05, at least 5. `rng`: a numpy Generator, RandomState, or the `numpy.random`
    module (its global generator, seeded by the caller)."""
    sizes, covered = [], 0
    while covered < length:
        mean = bptt if rng.random() < 0.95 else bptt / 2
        sizes.append(max(5, int(rng.normal(mean, 5))))
        covered += sizes[-1]
    return sizes


def chunk_bounds(length: int, bptt: int, sizes: Optional[Sequence[int]] = None) -> List[int]:
    """Chunk t of a stream of `length` tokens is [bounds[t], bounds[t + 1]): `bptt` tokens each, or
    `sizes` long (the last chunk cut to fit; sizes past the end are unused)."""
    bounds = [0]
    for end in accumulate(sizes if sizes is not None else [bptt] * -(-length // bptt)):
        bounds.append(min(end, length))
        if end >= length:
            break
    return bounds
