"""Packed documents (transformers' padding-free training, DataCollatorWithFlattening) in every
model of hf_momentum: the native momentum_transformer, momentum_lstm (momentum and Adam cells)
and stock Llama with "momentum" and "linear_attention", each with the collator's three forms
(position_ids that restart, its flash-attention kwargs, seq_idx). Logits, the loss and every
parameter gradient of a packed row equal those of each document run alone; each test also checks
that the row run as one document differs, so an implementation that mixes the documents fails it."""
import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F
from helpers.code_blocks import run_as_module
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, DataCollatorWithFlattening

import hf_momentum
from hf_momentum.packing import document_positions, document_starts

LENGTHS = (7, 1, 12, 5)
VOCAB = 100
TOL = 1e-4
FORMS = {
    "position_ids": dict(),
    "flash_attn_kwargs": dict(return_flash_attn_kwargs=True),
    "seq_idx": dict(return_seq_idx=True),
}
MODELS = ("momentum_transformer", "momentum_lstm-momentum", "momentum_lstm-adam", "momentum_lstm-awd",
          "llama-momentum", "llama-linear_attention")


def build(name, **overrides):
    torch.manual_seed(0)
    if name == "momentum_transformer":
        base = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=64, hidden_dropout=0.0,
                    attention_dropout=0.0, embedding_dropout=0.0, attention_momentum=0.5,
                    attention_step_size=0.8, connection="adaptive")
        base.update(overrides)
        config = AutoConfig.for_model("momentum_transformer", **base)
        return (AutoModelForCausalLM if config.is_causal else AutoModel).from_config(config)
    model_type, implementation = name.split("-")
    if model_type == "momentum_lstm":
        # "awd": AWD-LSTM's stack, whose last layer has the embedding's width
        awd = dict(cell="momentum", num_hidden_layers=3, embedding_size=8, last_hidden_size=8,
                   lm_head_bias=True)
        config = AutoConfig.for_model("momentum_lstm", **{
            **dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, momentum=0.5, step_size=0.7,
                   initializer_range=0.5), **(awd if implementation == "awd" else dict(cell=implementation))})
        return AutoModelForCausalLM.from_config(config)
    sizes = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    config = AutoConfig.for_model(model_type, **{**sizes, **overrides})
    hf_momentum.set_momentum_attention(config, momentum=0.5, step_size=0.8)
    auto = AutoModel if model_type == "bert" else AutoModelForCausalLM
    return auto.from_config(config, attn_implementation=implementation)


def documents(generator, lengths=LENGTHS):
    return [torch.randint(3, VOCAB, (n,), generator=generator) for n in lengths]


def collate(docs, form):
    return DataCollatorWithFlattening(**FORMS[form])([{"input_ids": d.tolist()} for d in docs])


def reference(model, docs):
    """Logits of each document alone, concatenated, and the next-token loss over all documents
    (each document predicts only its own tokens)."""
    logits = [model(input_ids=d[None]).logits[0] for d in docs]
    total = sum(F.cross_entropy(lg[:-1], d[1:], reduction="sum") for lg, d in zip(logits, docs))
    return torch.cat(logits), total / sum(len(d) - 1 for d in docs)


def gradients(model, loss):
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", MODELS)
def test_packed_logits_loss_and_gradients_equal_each_document_alone(name, form, make_generator):
    model = build(name)
    docs = documents(make_generator())
    batch = collate(docs, form)
    model.eval()
    with torch.no_grad():
        packed = model(**batch)
        alone, _ = reference(model, docs)
        mixed = model(input_ids=batch["input_ids"]).logits[0]
    assert packed.logits.shape == (1, sum(LENGTHS), VOCAB)
    assert (packed.logits[0] - alone).abs().max() <= TOL
    assert (mixed - alone).abs().max() > 100 * TOL          # the documents do interact when mixed

    model.train()
    out = model(**batch)
    expected_logits, expected_loss = reference(model, docs)
    assert (out.logits[0] - expected_logits).abs().max() <= TOL
    assert abs(out.loss.item() - expected_loss.item()) <= TOL
    got, want = gradients(model, out.loss), gradients(model, expected_loss)
    assert got.keys() == want.keys() and len(want) == len(list(model.parameters()))
    for key in want:
        assert torch.allclose(got[key], want[key], rtol=1e-4, atol=1e-5), key
    mixed = gradients(model, model(input_ids=batch["input_ids"], labels=batch["labels"]).loss)
    assert max((mixed[key] - want[key]).abs().max() for key in want) > 100 * TOL


@pytest.mark.parametrize("form", ("flash_attn_kwargs", "seq_idx"))
def test_native_model_derives_restarting_positions_without_position_ids(form, make_generator):
    """Without position_ids the native model's learned positions restart at every document found
    from cu_seq_lens / seq_idx."""
    model = build("momentum_transformer").eval()
    docs = documents(make_generator())
    batch = collate(docs, form)
    del batch["position_ids"]
    with torch.no_grad():
        assert (model(**batch).logits[0] - reference(model, docs)[0]).abs().max() <= TOL


@pytest.mark.parametrize("name", MODELS)
def test_several_padded_rows_each_packed(name, make_generator):
    """Two rows of packed documents, the shorter right-padded: position_ids restart within each
    row and the attention_mask marks the padding."""
    model = build(name).eval()
    docs = documents(make_generator(), (4, 9, 6, 1, 3))
    rows = [docs[:2], docs[2:]]
    width = max(sum(len(d) for d in row) for row in rows)
    ids = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.long)
    positions = torch.zeros(2, width, dtype=torch.long)
    for r, row in enumerate(rows):
        flat = torch.cat(row)
        ids[r, :len(flat)], mask[r, :len(flat)] = flat, 1
        positions[r, :len(flat)] = torch.cat([torch.arange(len(d)) for d in row])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        alone = reference(model, docs)[0]
    assert (logits[mask.bool()] - alone).abs().max() <= TOL


@pytest.mark.parametrize("name", ("momentum_transformer-encoder", "bert-momentum"))
def test_bidirectional_packed_documents_equal_each_alone(name, make_generator):
    """Eq. 14 per document in encoders: the native model with is_causal=False and stock BERT."""
    model = build("momentum_transformer", is_causal=False) if name.startswith("momentum") else \
        build("bert-momentum", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model.eval()
    docs = documents(make_generator())
    batch = collate(docs, "position_ids")
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).last_hidden_state[0]
        alone = torch.cat([model(input_ids=d[None]).last_hidden_state[0] for d in docs])
        mixed = model(input_ids=batch["input_ids"]).last_hidden_state[0]
    assert (packed - alone).abs().max() <= TOL
    assert (mixed - alone).abs().max() > 100 * TOL


@pytest.mark.parametrize("name", MODELS)
def test_disagreeing_forms_raise_naming_both(name, make_generator):
    model = build(name).eval()
    docs = documents(make_generator())
    batch = collate(docs, "flash_attn_kwargs")
    moved = batch["cu_seq_lens_q"] + torch.tensor([0, 1, 1, 1, 0], dtype=torch.int32)
    shifted = dict(batch, cu_seq_lens_q=moved, cu_seq_lens_k=moved)
    with pytest.raises(ValueError, match="position_ids and cu_seq_lens_q disagree"):
        model(**shifted)
    seq = collate(docs, "seq_idx")
    seq["seq_idx"] = torch.zeros_like(seq["seq_idx"])
    with pytest.raises(ValueError, match="position_ids and seq_idx disagree"):
        model(**seq)
    with pytest.raises(ValueError, match="cu_seq_lens_q .* and cu_seq_lens_k .* differ"):
        model(**dict(batch, cu_seq_lens_k=torch.tensor([0, sum(LENGTHS)], dtype=torch.int32)))
    with pytest.raises(ValueError, match="cu_seq_lens_q must start at 0"):
        tail = batch["cu_seq_lens_q"][1:]
        model(**dict(batch, cu_seq_lens_q=tail, cu_seq_lens_k=tail))
    with pytest.raises(ValueError, match="without cu_seq_lens_k"):
        model(**dict(batch, cu_seq_lens_k=None))


def test_stock_model_with_offsets_but_continuing_positions_raises(make_generator):
    """Llama makes position_ids 0..N-1 when none are given: RoPE would then see positions that do
    not restart, so offsets without the collator's position_ids are refused, not half-applied."""
    model = build("llama-momentum").eval()
    batch = collate(documents(make_generator()), "flash_attn_kwargs")
    del batch["position_ids"]
    with pytest.raises(ValueError, match="position_ids and cu_seq_lens_q disagree"):
        model(**batch)


@pytest.mark.parametrize("name", ["momentum_transformer", "momentum_lstm-momentum"])
def test_static_caches_refuse_packed_documents(name, make_generator):
    """A static cache (generate's cache_implementation="static") holds one sequence per row, as the
    recurrent cache does: packed documents are refused in each of the collator's forms, and
    positions that do not restart (shifted, or left padding's zeros before a row's first token) fill
    it as positions counted by the model do."""
    model = build(name).eval()

    def logits(**inputs):
        return model(**inputs, past_key_values=model.static_cache_class(model.config), use_cache=True).logits
    for form in FORMS:
        batch = collate(documents(make_generator()), form)
        with pytest.raises(ValueError, match="cannot fill one cache"):
            logits(**batch)
    ids, mask = batch["input_ids"][:, :6], torch.tensor([[0, 0, 1, 1, 1, 1]])
    assert logits(input_ids=ids, position_ids=torch.arange(3, 9)[None]).isfinite().all()
    torch.testing.assert_close(logits(input_ids=ids, attention_mask=mask,
                                      position_ids=torch.tensor([[0, 0, 0, 1, 2, 3]])),
                               logits(input_ids=ids, attention_mask=mask))


def test_native_model_refuses_a_cache_for_packed_documents(make_generator):
    model = build("momentum_transformer").eval()
    batch = collate(documents(make_generator()), "position_ids")
    with pytest.raises(ValueError, match="cannot fill one cache"):
        model(**batch, use_cache=True)
    assert model(**batch).past_key_values is None          # the config's use_cache is not applied
    cached = model(input_ids=batch["input_ids"][:, :3], use_cache=True).past_key_values
    with pytest.raises(ValueError, match="cannot continue a cache"):
        model(input_ids=batch["input_ids"][:, 3:], past_key_values=cached,
              seq_idx=torch.zeros(1, sum(LENGTHS) - 3, dtype=torch.int32))


def test_document_starts_and_positions_follow_transformers_rule():
    """A document starts where a position is not the previous real token's + 1; padding is skipped
    (generate()'s left-padded positions, 1 at padding, are one document), and positions count
    real tokens from each start."""
    pos = torch.tensor([[1, 1, 0, 1, 2, 0, 1], [0, 1, 2, 3, 0, 1, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0]]).bool()
    starts = document_starts(2, 7, "cpu", padding_mask=mask, position_ids=pos)
    assert starts.nonzero().tolist() == [[0, 2], [0, 5], [1, 0], [1, 4]]
    assert document_positions(starts, mask)[mask].tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 1]
    left_padded = torch.tensor([[1, 1, 0, 1, 2, 3, 4]])
    assert document_starts(1, 7, "cpu", padding_mask=mask[:1], position_ids=left_padded) is None


def test_readme_trainer_example_trains_on_packed_documents(tmp_path, monkeypatch):
    """The Trainer example of hf_momentum/README.md ("Packed documents") runs as written, with
    max_steps shrunk; its loss is a finite next-token loss."""
    text = (Path(__file__).resolve().parents[1] / "hf_momentum" / "README.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text.split("### Packed documents", 1)[1], re.S).group(1)
    shrunk = code.replace("max_steps=20", "max_steps=2")
    assert shrunk != code
    monkeypatch.chdir(tmp_path)
    namespace = run_as_module(shrunk, "hf_momentum/README.md")
    history = namespace["trainer"].state.log_history
    assert namespace["trainer"].state.global_step == 2 and 0 < history[-1]["train_loss"] < 10


def test_saved_model_keeps_documents_apart_as_remote_code(tmp_path, make_generator):
    """A saved native model loaded with trust_remote_code where this package is not importable
    (the generated core and packing.py beside the modeling file) packs exactly like the package."""
    from helpers.clean_process import run_clean

    model = build("momentum_transformer").eval()
    docs = documents(make_generator())
    batch = collate(docs, "flash_attn_kwargs")
    model.save_pretrained(tmp_path / "model")
    with torch.no_grad():
        torch.save({"batch": dict(batch), "alone": reference(model, docs)[0]}, tmp_path / "expected.pt")
    proc = run_clean("""
        import torch
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("model", trust_remote_code=True).eval()
        expected = torch.load("expected.pt")
        with torch.no_grad():
            logits = model(**expected["batch"]).logits[0]
        assert (logits - expected["alone"]).abs().max() <= 1e-4
        print("OK", type(model).__module__)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "OK transformers_modules" in proc.stdout


@pytest.mark.parametrize("name", ("momentum_lstm-adam", "momentum_transformer"))
def test_packed_hidden_states_of_every_layer_equal_each_document_alone(name, make_generator):
    """output_hidden_states runs the LSTM layer by layer (each a one-layer stack): packed too."""
    model = build(name).eval()
    docs = documents(make_generator())
    batch = collate(docs, "seq_idx")
    with torch.no_grad():
        packed = model(**batch, output_hidden_states=True).hidden_states
        alone = [model(input_ids=d[None], output_hidden_states=True).hidden_states for d in docs]
    assert len(packed) == model.config.num_hidden_layers + 1
    for layer, states in enumerate(packed):
        assert (states[0] - torch.cat([a[layer][0] for a in alone])).abs().max() <= TOL, layer
