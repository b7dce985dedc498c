"""Issue 26: the native transformer's training forward compiles whole (torch.compile with
fullgraph=True: no graph break, so nothing in the path reads a device value to the host) and
gives eager's loss and gradients, for a padded batch and for packed documents, and on the Triton
path with dynamic shapes in one graph for every length. The backend is
aot_eager: dynamo and AOTAutograd trace forward and backward as inductor would, without the
code generation (minutes on the 2-core CI machine); tests/test_hf_compiled_decode.py and the GPU
tests compile with inductor."""
import importlib.util
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.hf_tiny_models import causal_lm
from transformers import DataCollatorWithFlattening

# aot_eager with inductor's decompositions: plain aot_eager replays elu_backward, whose CPU kernel
# lays out its result after the incoming gradient while the traced graph expected the layout of
# its input (pytorch/pytorch#120035); the packed path's gradient meets φ = elu+1 in that layout.
DECOMPOSED = "aot_eager_decomp_partition"


def loss_and_grads(model, fn, **batch):
    model.zero_grad(set_to_none=True)
    loss = fn(**batch)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def check_compiled_equals_eager(model, backend="aot_eager", dynamic=None, **batch):
    """dynamic=True keeps the graphs that earlier calls compiled (graphs_after_each resets once)."""
    def loss(**inputs):
        return model(**inputs, labels=inputs["input_ids"]).loss

    if not dynamic:
        torch._dynamo.reset()
    eager, eager_grads = loss_and_grads(model, loss, **batch)
    whole = torch.compile(loss, fullgraph=True, backend=backend, dynamic=dynamic)
    compiled, compiled_grads = loss_and_grads(model, whole, **batch)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    assert compiled_grads.keys() == eager_grads.keys() and len(eager_grads) > 4
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def graphs_after_each(model, backend, batches):
    """check_compiled_equals_eager under dynamic=True on each batch in turn, in one dynamo cache: the
    number of graphs compiled after each."""
    from torch._dynamo.testing import CompileCounterWithBackend
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    graphs = []
    for batch in batches:
        check_compiled_equals_eager(model, backend=counter, dynamic=True, **batch)
        graphs.append(counter.frame_count)
    return graphs


def test_padded_batch_compiles_whole_and_equals_eager(make_generator):
    model = causal_lm("transformer").train()
    gen = make_generator()
    ids = torch.randint(3, 60, (3, 37), generator=gen)          # 37: not a multiple of any chunk
    mask = torch.ones(3, 37, dtype=torch.long)
    mask[1, 20:] = 0
    mask[2, :9] = 0                                             # a left-padded row too
    check_compiled_equals_eager(model, input_ids=ids, attention_mask=mask)


def test_packed_documents_compile_whole_and_equal_eager(make_generator):
    model = causal_lm("transformer").train()
    gen = make_generator()
    ids = torch.randint(3, 60, (1, 40), generator=gen)
    positions = torch.tensor([list(range(15)) + list(range(19)) + list(range(6))])
    check_compiled_equals_eager(model, backend=DECOMPOSED, input_ids=ids, position_ids=positions)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_masked_lm_encoder_compiles_whole_and_equals_eager(packed, make_generator):
    """The bidirectional encoder (eq. 14) under MomentumTransformerForMaskedLM: its training forward
    compiles whole for a left-padded batch and for DataCollatorWithFlattening's cu_seq_lens row."""
    from helpers.hf_heads import head_config, padded
    from transformers import AutoModelForMaskedLM
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(head_config("transformer-bidirectional",
                                                         max_position_embeddings=128)).train()
    gen = make_generator()
    docs = [torch.randint(0, 37, (n,), generator=gen) for n in (5, 70, 3)]     # one past a chunk (64)
    if packed:
        batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": d.tolist()}
                                                                            for d in docs])
        del batch["labels"], batch["position_ids"]
    else:
        ids, mask = padded(docs, "left")
        batch = dict(input_ids=ids, attention_mask=mask)
    check_compiled_equals_eager(model, backend=DECOMPOSED, **batch)


def test_compiled_padded_rows_of_documents_equal_each_document_alone(make_generator):
    """Two right- and left-padded rows of packed documents, some longer than the chunk (64) and
    none a multiple of it: the compiled logits at the real tokens equal each document run alone
    (eager), and differ from the rows run unpacked, so documents that leaked into each other fail."""
    model = causal_lm("transformer", max_position_embeddings=128).eval()
    gen = make_generator()
    rows = [(70, 13), (5, 66, 9)]
    docs = [[torch.randint(3, 60, (n,), generator=gen) for n in row] for row in rows]
    width = 83
    ids = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.long)
    positions = torch.zeros(2, width, dtype=torch.long)
    for r, (row, begin) in enumerate(zip(docs, (0, 3))):
        end = begin + sum(len(d) for d in row)
        ids[r, begin:end], mask[r, begin:end] = torch.cat(row), 1
        positions[r, begin:end] = torch.cat([torch.arange(len(d)) for d in row])

    torch._dynamo.reset()
    logits = torch.compile(lambda **batch: model(**batch).logits, fullgraph=True, backend=DECOMPOSED)
    with torch.no_grad():
        packed = logits(input_ids=ids, attention_mask=mask, position_ids=positions)[mask.bool()]
        alone = torch.cat([model(input_ids=d[None]).logits[0] for row in docs for d in row])
        unpacked = model(input_ids=ids, attention_mask=mask).logits[mask.bool()]
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-5)
    assert (unpacked - alone).abs().max() > 1e-2


@pytest.mark.parametrize("form", [dict(return_flash_attn_kwargs=True), dict(return_seq_idx=True)],
                         ids=["cu_seq_lens", "seq_idx"])
def test_collator_forms_compile_whole_and_equal_each_document_alone(form, make_generator):
    """DataCollatorWithFlattening's other forms, without position_ids (the model derives them
    from the documents): compiled logits equal each document run alone (eager), also for a
    second batch whose number of documents differs (cu_seq_lens: a new shape, so a new graph)."""
    model = causal_lm("transformer").eval()
    gen = make_generator()
    torch._dynamo.reset()
    logits = torch.compile(lambda **inputs: model(**inputs).logits, fullgraph=True, backend=DECOMPOSED)
    for lengths in ((15, 19, 6), (3, 30, 1, 5, 1)):
        docs = [torch.randint(3, 60, (n,), generator=gen) for n in lengths]
        batch = DataCollatorWithFlattening(**form)([{"input_ids": d.tolist()} for d in docs])
        del batch["labels"], batch["position_ids"]
        with torch.no_grad():
            packed = logits(**batch)[0]
            alone = torch.cat([model(input_ids=d[None]).logits[0] for d in docs])
        torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-5)


def test_pytorch_path_compiles_one_graph_for_lengths_of_a_scan_level(make_generator):
    """The PyTorch path (CPU, or a rule other than eq. 12 on CUDA) under torch.compile(dynamic=True):
    padded batches of 2, 4 and 8 chunks (one level of the blocked scan: under 16 chunks) train
    through one graph, each with eager's loss and gradients; it had one graph per chunk count, and
    torch stops compiling after 8. One layer: a graph per length shows in any, and each layer costs
    about 15 s of symbolic-shape tracing on the 2-core CI machine (two layers: 48 s)."""
    model = causal_lm("transformer", max_position_embeddings=1024, num_hidden_layers=1).train()
    gen = make_generator()
    batches = []
    for N in (100, 230, 500):
        ids = torch.randint(3, 60, (2, N), generator=gen)
        mask = torch.ones(2, N, dtype=torch.long)
        mask[1, :N // 3] = 0
        batches.append(dict(input_ids=ids, attention_mask=mask))
    graphs = graphs_after_each(model, "aot_eager", batches)
    assert graphs[0] == graphs[1] == graphs[2], graphs


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.parametrize("form", ["padded", "packed"])
def test_triton_path_compiles_one_graph_for_every_length(form, make_generator, monkeypatch):
    """What a CUDA model runs (the Triton kernels, here on CPU tensors under the interpreter) under
    torch.compile(dynamic=True), as the Trainer's torch_compile meets batches of new lengths: padded
    batches of 1 and 3 chunks, or packed rows of 3 and 5 documents, train through one graph, each
    with eager's loss and gradients."""
    from plugins.attention import backends
    forced = backends.use_triton
    monkeypatch.setattr(backends, "use_triton",
                        lambda backend, device, float64: forced("triton", device, float64))
    # one layer, as in the PyTorch path's test above
    model = causal_lm("transformer", max_position_embeddings=160, num_hidden_layers=1).train()
    gen = make_generator()
    batches = []
    shapes = [(37, 19), (140, 70)] if form == "padded" else [(15, 19, 6), (3, 30, 1, 5, 1)]
    for shape in shapes:
        if form == "padded":
            N, cut = shape
            ids = torch.randint(3, 60, (3, N), generator=gen)
            mask = torch.ones(3, N, dtype=torch.long)
            mask[1, cut:] = 0
            mask[2, :9] = 0
            batch = dict(input_ids=ids, attention_mask=mask)
        else:
            ids = torch.randint(3, 60, (1, sum(shape)), generator=gen)
            batch = dict(input_ids=ids, position_ids=torch.cat([torch.arange(n) for n in shape])[None])
        batches.append(batch)
    graphs = graphs_after_each(model, DECOMPOSED, batches)
    assert graphs[0] == graphs[1], graphs
