"""Issue 26: the native transformer's training forward compiles whole (torch.compile with
fullgraph=True: no graph break, so nothing in the path reads a device value to the host) and
gives eager's loss and gradients, for a padded batch and for packed documents. The backend is
aot_eager: dynamo and AOTAutograd trace forward and backward as inductor would, without the
code generation (minutes on the 2-core CI machine); tests/test_hf_compiled_decode.py and the GPU
tests compile with inductor."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.hf_tiny_models import causal_lm


def loss_and_grads(model, fn, **batch):
    model.zero_grad(set_to_none=True)
    loss = fn(**batch)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def check_compiled_equals_eager(model, **batch):
    def loss(**inputs):
        return model(**inputs, labels=inputs["input_ids"]).loss

    torch._dynamo.reset()
    eager, eager_grads = loss_and_grads(model, loss, **batch)
    whole = torch.compile(loss, fullgraph=True, backend="aot_eager")
    compiled, compiled_grads = loss_and_grads(model, whole, **batch)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    assert compiled_grads.keys() == eager_grads.keys() and len(eager_grads) > 4
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_padded_batch_compiles_whole_and_equals_eager(make_generator):
    model = causal_lm("transformer").train()
    gen = make_generator()
    ids = torch.randint(3, 60, (3, 37), generator=gen)          # 37: not a multiple of any chunk
    mask = torch.ones(3, 37, dtype=torch.long)
    mask[1, 20:] = 0
    mask[2, :9] = 0                                             # a left-padded row too
    check_compiled_equals_eager(model, input_ids=ids, attention_mask=mask)


@pytest.mark.xfail(strict=True, reason=(
    "issue 26: a packed batch's document layout is copied to the host once per forward "
    "(plugins.packing.Segments.from_document_starts: the varlen kernels size their grids from it), "
    "which torch.compile(fullgraph=True) refuses as a graph break"))
def test_packed_documents_compile_whole_and_equal_eager(make_generator):
    model = causal_lm("transformer").train()
    gen = make_generator()
    ids = torch.randint(3, 60, (1, 40), generator=gen)
    positions = torch.tensor([list(range(15)) + list(range(19)) + list(range(6))])
    check_compiled_equals_eager(model, input_ids=ids, position_ids=positions)
