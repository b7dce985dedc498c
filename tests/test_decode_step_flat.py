"""Issue 27 item 4, offline: a greedy decoding step of MomentumTransformerForCausalLM with a
MomentumCache does the same work at any context length (the state is O(1)): the aten ops it
dispatches, with the shapes and dtypes of their tensor arguments and results, are recorded by a
TorchDispatchMode at contexts 512 and 8192 and must be the same lists. The step is called as
generate() calls it, with the attention mask of the whole context. A view op (the slice that
takes the new tokens' mask columns) reads no element, so only its result's size is compared:
any op that computes on the whole mask still differs."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import AutoConfig, AutoModelForCausalLM

from hf_momentum import MomentumCache


class OpRecorder(TorchDispatchMode):
    """Every aten op with the (shape, dtype) of each tensor among its arguments and results (of
    a view op, its results only)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        touched = out if func.is_view else (args, kwargs, out)
        tensors = [t for t in tree_leaves(touched) if isinstance(t, torch.Tensor)]
        self.ops.append((str(func), tuple((tuple(t.shape), t.dtype) for t in tensors)))
        return out


def decode_step_ops(model, context: int, gen):
    ids = torch.randint(3, 100, (1, context), generator=gen)
    cache = MomentumCache(model.config)
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        mask = torch.ones(1, context + 1, dtype=torch.long)
        position = torch.tensor([context])
        with OpRecorder() as recorder:
            model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True,
                  cache_position=position)
    return recorder.ops


def test_decode_step_does_the_same_ops_on_the_same_sizes_at_any_context(make_generator):
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "momentum_transformer", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=8256, hidden_dropout=0.0, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, attention_momentum=0.5, attention_step_size=0.8)
    model = AutoModelForCausalLM.from_config(config).eval()
    short = decode_step_ops(model, 512, make_generator())
    long = decode_step_ops(model, 8192, make_generator())
    assert len(short) > 10
    grown = [(a, b) for a, b in zip(short, long) if a != b]
    assert len(short) == len(long) and not grown, f"ops that change with the context: {grown[:5]}"
