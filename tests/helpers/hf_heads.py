"""The models the tests of the native families' task heads (token classification, question
answering) run on: causal and bidirectional momentum transformers, a bidirectional hybrid, and
LSTMs with a momentum and an Adam cell, all without dropout; and how those tests build padded
batches and compare gradients."""
import math

import torch
import torch.nn.functional as F
from transformers import AutoConfig

import hf_momentum  # noqa: F401  (registers the model types with the Auto classes)

VOCAB = 40
PAD = VOCAB - 1
TRANSFORMER = dict(num_attention_heads=2, intermediate_size=32, max_position_embeddings=64,
                   hidden_dropout=0.0, attention_momentum=0.5, attention_step_size=0.8, connection="adaptive")
MODELS = {
    "transformer-causal": ("momentum_transformer", TRANSFORMER),
    "transformer-bidirectional": ("momentum_transformer", dict(TRANSFORMER, is_causal=False)),
    "hybrid-bidirectional": ("momentum_transformer", dict(
        TRANSFORMER, is_causal=False, layer_types=["linear_attention", "full_attention"])),
    "lstm-momentum": ("momentum_lstm", dict(cell="momentum", initializer_range=0.5)),
    "lstm-adam": ("momentum_lstm", dict(cell="adam", initializer_range=0.5)),
}


def head_config(name, **overrides):
    """The config of MODELS[name] (two layers of 16, vocabulary VOCAB with pad id PAD)."""
    model_type, kwargs = MODELS[name]
    sizes = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, pad_token_id=PAD)
    return AutoConfig.for_model(model_type, **{**sizes, **kwargs, **overrides})


# DataCollatorWithFlattening's three ways of telling the documents of a packed row apart
FORMS = {"position_ids": {}, "flash_attn_kwargs": dict(return_flash_attn_kwargs=True),
         "seq_idx": dict(return_seq_idx=True)}


def padded(seqs, side, pad=PAD):
    """`seqs` (1D id tensors) as one batch padded with `pad` on `side` ("right" or "left"), and its
    attention mask."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(seqs):
        span = slice(0, len(s)) if side == "right" else slice(width - len(s), width)
        ids[row, span], mask[row, span] = s, 1
    return ids, mask


def assert_same_gradients(model, loss, expected):
    """`loss` and `expected` give every parameter of `model` the same gradient (or none)."""
    params = list(model.parameters())
    got = torch.autograd.grad(loss, params, allow_unused=True)
    want = torch.autograd.grad(expected, params, allow_unused=True)
    for (name, _), g, w in zip(model.named_parameters(), got, want):
        assert (g is None) == (w is None), name
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6, msg=name)


def assert_packed_row_is_its_documents(model, batch, documents, tol):
    """`batch`: one row of DataCollatorWithFlattening (with `labels`) holding `documents` (1D id
    tensors). Its logits equal each document's alone, its loss is the cross entropy of those logits
    with the row's labels, with that loss's gradients; and without the packing kwargs (one
    sequence) the documents would mix."""
    packed = model(**batch)
    flat = torch.cat([model(input_ids=d[None]).logits[0] for d in documents])
    expected = F.cross_entropy(flat, batch["labels"][0], ignore_index=-100)
    assert (packed.logits[0] - flat).abs().max() <= tol
    assert math.isclose(packed.loss.item(), expected.item(), rel_tol=1e-5)
    assert_same_gradients(model, packed.loss, expected)
    with torch.no_grad():
        mixed = model(input_ids=batch["input_ids"]).logits[0]
    assert (mixed - flat).abs().max() > 100 * tol


def assert_padded_rows_are_their_sequences(model, seqs, side, tol, padding_reaches_tokens=True):
    """`seqs` padded on `side` into one batch: with the attention mask, every real token's logits
    equal those of its sequence alone; without it (where padding can reach a real token: a
    bidirectional model, or padding on the left), the first row's would differ."""
    ids, mask = padded(seqs, side)
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=mask).logits
        unmasked = model(input_ids=ids).logits
        alone = [model(input_ids=s[None]).logits[0] for s in seqs]
    assert batched.shape[:2] == ids.shape
    for row, expected in enumerate(alone):
        assert (batched[row][mask[row].bool()] - expected).abs().max() <= tol, row
    if padding_reaches_tokens:
        real = mask[0].bool()
        assert (unmasked[0][real] - batched[0][real]).abs().max() > 100 * tol
