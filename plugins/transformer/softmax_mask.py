"""Which keys each query of softmax attention (Momentum Transformer, eq. 1) reads in a batch laid
out as a `plugins.packing.Segments`: real keys only, of the query's own document (packed rows are
block-diagonal), none after it when causal, and only the last W real positions with a sliding
window W. `SoftmaxMasks` builds each mask once per forward and every softmax layer of the stack
shares it, so packed documents and padded rows give each sequence the outputs it has alone, as
momentum attention's kernels do."""
from typing import Dict, Optional, Tuple

import torch

from ..packing import Segments


def token_layout(segments: Optional[Segments], device
                 ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(real (B, N) bool, None when every token is real; document (B, N) int64, each token's packed
    document (0 at padding), None unless packed)."""
    if segments is None:
        return None, None
    if not segments.packed:
        return segments.padding_mask, None
    tokens = segments.batch * segments.length if segments.index is None else segments.index.numel()
    document = torch.searchsorted(segments.cu_seqlens[1:], torch.arange(tokens, device=device), right=True)
    real = None
    if segments.index is not None:
        real = segments.unpack_tokens(torch.ones(1, tokens, dtype=torch.bool, device=device))
    return real, segments.unpack_tokens(document[None])


def softmax_mask(real: Optional[torch.Tensor], document: Optional[torch.Tensor], length: int, device, *,
                 causal: bool, window: Optional[int] = None) -> Optional[torch.Tensor]:
    """(B or 1, 1, N, N) bool for SDPA, True where query i may read key j, from `token_layout`;
    None when no mask is needed (every token real, one document per row, no window: SDPA's
    `is_causal` says it all). Window distances count real tokens, so padding inside a row does
    not shrink it. A padded query of a causal or packed layout reads itself only (its output is
    zeroed afterwards); those of a non-causal padded row read the row's real keys."""
    if real is None and document is None and window is None:
        return None
    slots = torch.arange(length, device=device)
    allowed = torch.ones(1, length, length, dtype=torch.bool, device=device)
    if causal:
        allowed = slots[None, :, None] >= slots[None, None, :]
    if window is not None:
        rank = slots[None] if real is None else real.long().cumsum(-1) - 1
        allowed = allowed & (rank[:, :, None] - rank[:, None, :] < window)
    if document is not None:
        allowed = allowed & (document[:, :, None] == document[:, None, :])
    if real is not None:
        allowed = allowed & real[:, None, :]
        if causal or document is not None:
            allowed = allowed | torch.eye(length, dtype=torch.bool, device=device)
    return allowed[:, None]


class SoftmaxMasks:
    """The layout of one forward's `Segments` and the masks of its softmax layers, each
    (causal, window) built on first use and reused by the later layers."""

    def __init__(self, segments: Optional[Segments], length: int, device):
        self.length, self.device = length, device
        self.real, self.document = token_layout(segments, device)
        self._masks: Dict[Tuple[bool, Optional[int]], Optional[torch.Tensor]] = {}

    def mask(self, *, causal: bool, window: Optional[int]) -> Optional[torch.Tensor]:
        if (causal, window) not in self._masks:
            self._masks[causal, window] = softmax_mask(self.real, self.document, self.length, self.device,
                                                       causal=causal, window=window)
        return self._masks[causal, window]

    def zero_padding(self, out: torch.Tensor, *, causal: bool) -> torch.Tensor:
        """out (B, H, N, D) with padded positions 0, as momentum attention leaves them, for a
        causal or packed layout."""
        if self.real is None or not (causal or self.document is not None):
            return out
        return out * self.real[:, None, :, None].to(out.dtype)
