"""Context parallelism for the native momentum transformer: one batch of sequences split along
the sequence over the ranks of a process group, each rank holding a contiguous slice in rank
order (docs/context_parallel.md, "Hugging Face models").

    enable_context_parallel(model, group)       # every momentum attention layer exchanges states
    inputs = shard_batch({"input_ids": ids, "labels": ids}, group)   # per-token heads: shift_labels=False
    loss = model(**inputs).loss                  # this rank's share of the whole-sequence loss
    loss.backward()                              # on every rank; then sum the gradients over the group
    whole = whole_sequence_loss(loss, group)     # the loss one process would report

Positions are global (the slice's offset + its count). A causal LM's labels are shifted once over
the whole sequence before the split, so the last token of a slice is scored against the first token
of the next; a token classifier's or masked LM's (`shard_batch(..., shift_labels=False)`, the
masked LM's attention bidirectional over all ranks, eq. 14) are sliced as they are. Each rank's loss
is its tokens' summed cross-entropy divided by the real label count of the whole batch: the ranks'
losses add up to the single-process loss and their parameter gradients add up to its gradients.
"""
from collections.abc import Mapping
from typing import Optional

import torch
import torch.distributed as dist

from plugins.attention.context_parallel import slice_bounds
from plugins.transformer import MultiHeadAttention
from plugins.validation import check_bool, check_group

from .modeling_momentum_transformer import (
    MomentumTransformerForQuestionAnswering,
    MomentumTransformerForSequenceClassification,
    MomentumTransformerModel,
)

IGNORE_INDEX = -100
BATCH_KEYS = ("input_ids", "attention_mask", "labels")


def enable_context_parallel(model: torch.nn.Module, group: Optional[dist.ProcessGroup]) -> torch.nn.Module:
    """Makes every momentum attention layer of a native momentum transformer run over `group`
    (`plugins.attention.context_parallel`); `group=None` turns it off. The model then
    needs the inputs of `shard_batch` (global position_ids, no cache). Returns the model."""
    if group is not None:
        check_group(group, "group")
    unsplittable = {MomentumTransformerForSequenceClassification: "pools over its tokens",
                    MomentumTransformerForQuestionAnswering: "picks one answer span over its tokens"}
    for head, why in unsplittable.items():
        if isinstance(model, head):
            raise ValueError(f"model: {head.__name__} {why}, which context parallelism splits over ranks; "
                             "use MomentumTransformerModel, ...ForCausalLM, ...ForTokenClassification or "
                             "...ForMaskedLM")
    bases = [m for m in model.modules() if isinstance(m, MomentumTransformerModel)]
    if not bases:
        raise ValueError(f"model: context parallelism supports the native momentum_transformer only, "
                         f"got {type(model).__name__} (no MomentumTransformerModel inside)")
    softmax = sorted({i for base in bases for i in base.config.softmax_layers()})
    if group is not None and softmax:
        raise ValueError(f"model: layer_types has softmax layers ({softmax}), which have no context "
                         "parallelism (each rank would attend to its own slice only); use a model whose "
                         "layer_types are all 'linear_attention'")
    for module in model.modules():
        if isinstance(module, MomentumTransformerModel):
            module.context_parallel_group = group
        elif isinstance(module, MultiHeadAttention):
            module.process_group = group
    return model


def shard_batch(batch: Mapping, group: dist.ProcessGroup, shift_labels: bool = True) -> dict:
    """This rank's slice of a batch, given whole on every rank: `input_ids` (B, T), optional
    `attention_mask` (B, T, 1 = real token) and `labels` (B, T, -100 = ignored, as for the model in
    one process). Returns the model's keyword arguments: the slices along T (the split of
    `plugins.attention.context_parallel.shard_sequence`), global `position_ids` (counting real
    tokens, as the model does in one process), `use_cache=False` and, with labels, the labels'
    slice and `num_items_in_batch` (the labels the whole batch scores), so that the loss is this
    rank's share of the whole-sequence loss. shift_labels: a causal LM's labels (the default), which
    predict the next token: `shift_labels` are then the labels shifted over the whole sequence and
    sliced, so a slice's last token is scored against the next slice's first. False: a token
    classifier's or masked LM's, one label per token, taken as they are."""
    group = check_group(group, "group")
    check_bool(shift_labels, "shift_labels")
    if not isinstance(batch, Mapping):
        raise ValueError(f"batch must be a mapping with input_ids (and attention_mask, labels), "
                         f"got {type(batch).__name__}")
    unknown = sorted(set(batch) - set(BATCH_KEYS))
    if unknown:
        raise ValueError(f"batch: shard_batch takes {', '.join(BATCH_KEYS)}, got {unknown} (packed sequences "
                         f"and given position_ids are not supported with context parallelism)")
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise ValueError(f"batch['input_ids'] must be an integer tensor (batch, length), got "
                         f"{getattr(ids, 'shape', type(ids).__name__)}")
    for key in BATCH_KEYS[1:]:
        value = batch.get(key)
        if value is not None and (not isinstance(value, torch.Tensor) or value.shape != ids.shape):
            raise ValueError(f"batch['{key}'] must be a tensor of input_ids' shape {tuple(ids.shape)}, got "
                             f"{getattr(value, 'shape', type(value).__name__)}")
    mask, labels = batch.get("attention_mask"), batch.get("labels")
    if mask is None:
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    else:
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    start, stop = slice_bounds(ids.shape[1], dist.get_world_size(group), dist.get_rank(group))
    out = {"input_ids": ids[:, start:stop], "position_ids": positions[:, start:stop], "use_cache": False}
    if mask is not None:
        out["attention_mask"] = mask[:, start:stop]
    if labels is not None:
        out["labels"] = labels[:, start:stop].contiguous()      # transformers' losses view them flat
        scored = labels
        if shift_labels:
            scored = torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), IGNORE_INDEX)], dim=1)
            out["shift_labels"] = scored[:, start:stop].contiguous()
        out["num_items_in_batch"] = (scored != IGNORE_INDEX).sum()
    return out


def whole_sequence_loss(loss: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The sum of the ranks' losses (detached), i.e. the loss of the whole batch in one process."""
    group = check_group(group, "group")
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    return total
