"""Momentum / linear attention as `attn_implementation`s of any transformers model that
dispatches through `AttentionInterface` (Momentum Transformer, Section 3.1).

`register()` (run by `import hf_momentum`) adds two names to both registries:

- "momentum": eq. 13 for causal modules (decoders, `module.is_causal` True), eq. 14 for
  bidirectional ones (encoders, cross-attention), with the model config's
  `attention_momentum` β, `attention_step_size` γ and `attention_feature_map` φ.
- "linear_attention": the same with β = 0, γ = 1 (eq. 7 / eq. 5).

Each name has a mask function in `AttentionMaskInterface`, so the kernel receives the 2D
(batch, kv_length) padding mask (True = real token) instead of a 4D additive mask: padded
keys leave every sum, and a padded batch gives each sequence its unpadded outputs.

What a stock model keeps and loses under these implementations:
- Softmax scaling, attention-probability dropout, `output_attentions` and additive position
  biases (T5's relative bias) have no counterpart in linear attention and are ignored.
- Stock models keep their KV cache (dynamic or static), so `generate()` costs O(N) per new
  token (the whole prefix is re-read by the kernel). The native `MomentumTransformerForCausalLM` carries the
  O(1) recurrent state of eq. 12 instead.
- Packed documents (transformers' padding-free training, `DataCollatorWithFlattening`) are
  kept apart in self-attention: documents start where position_ids restart, at the collator's
  `cu_seq_lens_q/k`, or where its `seq_idx` changes (`hf_momentum.packing`), and each runs as
  if alone (`momentum_attention(..., cu_seqlens=...)`); forms that disagree raise a ValueError.
- Sliding windows and 4D custom masks are not supported: the mask function only forwards padding.
- Families: padding equivalence and generation are tested for TESTED_MODEL_TYPES; the forward
  pass of SMOKE_TESTED_MODEL_TYPES is checked on right-padded batches. gpt_neo, gptj, falcon,
  bloom, mpt and xlnet reject or mis-handle custom implementations (own attention classes or
  own mask code) and deberta-v2 silently ignores them: `set_momentum_attention` and
  `check_model` refuse these with a ValueError.
- RoPE models: linear attention after RoPE depends on absolute positions, so left-padded
  batches match unpadded sequences only with position_ids taken from the mask (cumsum − 1),
  which `generate()` does; a left-padded batch numbered from its padding (the model's default
  positions) is refused with a ValueError that says so.
- Saving: transformers does not serialize a model's attention implementation, so a stock model
  would come back from `from_pretrained` as softmax attention. `register()` therefore makes
  every config whose model runs "momentum" / "linear_attention" write `attn_implementation` and
  the β, γ, φ it runs with into its dict (config.json). The recorded name is a registered
  alias whose text is the instruction (`RECORDED_NAMES`): with `import hf_momentum` loading
  restores the attention; without it transformers refuses the unknown implementation and its
  error shows the name, i.e. to `pip install momentum-plugins` and `import hf_momentum`.
"""
import functools
import weakref
from typing import Optional

import torch
from transformers import AttentionInterface, PreTrainedConfig
from transformers.masking_utils import AttentionMaskInterface

from .configuration_momentum_transformer import check_attention_hyperparameters
from .momentum_core import (
    DEFAULT_ATTENTION_MOMENTUM,
    DEFAULT_ATTENTION_STEP_SIZE,
    AttentionSpec,
    BlockConfig,
    Segments,
    attend,
)
from .packing import COLLATOR, has_packing_kwargs, possible_document_starts

MOMENTUM = "momentum"
LINEAR = "linear_attention"
# The block's defaults (Momentum Transformer, eq. 12/13's β and γ; φ = elu + 1), written once there.
DEFAULT_MOMENTUM = DEFAULT_ATTENTION_MOMENTUM
DEFAULT_STEP_SIZE = DEFAULT_ATTENTION_STEP_SIZE
DEFAULT_FEATURE_MAP = BlockConfig.feature_map
# What a saved config.json records as its attn_implementation (registered as aliases).
RECORDED_NAMES = {
    MOMENTUM: "momentum (needs: pip install momentum-plugins, then import hf_momentum)",
    LINEAR: "linear_attention (needs: pip install momentum-plugins, then import hf_momentum)",
}
IMPLEMENTATION_OF = {**{name: name for name in RECORDED_NAMES},
                     **{recorded: name for name, recorded in RECORDED_NAMES.items()}}

TESTED_MODEL_TYPES = (
    "llama", "mistral", "qwen2", "gpt2", "gpt_neox", "bert", "roberta", "t5", "bart",
)
SMOKE_TESTED_MODEL_TYPES = (
    "qwen3", "gemma", "gemma2", "phi", "phi3", "mixtral", "olmo", "stablelm", "starcoder2", "cohere", "opt",
    "xlm-roberta", "albert", "distilbert", "electra", "modernbert", "mbart", "pegasus",
)
SUPPORTED_MODEL_TYPES = TESTED_MODEL_TYPES + SMOKE_TESTED_MODEL_TYPES
REJECTING_MODEL_TYPES = ("gpt_neo", "gptj", "falcon", "bloom", "mpt", "xlnet")
IGNORING_MODEL_TYPES = ("deberta-v2",)


def set_momentum_attention(config, *, momentum: float = DEFAULT_MOMENTUM,
                           step_size: float = DEFAULT_STEP_SIZE,
                           feature_map: str = DEFAULT_FEATURE_MAP):
    """Store the momentum-attention hyperparameters on `config` (and its sub-configs):
    `attention_momentum` β ∈ [0, 1) (default 0.6), `attention_step_size` γ > 0 (default 1.0),
    `attention_feature_map` φ ∈ {"elu", "relu"} (default "elu", elu+1 as in the paper; "identity"
    is refused: q, k projections can be negative, and so could the attention's denominator).
    Raises ValueError for bad values and for model families known to ignore or reject
    custom attention implementations. Returns the config."""
    momentum, step_size, feature_map = check_attention_hyperparameters(momentum, step_size, feature_map)
    check_model_type(getattr(config, "model_type", None))
    for cfg in _all_configs(config):
        cfg.attention_momentum = momentum
        cfg.attention_step_size = step_size
        cfg.attention_feature_map = feature_map
    return config


def check_model_type(model_type: Optional[str]) -> None:
    """Refuse the families that are known not to route attention through AttentionInterface."""
    if model_type in REJECTING_MODEL_TYPES or model_type in IGNORING_MODEL_TYPES:
        how = "rejects or mis-handles" if model_type in REJECTING_MODEL_TYPES else "silently ignores"
        raise ValueError(
            f"model_type {model_type!r} {how} custom attention implementations, so momentum attention "
            f"cannot be used with it; families known to work: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


def check_model(model) -> None:
    """Refuse a model instance whose attention does not dispatch through AttentionInterface."""
    check_model_type(getattr(model.config, "model_type", None))
    if not getattr(model, "_supports_attention_backend", False) or not model._can_set_attn_implementation():
        raise ValueError(
            f"{type(model).__name__} does not dispatch its attention through transformers' "
            "AttentionInterface, so momentum attention would be ignored"
        )


def momentum_attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask: Optional[torch.Tensor], scaling=None, dropout=0.0,
                               is_causal: Optional[bool] = None, **kwargs):
    """AttentionInterface function for "momentum": query (B, Hq, Lq, D), key/value (B, Hkv, Lk, D)
    with GQA heads not yet expanded → (output (B, Lq, Hq, Dv), None).

    Causal (eq. 13): with a KV cache the Lq queries are the last Lq of the Lk positions; earlier
    positions are run with zero queries and dropped (O(Lk) per step). Bidirectional (eq. 14):
    N is each sequence's number of real keys, Lq may differ from Lk (cross-attention)."""
    config = getattr(module, "config", None)
    beta, gamma, phi = check_attention_hyperparameters(
        getattr(config, "attention_momentum", DEFAULT_MOMENTUM),
        getattr(config, "attention_step_size", DEFAULT_STEP_SIZE),
        getattr(config, "attention_feature_map", DEFAULT_FEATURE_MAP))
    return _forward(module, query, key, value, attention_mask, is_causal, beta, gamma, phi, kwargs)


def linear_attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: Optional[torch.Tensor], scaling=None, dropout=0.0,
                             is_causal: Optional[bool] = None, **kwargs):
    """AttentionInterface function for "linear_attention": eq. 7 (causal) / eq. 5, i.e.
    momentum attention with β = 0, γ = 1, feature map from `attention_feature_map`."""
    phi = check_attention_hyperparameters(
        0.0, 1.0, getattr(getattr(module, "config", None), "attention_feature_map", DEFAULT_FEATURE_MAP))[2]
    return _forward(module, query, key, value, attention_mask, is_causal, 0.0, 1.0, phi, kwargs)


def padding_mask_function(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                          mask_function=None, attention_mask: Optional[torch.Tensor] = None, device=None,
                          **kwargs) -> Optional[torch.Tensor]:
    """AttentionMaskInterface function: the (batch, kv_length) bool mask of keys that exist and
    are not padding, or None without an attention_mask and unfilled slots. For causal masks,
    cache slots after the newest query (a StaticCache's unfilled tail) are marked absent too.
    Causality itself is applied by the kernel, not by the mask. Whether the mask marks every key
    real is not read here: the `Segments` built from it reads that once. A cache that has dropped
    its first keys (kv_offset > 0) is refused."""
    if isinstance(kv_offset, int) and kv_offset > 0:
        raise ValueError(
            f"the KV cache has dropped the keys before position {kv_offset} (a sliding-window or chunked "
            "layer's cache once the sequence passes its window): momentum / linear attention needs every key "
            "of the sequence. Keep prompt and generated tokens within the window, or use a config without "
            "sliding-window layers (e.g. sliding_window=None)")
    mask = None
    if attention_mask is not None:
        mask = attention_mask.to(device=device, dtype=torch.bool)
        missing = kv_offset + kv_length - mask.shape[-1]
        if missing > 0:
            mask = torch.nn.functional.pad(mask, (0, missing), value=False)
        mask = mask[:, kv_offset:kv_offset + kv_length]
    if mask_function is not None and _may_have_unfilled_slots(q_offset, q_length, kv_offset, kv_length) \
            and _is_causal(mask_function):
        positions = torch.arange(kv_offset, kv_offset + kv_length, device=device)
        filled = positions < torch.as_tensor(q_offset, device=device) + q_length
        if not bool(filled.all()):
            filled = filled.expand(batch_size, kv_length)
            mask = filled if mask is None else mask & filled
    return mask


def register() -> None:
    """Register "momentum" and "linear_attention" and their recorded names, and make configs
    record them when saved (idempotent)."""
    for name, forward in ((MOMENTUM, momentum_attention_forward), (LINEAR, linear_attention_forward)):
        for alias in (name, RECORDED_NAMES[name]):
            AttentionInterface.register(alias, forward)
            AttentionMaskInterface.register(alias, padding_mask_function)
    if not getattr(PreTrainedConfig.to_dict, "records_momentum_attention", False):
        PreTrainedConfig.to_dict = _recording_to_dict(PreTrainedConfig.to_dict)


def _recording_to_dict(to_dict):
    """`PreTrainedConfig.to_dict` that also writes the momentum attention a config's model runs
    (its recorded name and the β, γ, φ in effect, defaults included) — to_diff_dict, to_json
    and save_pretrained all go through it."""

    @functools.wraps(to_dict)
    def recording_to_dict(self):
        out = to_dict(self)
        name = IMPLEMENTATION_OF.get(getattr(self, "_attn_implementation_internal", None))
        if name is not None:
            out["attn_implementation"] = RECORDED_NAMES[name]
            out["attention_feature_map"] = getattr(self, "attention_feature_map", DEFAULT_FEATURE_MAP)
            if name == MOMENTUM:
                out["attention_momentum"] = getattr(self, "attention_momentum", DEFAULT_MOMENTUM)
                out["attention_step_size"] = getattr(self, "attention_step_size", DEFAULT_STEP_SIZE)
        return out

    recording_to_dict.records_momentum_attention = True
    return recording_to_dict


def _forward(module, query, key, value, attention_mask, is_causal, beta, gamma, phi, kwargs):
    if is_causal is None:
        is_causal = getattr(module, "is_causal", False)
    if query.shape[1] % key.shape[1] or value.shape[1] != key.shape[1]:
        raise ValueError(f"{type(module).__name__}: {query.shape[1]} query heads cannot share "
                         f"{key.shape[1]} key and {value.shape[1]} value heads; num_attention_heads must be "
                         "a multiple of num_key_value_heads (grouped-query attention)")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    mask = _padding_mask(attention_mask, query.shape[0], key.shape[2])
    q_len, kv_len = query.shape[2], key.shape[2]
    spec = AttentionSpec(momentum=beta, step_size=gamma, causal=bool(is_causal), feature_map=phi)
    segments = _segments(module, is_causal, query, q_len, kv_len, mask, kwargs)
    _refuse_a_window_that_bites(module, kwargs.get("sliding_window"), kv_len, segments)
    if segments.packed:
        return attend(query, key, value, spec, segments=segments).transpose(1, 2).contiguous(), None
    rows = None
    if is_causal and q_len != kv_len:
        if q_len > kv_len:
            raise ValueError(f"causal momentum attention got {q_len} queries for {kv_len} keys")
        rows = _query_rows(mask, q_len, kv_len, query.shape[0], query.device)
        full = query.new_zeros(*query.shape[:2], kv_len, query.shape[3])
        query = full.scatter(2, _expand(rows, query), query)
    out = attend(query, key, value, spec, segments=segments)
    if rows is not None:
        out = out.gather(2, _expand(rows, out))
    return out.transpose(1, 2).contiguous(), None


def _refuse_a_window_that_bites(module, window, kv_len: int, segments: Segments) -> None:
    """A sliding-window layer (Mistral's, Gemma 2's sliding layers, ModernBERT's local ones; the
    `sliding_window` transformers hands its attention) drops the keys `window` or more positions
    from a query, which momentum attention, a state over every key, has no form of. Where no
    sequence reaches that far, the window drops nothing and the layer is exact; a longer sequence
    (a packed row's longest document, read from the offsets' host copy; the row's length under
    torch.compile, which would break its graph on the read) is refused."""
    if not isinstance(window, int) or window <= 0:
        return
    longest = kv_len
    if segments.packed and segments.cu_seqlens_cpu is not None and not torch.compiler.is_compiling():
        longest = int(segments.cu_seqlens_cpu.diff().max())
    if longest > window:
        raise ValueError(
            f"{type(module).__name__} attends within a sliding window of {window} keys, which momentum / "
            f"linear attention has no form of: a sequence of {longest} tokens would lose its earlier keys in "
            f"the model's own attention but not in this one. Keep sequences within {window} tokens, or use a "
            "config without sliding-window layers (e.g. sliding_window=None)")


# The batch description of the latest forward (`plugins.packing.Segments`), built by its first
# attention layer and reused by the others: transformers hands every layer the same position_ids
# / collator tensor and the same mask object. Valid only while both are the very objects (and
# versions) seen, so a buffer rewritten in place is read again; the tensors are held weakly.
_LAST_SEGMENTS = {}
_ANCHORS = ("position_ids", "cu_seq_lens_q", "seq_idx")


def _segments(module, is_causal, query, q_len: int, kv_len: int, mask, kwargs) -> Segments:
    """The `Segments` of this forward's keys: packed documents (`_document_starts`) or padded rows."""
    anchor = next((kwargs[name] for name in _ANCHORS if isinstance(kwargs.get(name), torch.Tensor)), mask)
    self_attention = bool(is_causal) or not getattr(module, "is_decoder", False)
    key = (self_attention, q_len, kv_len, query.shape[0], query.device,
           None if mask is None else mask._version, None if anchor is None else anchor._version)
    last = _LAST_SEGMENTS
    if anchor is not None and last and last["key"] == key and last["anchor"]() is anchor and \
            (mask is None) == (last["mask"] is None) and (mask is None or last["mask"]() is mask):
        return last["segments"]
    starts = _document_starts(module, is_causal, query, q_len, kv_len, mask, kwargs)
    if starts is None:
        segments = Segments.from_padding_mask(mask, query.shape[0], kv_len)
    else:
        segments = Segments.from_starts_or_padding(starts, mask)
    # rows described without a permutation (eager) have no padding before a real token: nothing to read
    if self_attention and q_len == kv_len and (segments.packed or segments.order is not None):
        _refuse_rotary_positions_counting_padding(module, mask, kwargs.get("position_ids"))
    last.clear()
    if anchor is not None:
        last.update(key=key, anchor=weakref.ref(anchor), mask=None if mask is None else weakref.ref(mask),
                    segments=segments)
    return segments


def _refuse_rotary_positions_counting_padding(module, mask, position_ids) -> None:
    """Rotary position embeddings turn q and k by their positions before the attention sees them,
    and linear attention, unlike softmax, is not invariant to turning a whole row further: a row
    after left padding, numbered from its first padding token (the model's default positions,
    0 … length − 1), would differ from the sequence alone. Refused where it can be seen (a rotary
    model's self-attention handed its position_ids, eager): one read per forward of rows that
    need a permutation (padding before a real token), none for others."""
    if mask is None or not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2 or \
            position_ids.shape[-1] != mask.shape[-1] or torch.compiler.is_compiling():
        return
    config = getattr(module, "config", None)
    if not getattr(config, "rope_parameters", None) and getattr(config, "rope_theta", None) is None:
        return
    padding_before_real = (mask[:, 1:] > mask[:, :-1]).any(-1)
    counted = (position_ids == torch.arange(mask.shape[-1], device=position_ids.device)).all(-1)
    if bool((padding_before_real & counted).any()):
        raise ValueError(
            f"{type(module).__name__}: a left-padded batch whose position_ids count the padding (the "
            "model's default 0 … length − 1): rotary embeddings turn q and k by position before momentum / "
            "linear attention, which, unlike softmax, depends on that absolute turn, so a padded row would "
            "differ from its sequence alone. Pass position_ids=attention_mask.cumsum(-1) - 1 (generate() "
            "does) or pad on the right (tokenizer.padding_side = \"right\")")


def _document_starts(module, is_causal, query, q_len: int, kv_len: int, mask, kwargs):
    """Where packed documents (hf_momentum.packing) may start, in self-attention over the whole
    sequence: a causal module, or a bidirectional one that is not a decoder's cross-attention;
    whether any row holds several is read with the `Segments` built from them. The position_ids of
    a continued KV cache (q_len < kv_len) number only the new queries, as in transformers, which
    looks for packing only without a cache."""
    self_attention = bool(is_causal) or not getattr(module, "is_decoder", False)
    if self_attention and q_len == kv_len:
        return possible_document_starts(query.shape[0], q_len, query.device, padding_mask=mask, **kwargs)
    if has_packing_kwargs(**kwargs):
        where = "a KV cache continued by new queries" if self_attention else "cross-attention"
        raise ValueError(f"packed documents (cu_seq_lens_q / seq_idx from {COLLATOR}) cannot be used with "
                         f"{where} ({q_len} queries, {kv_len} keys): pack only full self-attention inputs")
    return None


def _query_rows(mask, q_len: int, kv_len: int, batch: int, device) -> torch.Tensor:
    """Key positions of the queries when a cache supplies more keys than queries: the q_len
    positions ending at each row's last present key (the newest token is never padding)."""
    if mask is None:
        end = torch.full((batch,), kv_len, device=device)
    else:
        last = torch.where(mask, torch.arange(kv_len, device=device), -1).amax(-1)
        end = torch.clamp(last + 1, min=q_len)
    return end[:, None] - q_len + torch.arange(q_len, device=device)


def _expand(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return rows[:, None, :, None].expand(like.shape[0], like.shape[1], rows.shape[1], like.shape[3])


def _may_have_unfilled_slots(q_offset, q_length: int, kv_offset: int, kv_length: int) -> bool:
    """Whether keys may lie after the newest query (a StaticCache's unfilled tail): not when the
    offsets are host numbers that say the keys end with the queries (a dynamic cache, no cache),
    so neither the mask function nor the slots are read then."""
    return isinstance(q_offset, torch.Tensor) or kv_offset + kv_length > q_offset + q_length


def _is_causal(mask_function) -> bool:
    """Whether a transformers mask_function forbids a query from seeing the next key."""
    zero, one = torch.tensor(0), torch.tensor(1)
    return not bool(mask_function(zero, zero, zero, one))


def _padding_mask(attention_mask, batch: int, kv_len: int) -> Optional[torch.Tensor]:
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(
            "momentum attention needs the 2D (batch, kv_length) padding mask made by its mask function; "
            f"got a mask of shape {tuple(attention_mask.shape)} (custom 4D masks are not supported)"
        )
    mask = attention_mask.to(torch.bool)
    if mask.shape[-1] != kv_len:
        mask = padding_mask_function(batch, 0, kv_len, attention_mask=mask, device=mask.device)
    return mask


def _all_configs(config):
    seen, stack = [], [config]
    while stack:
        cfg = stack.pop()
        if any(cfg is s for s in seen):
            continue
        seen.append(cfg)
        for key in getattr(cfg, "sub_configs", {}) or {}:
            sub = getattr(cfg, key, None)
            if sub is not None:
                stack.append(sub)
    return seen
