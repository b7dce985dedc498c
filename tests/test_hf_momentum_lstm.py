"""MomentumLSTMForCausalLM: config validation, wiring against plugins.rnn.MomentumLSTM, padded
rows equal to sequences alone, recurrent-cache generation equal to use_cache=False (greedy,
sampling, beam), left-padded batch generation equal to each prompt alone, save/load round trip;
every layer's hidden state (layer by layer, exactly equal to the single stack call);
torch.compile of every cell; MomentumLSTMForSequenceClassification."""
import builtins
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from hf_momentum import (
    MomentumLSTMCache,
    MomentumLSTMForCausalLM,
    MomentumLSTMForSequenceClassification,
    MomentumLSTMModel,
)
from plugins.rnn import VARIANTS, MomentumLSTM, cell_names
from plugins.rnn.variants import read_hyperparameters, unread_hyperparameters

PAD = 0
CELLS = cell_names("lstm")


def restart_for(cell):
    return 3 if cell in VARIANTS and VARIANTS[cell].restart != "refused" else None


def tiny(**kwargs):
    base = dict(vocab_size=100, hidden_size=16, num_hidden_layers=2, cell="momentum", momentum=0.5,
                step_size=0.7, pad_token_id=PAD, bos_token_id=1, eos_token_id=2, initializer_range=0.5)
    base.update(kwargs)
    base.setdefault("restart", restart_for(base["cell"]))
    for name in set(unread_hyperparameters(base["cell"])) - set(kwargs):
        base.pop(name, None)       # a value the cell would ignore is refused
    return AutoConfig.for_model("momentum_lstm", **base)


@pytest.mark.parametrize("kwargs, argument", [
    (dict(cell="gru"), "cell"), (dict(momentum=1.0), "momentum"), (dict(step_size=0.0), "step_size"),
    (dict(beta=1.2), "beta"), (dict(eps=0.0), "eps"), (dict(restart=0), "restart"),
    (dict(cell="sr", restart=None), "restart"), (dict(dropout=1.0), "dropout"),
    (dict(cell="momentum", restart=3), "restart"), (dict(cell="lstm", restart=3), "restart"),
    (dict(momentum=False), "momentum"), (dict(eps=float("inf")), "eps"),
    (dict(cell="sr", restart=True), "restart"),
    (dict(embedding_size=8), "tie_word_embeddings"), (dict(num_hidden_layers=0), "num_hidden_layers"),
])
def test_bad_config_values_raise(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        tiny(**kwargs)


def test_auto_classes_are_registered():
    assert type(AutoModel.from_config(tiny())) is MomentumLSTMModel
    assert type(AutoModelForCausalLM.from_config(tiny())) is MomentumLSTMForCausalLM
    assert type(AutoModelForSequenceClassification.from_config(tiny())) \
        is MomentumLSTMForSequenceClassification


def padded(generator, lengths, total, side):
    ids = torch.randint(3, 100, (len(lengths), total), generator=generator)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, n in enumerate(lengths):
        if side == "left":
            mask[row, total - n:] = 1
        else:
            mask[row, :n] = 1
    ids[mask == 0] = PAD
    return ids, mask


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_forward_matches_plugins_layer_and_padding(cell, side, make_generator):
    torch.manual_seed(0)
    model = MomentumLSTMModel(tiny(cell=cell)).eval()
    reference = MomentumLSTM(16, 16, 2, cell=cell, restart=restart_for(cell), batch_first=True,
                             **read_hyperparameters(cell, momentum=0.5, step_size=0.7))
    reference.load_state_dict(model.lstm.state_dict())
    ids, mask = padded(make_generator(), [7, 5, 2], 7, side)
    with torch.no_grad():
        batch = model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        for row in range(3):
            real = ids[row][mask[row].bool()][None]
            alone = model(input_ids=real, use_cache=False).last_hidden_state[0]
            expected, _ = reference(model.embed_tokens(real))
            torch.testing.assert_close(alone, expected[0])
            torch.testing.assert_close(batch[row][mask[row].bool()], alone, atol=1e-6, rtol=1e-5)


def generate(model, **kwargs):
    out = model.generate(max_new_tokens=6, min_new_tokens=6, output_scores=True, return_dict_in_generate=True,
                         pad_token_id=PAD, **kwargs)
    return out.sequences, torch.stack(out.scores, 1)


def finite(t):
    return torch.where(t.isfinite(), t, torch.zeros_like(t))


@pytest.mark.parametrize("cell", CELLS)
def test_generation_cache_padding_and_beams(cell, make_generator):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(cell=cell)).eval()
    ids, mask = padded(make_generator(), [6, 3], 6, "left")
    with torch.no_grad():
        seq, sc = generate(model, input_ids=ids, attention_mask=mask, do_sample=False)
        seq_nc, sc_nc = generate(model, input_ids=ids, attention_mask=mask, do_sample=False, use_cache=False)
        assert torch.equal(seq, seq_nc)
        torch.testing.assert_close(finite(sc), finite(sc_nc), atol=1e-5, rtol=1e-4)
        for row, n in enumerate([6, 3]):
            alone_seq, alone_sc = generate(model, input_ids=ids[row:row + 1, 6 - n:], do_sample=False)
            assert torch.equal(seq[row, 6:], alone_seq[0, n:])
            torch.testing.assert_close(finite(sc[row]), finite(alone_sc[0]), atol=1e-5, rtol=1e-4)
        beams = [generate(model, input_ids=ids, attention_mask=mask, num_beams=3, do_sample=False,
                          use_cache=use_cache)[0] for use_cache in (True, False)]
        samples = []
        for use_cache in (True, False):
            torch.manual_seed(1)
            samples.append(generate(model, input_ids=ids, attention_mask=mask, do_sample=True, top_k=0,
                                    use_cache=use_cache)[0])
    assert torch.equal(*beams)
    assert torch.equal(*samples)


def test_cache_holds_the_plugins_state_counting_real_tokens(make_generator):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(cell="nag")).eval()
    ids, mask = padded(make_generator(), [5, 2], 5, "left")
    cache = MomentumLSTMCache(model.config)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    state = cache.get_lstm_state()
    assert state.step.tolist() == [5, 2] and state.m is None
    assert state.h.shape == state.c.shape == (2, 2, 16) and state.v.shape == (2, 2, 64)
    assert cache.get_seq_length() == 5


def test_save_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(cell="adam")).eval()
    model.save_pretrained(tmp_path)
    assert {"modeling_momentum_lstm.py", "momentum_rnn_core.py", "configuration_momentum_lstm.py"} \
        <= set(os.listdir(tmp_path))
    assert "plugins.rnn.layers" in (tmp_path / "momentum_rnn_core.py").read_text()
    # the LSTM family's code does not pull in the transformer's configuration
    assert "configuration_momentum_transformer.py" not in os.listdir(tmp_path)
    assert "plugins/validation.py" in (tmp_path / "validation.py").read_text()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.arange(3, 13)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)
    assert "MomentumRNN" in (tmp_path / "README.md").read_text()


def test_unknown_cell_lists_the_registry():
    with pytest.raises(ValueError, match="cell must be one of") as error:
        tiny(cell="gru")
    assert all(repr(cell) in str(error.value) for cell in cell_names("lstm"))


@pytest.mark.parametrize("cell", CELLS)
def test_cached_token_is_one_cell_step(cell, make_generator, monkeypatch):
    """A generated token runs MomentumLSTM.step (the sequence computation, whole or segmented, is
    not called) and gives the logits and state of one forward over the whole sequence."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(cell=cell)).eval()
    ids = torch.randint(3, 100, (2, 9), generator=make_generator())
    cache = MomentumLSTMCache(model.config)
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        model(input_ids=ids[:, :5], past_key_values=cache, use_cache=True)

        def refuse(*args, **kwargs):
            raise AssertionError("the sequence layer ran for a single cached token")

        for name in ("_forward_sequence", "_forward_segments"):
            monkeypatch.setattr(model.model.lstm, name, refuse)
        for t in range(5, 9):
            logits = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
            torch.testing.assert_close(logits[:, 0], full[:, t], atol=1e-5, rtol=1e-5)
    assert cache.get_lstm_state().step.tolist() == [9, 9]


def test_save_load_with_weights_in_one_buffer(tmp_path):
    """On CUDA `flatten_parameters` makes the plain cell's weights views of one cuDNN buffer.
    The same layout, built here by hand: safetensors saving (which refuses shared storage
    unless transformers splits it) and loading keep every weight exactly."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(cell="lstm")).eval()
    params = [p for m in model.modules() if isinstance(m, MomentumLSTM) for p in m.parameters()]
    buffer = torch.cat([p.detach().reshape(-1) for p in params])
    offset = 0
    for p in params:
        p.data = buffer[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    assert len({p.untyped_storage().data_ptr() for p in params}) == 1
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name


def states_equal(a, b):
    return all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("cell", CELLS)
def test_hidden_states_layer_by_layer_equal_the_stack(cell, make_generator):
    """output_hidden_states runs the layers one at a time: the embeddings, then each layer's
    output, the last one bit for bit the stack's (unpadded, padded, and cached tokens one by
    one, with the same cache state); each layer equals a one-layer MomentumLSTM on its weights."""
    torch.manual_seed(0)
    model = MomentumLSTMModel(tiny(cell=cell, num_hidden_layers=3, embedding_size=12,
                                   tie_word_embeddings=False)).eval()
    ids, mask = padded(make_generator(), [7, 4, 7], 7, "left")
    with torch.no_grad():
        for kwargs in ({"attention_mask": mask}, {}):
            fast = model(input_ids=ids, use_cache=False, **kwargs).last_hidden_state
            out = model(input_ids=ids, use_cache=False, output_hidden_states=True, **kwargs)
            assert len(out.hidden_states) == 4
            assert torch.equal(out.last_hidden_state, fast) and out.hidden_states[-1] is out.last_hidden_state
        reference = MomentumLSTM(12, 16, 1, cell=cell, restart=restart_for(cell), batch_first=True,
                                 **read_hyperparameters(cell, momentum=0.5, step_size=0.7))
        reference.load_state_dict({f"{name[:-1]}0": p for name, p in model.lstm.named_parameters()
                                   if name.endswith("_l0")})
        torch.testing.assert_close(out.hidden_states[1], reference(out.hidden_states[0])[0], rtol=0, atol=0)
        caches = {layers: MomentumLSTMCache(model.config) for layers in (False, True)}
        for t in range(3, 7):  # a prefill of 4 tokens, then one token at a time
            start = 0 if t == 3 else t
            step = {layers: model(input_ids=ids[:, start:t + 1], attention_mask=mask[:, :t + 1],
                                  past_key_values=cache, output_hidden_states=layers).last_hidden_state
                    for layers, cache in caches.items()}
            assert torch.equal(step[False], step[True]), t
            assert states_equal(caches[False].get_lstm_state(), caches[True].get_lstm_state()), t


@pytest.mark.parametrize("cell, backend, padding", [(cell, "eager", False) for cell in CELLS]
                         + [("adam", "aot_eager", True)])
def test_torch_compile_matches_eager(cell, backend, padding, make_generator):
    """torch.compile(fullgraph=False) of the causal LM, forward and backward: eager's loss,
    logits and gradients (bit for bit with dynamo's eager backend; aot_eager re-traces forward
    and backward through AOTAutograd, here on a left-padded batch, the packed path). The
    Adam/RMSProp recurrence runs as a graph break (plugins.rnn.recurrence: dynamo cannot trace
    its dispatch). Inductor, the default backend, is left out for time (minutes per cell on
    2 cores)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(cell=cell, vocab_size=40, hidden_size=8)).train()
    ids, mask = padded(make_generator(), [5, 3] if padding else [5, 5], 5, "left")
    ids = ids % 40
    results = []
    for run in (model, torch.compile(model, backend=backend, fullgraph=False)):
        model.zero_grad()
        out = run(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False)
        out.loss.backward()
        results.append((out.loss.detach(), out.logits.detach(),
                        {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss, logits, grads), (compiled_loss, compiled_logits, compiled_grads) = results
    exact = dict(rtol=0, atol=0) if backend == "eager" else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled_loss, loss, **exact)
    torch.testing.assert_close(compiled_logits, logits, **exact)
    for name in grads:
        torch.testing.assert_close(compiled_grads[name], grads[name], **exact, msg=name)


@pytest.mark.parametrize("cell", ["adam", "rmsprop"])
def test_dynamic_compile_of_one_sequence_runs_the_recurrence_eagerly(cell):
    """torch.compile(dynamic=True) of the two-layer causal LM in training on a batch of one: eager's
    loss and gradients. Dynamo traced the Adam/RMSProp recurrence's autograd.Function there and
    stopped with an internal assertion instead of breaking the graph; the recurrence now sits behind
    an explicit graph break (adam_recurrence.adam_lstm_recurrence)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(cell=cell, vocab_size=40, hidden_size=8)).train()
    ids = torch.randint(3, 40, (1, 6))
    results = []
    for run in (model, torch.compile(model, backend="aot_eager", dynamic=True)):
        model.zero_grad()
        loss = run(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss, grads), (compiled_loss, compiled_grads) = results
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(compiled_grads[name], grads[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("cell", ["lstm", "momentum", "adam"])
def test_compiled_eval_forward_of_a_padded_batch_matches_eager(cell, make_generator, monkeypatch):
    """torch.compile (dynamo's eager backend, graph breaks allowed) of the causal LM in eval mode on
    a right-padded batch, its cache built as by default: eager's logits (to rounding: the Adam/RMSProp
    recurrence's graph breaks regroup float32 sums). The fused kernel's packed output went back
    into a PackedSequence through namedtuple._replace, which dynamo rebuilt after the graph break
    at packing with a 0-d batch_sizes (pad_packed_sequence: "tuple index out of range"). With
    builtins' dict holding itself (what exec of dataclass code without `__name__` leaves in a
    process), dynamo's rebuilding of the generator in the joined-weight lookup recursed without
    end; under torch.compile the traced graph now forms the join and skips the lookup."""
    monkeypatch.setitem(vars(builtins), "__builtins__", vars(builtins))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(cell=cell, vocab_size=40, hidden_size=8)).eval()
    ids, mask = padded(make_generator(), [5, 3], 5, "right")
    ids = ids % 40
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        got = torch.compile(model, backend="eager")(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cell", ["adam", "rmsprop"])
def test_adam_layers_on_cudnn_compile_whole(cell, make_generator):
    """Under the recurrence backend "cudnn" (eq. 15's drive first, one fused LSTM call per layer)
    the causal LM traces as one graph, forward and backward (fullgraph=True, aot_eager), where the
    default recurrence breaks it at every layer; float64, loss, logits and gradients equal eager's,
    on a left-padded batch (the packed path)."""
    from plugins.rnn.adam_recurrence import recurrence_backend
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(cell=cell, vocab_size=40, hidden_size=8)).double().train()
    ids, mask = padded(make_generator(), [5, 3], 5, "left")
    ids = ids % 40
    results = []
    with recurrence_backend("cudnn"):
        for run in (model, torch.compile(model, backend="aot_eager", fullgraph=True)):
            model.zero_grad()
            out = run(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False)
            out.loss.backward()
            grads = [p.grad.clone() for p in model.parameters()]
            results.append([out.loss.detach(), out.logits.detach(), *grads])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("side", ["left", "right"])
def test_sequence_classification_pools_the_last_real_token(side, make_generator):
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(tiny(num_labels=3)).eval()
    ids, mask = padded(make_generator(), [6, 3], 6, side)
    labels = torch.tensor([0, 2])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        # without a mask, the last token that is not pad_token_id (LlamaForSequenceClassification)
        unmasked = model(input_ids=ids).logits
        for row, n in enumerate([6, 3]):
            real = ids[row][mask[row].bool()][None]
            alone = model(input_ids=real).logits
            hidden = model.model(input_ids=real, use_cache=False).last_hidden_state
            torch.testing.assert_close(out.logits[row], alone[0], atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(alone, model.score(hidden[:, -1]), rtol=0, atol=0)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))
    if side == "right":  # the pads come after the last real token, so they change nothing before it
        torch.testing.assert_close(unmasked, out.logits, atol=1e-6, rtol=1e-5)


def test_sequence_classification_save_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(tiny(cell="adam", num_labels=2)).eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert type(loaded) is MomentumLSTMForSequenceClassification
    ids = torch.arange(3, 13)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_gradient_checkpointing_with_hidden_states_and_dropout(use_reentrant, make_generator):
    """Checkpointing the stack run layer by layer (hidden states in the loss) with dropout
    between layers on a padded batch: the recompute draws the same masks, so the gradients are
    those of the run without checkpointing."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny(cell="nag", num_hidden_layers=3, dropout=0.3)).train()
    ids, mask = padded(make_generator(), [6, 4], 6, "left")
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            model.activation_checkpointing_enable({"use_reentrant": use_reentrant})
        model.zero_grad()
        torch.manual_seed(1)
        out = model(input_ids=ids, attention_mask=mask, labels=ids, output_hidden_states=True)
        (out.loss + sum(h.sum() for h in out.hidden_states[1:-1])).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert model.model.stack_run.gradient_checkpointing
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5, msg=name)


def awd(**kwargs):
    """AWD-LSTM's stack: 3 layers, the last of the embedding's width (tied), a head with a bias."""
    return tiny(**{**dict(num_hidden_layers=3, embedding_size=6, last_hidden_size=6, lm_head_bias=True),
                   **kwargs})


def one_layer_chain(model, cell):
    """The model's stack as one-layer plugins MomentumLSTMs of each layer's width, run one after
    another (fairseq's AWDMomentumLSTM), on the model's own parameters."""
    sizes = [model.config.embedding_size, *model.config.layer_sizes()]
    stack = model.model.lstm
    layers = []
    for k, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layer = MomentumLSTM(n_in, n_out, 1, cell=cell, restart=restart_for(cell), batch_first=True,
                             **read_hyperparameters(cell, momentum=0.5, step_size=0.7)).double()
        source, index = (stack.top, 0) if k == len(sizes) - 2 else (stack, k)
        layers.append((layer, {f"{name}_l0": getattr(source, f"{name}_l{index}")
                               for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}))

    def run(ids):
        x = model.model.embed_tokens(ids)
        for layer, parameters in layers:
            x = torch.func.functional_call(layer, parameters, (x,))[0]
        return model.lm_head(x)
    return run


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_awd_stack_equals_one_layer_lstms_of_each_width(cell, side, make_generator):
    """float64 logits and gradients of a padded batch against each row alone through the layers
    written out one by one; the stack's parameters keep a uniform stack's names below `top`."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(awd(cell=cell)).double().eval()
    assert {name for name, _ in model.named_parameters() if "top" in name} == \
        {f"model.lstm.top.{name}_l0" for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
    assert model.model.lstm.weight_ih_l1.shape == (64, 16) and model.lm_head.bias.shape == (100,)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with torch.no_grad():
        model.lm_head.bias.normal_()
    reference = one_layer_chain(model, cell)
    ids, mask = padded(make_generator(), [7, 5, 2], 7, side)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    real = mask.bool()
    expected = [reference(ids[row][real[row]][None])[0] for row in range(3)]
    for row in range(3):
        torch.testing.assert_close(logits[row][real[row]], expected[row], rtol=0, atol=1e-12)
    weights = torch.randn(real.sum(), 100, dtype=torch.float64, generator=make_generator())
    got = torch.autograd.grad((logits[real] * weights).sum(), list(model.parameters()))
    want = torch.autograd.grad((torch.cat(expected) * weights).sum(), list(model.parameters()))
    for (name, _), a, b in zip(model.named_parameters(), got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10, msg=name)


@pytest.mark.parametrize("cell", ["adam", "nag"])
def test_awd_stack_decodes_token_by_token_with_beam_reordering(cell, make_generator):
    """The cache holds both widths' states (padded to the widest) and reorders them with the beams:
    cached steps after a left-padded prefill equal the full forward of the reordered rows."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(awd(cell=cell, hidden_size=10)).double().eval()
    ids, mask = padded(make_generator(), [6, 4, 6], 9, "left")
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        cache = MomentumLSTMCache(model.config)
        model(input_ids=ids[:, :6], attention_mask=mask[:, :6], past_key_values=cache, use_cache=True)
        rows = torch.arange(3)
        for t in range(6, 9):
            if t == 7:
                order = torch.tensor([2, 2, 0])
                cache.reorder_cache(order)
                rows = rows[order]
            step = model(input_ids=ids[rows, t:t + 1], attention_mask=mask[rows, :t + 1],
                         past_key_values=cache, use_cache=True).logits
            torch.testing.assert_close(step[:, 0], full[rows, t], rtol=0, atol=1e-12)
    state = cache.get_lstm_state()
    assert state.h.shape == (3, 3, 10) and not state.h[2, :, 6:].any()


def test_awd_stack_drops_out_between_its_parts_in_training(make_generator):
    """nn.LSTM's dropout between layers also sits between the layers below and the last one (two
    layers: nowhere else, as embedding_dropout is 0)."""
    ids = torch.randint(3, 100, (2, 8), generator=make_generator())
    outputs = {}
    for p in (0.0, 0.5):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(awd(num_hidden_layers=2, dropout=p))
        evaluated = model.eval()(input_ids=ids).logits
        outputs[p] = (model.train()(input_ids=ids).logits, evaluated)
    assert torch.equal(*outputs[0.0])
    assert not torch.allclose(*outputs[0.5])


def test_awd_heads_read_the_last_layers_width(make_generator):
    torch.manual_seed(0)
    config = awd(num_labels=3)
    classifier = MomentumLSTMForSequenceClassification(config).eval()
    assert classifier.score.in_features == 6
    ids = torch.randint(3, 100, (2, 5), generator=make_generator())
    hidden = classifier.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(classifier(input_ids=ids).logits, classifier.score(hidden[:, -1]))


@pytest.mark.parametrize("kwargs, message", [
    (dict(last_hidden_size=0), "last_hidden_size"),
    (dict(num_hidden_layers=1), r"last_hidden_size \(6\) differs from hidden_size \(16\) in a model of one"),
    (dict(embedding_size=16), r"embedding_size \(16\) == last_hidden_size \(6"),
    (dict(lm_head_bias=1), "lm_head_bias"),
])
def test_bad_awd_config_values_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        awd(**kwargs)


def test_awd_save_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(awd(cell="rmsprop")).eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert (loaded.config.last_hidden_size, loaded.config.lm_head_bias) == (6, True)
    assert model.state_dict().keys() == loaded.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
