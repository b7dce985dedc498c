"""Multi-head self-attention of the shared block: q, k, v and output projections around
softmax attention, linear attention (Momentum Transformer, eq. 7) or momentum attention
(eq. 13 causal, eq. 14 non-causal, recurrent eq. 12 for generation) from `plugins.attention`;
and cross-attention (eq. 14 over another sequence, e.g. an encoder's output) for linear and
momentum attention."""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.api import attend_summary, summarize_keys
from ..attention.attend import attend, attend_step
from ..attention.context_parallel import context_parallel_attention
from ..attention.state import MomentumAttentionState, NonCausalSummary
from ..autocast import shared_input
from ..packing import Segments
from ..validation import check_int
from .config import BlockConfig
from .dropout import apply_dropout
from .kv_cache import KeyValueCache, attend_key_values, cached_softmax_attention, extend_key_value_cache
from .softmax_mask import SoftmaxMasks, softmax_mask


def softmax_self_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                           padding_mask: Optional[torch.Tensor], sliding_window: Optional[int] = None
                           ) -> torch.Tensor:
    """softmax(q kᵀ / √D) v over the real keys (padding_mask (B, N), True = real), each query within
    its `sliding_window` (causal; None: no window). Causal outputs at padded positions are 0, as
    momentum attention's are."""
    real = None if padding_mask is None else padding_mask.to(torch.bool)
    mask = softmax_mask(real, None, q.shape[2], q.device, causal=causal, window=sliding_window)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    return out * real[:, None, :, None].to(out.dtype) if causal and real is not None else out


def _segments_of_call(segments: Optional[Segments], padding_mask: Optional[torch.Tensor], x: torch.Tensor):
    """The given segments, or those of a padding mask passed for one call."""
    if padding_mask is None:
        return segments
    if segments is not None:
        raise ValueError("pass segments or padding_mask, not both")
    return Segments.from_padding_mask(padding_mask, *x.shape[:2])


def joinable(projections) -> bool:
    """Whether one GEMM on these linear layers' joined weights computes what their calls do: each a
    plain nn.Linear (not a subclass, as PEFT's LoRA layers and quantised linears are, nor
    parametrized), none with hooks (pruning, DeepSpeed ZeRO-3's gathering) or a forward replaced
    (accelerate's offload), all with a bias or none, and no global module hooks."""
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return False
    with_bias = {proj.bias is not None for proj in projections if type(proj) is nn.Linear}
    return len(with_bias) == 1 and all(
        type(proj) is nn.Linear and not proj._forward_hooks and not proj._forward_pre_hooks
        and "forward" not in proj.__dict__ for proj in projections)


class MultiHeadAttention(nn.Module):
    """(B, N, d_model) → (B, N, d_model): A(x) = Dropout(o_proj(attend(q_proj x, k_proj x, v_proj x)))
    with `config.heads` heads. `process_group` (momentum/linear only): context parallelism, see
    `plugins.attention.momentum_attention`. kdim / vdim (None: d_model): the feature sizes of the
    keys and values of `cross_attention`."""

    def __init__(self, config: BlockConfig, *, kdim: Optional[int] = None, vdim: Optional[int] = None):
        super().__init__()
        self.config = config
        d = config.d_model
        kdim = d if kdim is None else check_int(kdim, "kdim", low=1)
        vdim = d if vdim is None else check_int(vdim, "vdim", low=1)
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(kdim, d)
        self.v_proj = nn.Linear(vdim, d)
        self.o_proj = nn.Linear(d, d)
        self.dropout = nn.Dropout(config.attention_dropout)
        self.process_group = None

    def forward(self, x: torch.Tensor, *, segments: Optional[Segments] = None,
                state: Union[MomentumAttentionState, KeyValueCache, None] = None, recurrent: bool = False,
                padding_mask: Optional[torch.Tensor] = None, softmax_masks: Optional[SoftmaxMasks] = None
                ) -> Tuple[torch.Tensor, Union[MomentumAttentionState, KeyValueCache, None]]:
        """segments: where the sequences of x are (`plugins.packing.Segments`, built once per forward
        by the caller and trusted here; packed documents run each alone); None: every token real.
        padding_mask (B, N), True = real token: a convenience for a single call, turned into
        Segments here (pass segments instead from a stack of layers). recurrent=True (causal
        blocks): continue `state` (None: fresh) by eq. 12 (momentum/linear) or as a KeyValueCache
        (softmax) and return the new state. softmax_masks: the stack's masks of these segments
        (softmax only; None: built here). Returns (output, new state or None)."""
        segments = _segments_of_call(segments, padding_mask, x)
        q, k, v = self._projections(x)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        out, state = self.attend(q, k, v, segments=segments, state=state, recurrent=recurrent,
                                 softmax_masks=softmax_masks)
        return self._output(out), state

    def _projections(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q_proj x, k_proj x, v_proj x. Where gradients flow (training) and the three are plain
        linear layers, as one GEMM on their weights joined: a training step's forward then casts x
        and the weights once and multiplies once, and its backward forms x's gradient in one GEMM
        (summing the three in its float32 accumulator) and the weights' in another; per layer
        about a dozen kernels fewer, and x saved once for the backward instead of three times.
        Elsewhere (generation, evaluation) each projection runs, on x cast once (shared_input)."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if not (torch.is_grad_enabled() and joinable(projections)):
            x = shared_input(x)
            return projections[0](x), projections[1](x), projections[2](x)
        weight = torch.cat([proj.weight for proj in projections])
        bias = None if self.q_proj.bias is None else torch.cat([proj.bias for proj in projections])
        return F.linear(x, weight, bias).split([proj.out_features for proj in projections], dim=-1)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, d_model) → (B, H, N, D)."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.config.heads, self.config.head_dim).transpose(1, 2)

    def _output(self, out: torch.Tensor) -> torch.Tensor:
        """Heads (B, H, N, D) → Dropout(o_proj(concatenated heads)) (B, N, d_model)."""
        batch, _, length, _ = out.shape
        merged = out.transpose(1, 2).reshape(batch, length, self.config.d_model)
        return apply_dropout(self.dropout, self.o_proj(merged))

    def attend(self, q, k, v, *, segments: Optional[Segments] = None, state=None, recurrent=False,
               softmax_masks: Optional[SoftmaxMasks] = None):
        """The attention of `config.attention` on (B, H, N, D) heads laid out as `segments` says;
        returns (out, state). The state is a `MomentumAttentionState` (eq. 12) or, for softmax, a
        `KeyValueCache`. Momentum and linear attention run `plugins.attention.attend` with the
        config's one AttentionSpec; softmax reads the keys `softmax_masks` allows."""
        config = self.config
        if state is not None and not recurrent:
            raise ValueError("state is continued only with recurrent=True")
        if recurrent and not config.causal:
            raise ValueError("recurrent=True needs a causal block (causal=False is eq. 14, which has "
                             "no recurrence)")
        packed = segments is not None and segments.packed
        if packed and recurrent:
            raise ValueError("packed documents run without a recurrent state")
        if config.attention == "softmax":
            return self._attend_softmax(q, k, v, segments=segments, state=state, recurrent=recurrent,
                                        masks=softmax_masks)
        if recurrent:
            if state is not None and not isinstance(state, MomentumAttentionState):
                raise ValueError("state must be a MomentumAttentionState or None, got "
                                 f"{type(state).__name__}; "
                                 "pass the state this attention returned")
            return attend_step(q, k, v, state, config.attention_spec, segments=segments)
        if self.process_group is not None:
            return context_parallel_attention(q, k, v, config.attention_spec, segments=segments,
                                              process_group=self.process_group), None
        return attend(q, k, v, config.attention_spec, segments=segments), None

    def _attend_softmax(self, q, k, v, *, segments, state, recurrent, masks):
        """Eq. 1 over the keys the layout allows: own document, real, causal, within the sliding
        window (`plugins.transformer.softmax_mask`). recurrent=True appends k, v to the
        `KeyValueCache` `state` (None: fresh) and attends to all of it, so generation does not
        re-read the prefix."""
        causal, window = self.config.causal, self.config.sliding_window
        if self.process_group is not None:
            raise ValueError("attention='softmax' has no context parallelism: use attention='linear' or "
                             "'momentum'")
        if recurrent:
            padding_mask = None if segments is None else segments.padding_mask
            state = extend_key_value_cache(state, k, v, padding_mask)
            return cached_softmax_attention(q, state, sliding_window=window), state.within_window(window)
        if masks is None:
            masks = SoftmaxMasks(segments, q.shape[2], q.device)
        mask = masks.mask(causal=causal, window=window)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
        return masks.zero_padding(out, causal=causal), None

    def coefficients(self) -> Tuple[float, float]:
        """β and γ of eq. 12-14: the config's for attention="momentum"; 0 and 1 for "linear",
        which is momentum attention without momentum (eq. 7)."""
        if self.config.attention == "momentum":
            return self.config.momentum, self.config.step_size
        return 0.0, 1.0

    def summarize(self, key: torch.Tensor, value: Optional[torch.Tensor] = None, *,
                  padding_mask: Optional[torch.Tensor] = None) -> Union[NonCausalSummary, KeyValueCache]:
        """What cross-attention keeps of key (B, M, kdim) and value (B, M, vdim; None: key),
        padding_mask (B, M) True = real key: eq. 14's two key/value sums (linear and momentum
        attention; a decoding step then costs O(1) in M), or for softmax the projected keys and
        values with the mask (a `KeyValueCache`). Computed once per source sequence, it serves
        every later query."""
        value = key if value is None else value
        k, v = self._heads(self.k_proj(key)), self._heads(self.v_proj(value))
        if self.config.attention == "softmax":
            real = None if padding_mask is None else padding_mask.to(device=k.device, dtype=torch.bool)
            return KeyValueCache(k, v, real)
        momentum, step_size = self.coefficients()
        return summarize_keys(k, v, momentum=momentum, step_size=step_size,
                              feature_map=self.config.feature_map, padding_mask=padding_mask)

    def cross_attention(self, x: torch.Tensor, key: Optional[torch.Tensor] = None,
                        value: Optional[torch.Tensor] = None, *, padding_mask: Optional[torch.Tensor] = None,
                        summary: Union[NonCausalSummary, KeyValueCache, None] = None
                        ) -> Tuple[torch.Tensor, Union[NonCausalSummary, KeyValueCache]]:
        """Queries x (B, N, d_model) attend, never causally whatever config.causal, to key / value /
        padding_mask as in `summarize`, or to a `summary` an earlier call returned for the same keys
        (then leave key, value and padding_mask None). Returns (output (B, N, d_model), the summary,
        to pass to the next decoding step)."""
        if summary is None:
            if key is None:
                raise ValueError("cross_attention needs key (B, M, kdim) or the summary of an earlier call")
            summary = self.summarize(key, value, padding_mask=padding_mask)
        elif key is not None or value is not None or padding_mask is not None:
            raise ValueError("cross_attention takes either key/value/padding_mask or a summary of them, "
                             "not both")
        q = self._heads(self.q_proj(x))
        if isinstance(summary, KeyValueCache):
            out = attend_key_values(q, summary)
        else:
            out = attend_summary(q, summary, feature_map=self.config.feature_map)
        return self._output(out), summary
