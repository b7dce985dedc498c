"""AWD-LSTM's regularisers in MomentumLSTMForCausalLM (plugins.rnn.awd): locked dropout keeps one mask
per sequence at every step, and per document when documents are packed in one row (a packed batch
trains exactly as the same documents padded, under one seed); weight drop is DropConnect on every
hidden-to-hidden matrix with gradients through its mask; word dropout drops a word everywhere; none acts
at eval time; gradient checkpointing recomputes the same masks. (Training equal to fairseq's
momentum_lstm_lm under one seed: test_fairseq_lstm_lm_to_hf.py.)"""
import copy

import pytest
import torch
from helpers.hf_tiny_models import AWD
from transformers import AutoConfig, AutoModelForCausalLM

import hf_momentum  # noqa: F401  (registers the model types with the Auto classes)
from hf_momentum import MomentumLSTMConfig
from plugins.rnn import MomentumLSTM
from plugins.rnn.variants import unread_hyperparameters

REGULARISERS = dict(locked_dropout=True, dropout=0.3, embedding_dropout=0.4, output_dropout=0.25,
                    weight_drop=0.5, word_dropout=0.2)
STACKS = {"uniform": dict(num_hidden_layers=3), "awd": AWD}


def causal_lm(stack="awd", cell="momentum", **kwargs):
    base = dict(vocab_size=40, hidden_size=12, embedding_size=12, cell=cell, momentum=0.5, pad_token_id=0,
                initializer_range=0.5)
    base.update(STACKS[stack])
    if "momentum" in unread_hyperparameters(cell):
        del base["momentum"]
    config = AutoConfig.for_model("momentum_lstm", **{**base, **kwargs})
    model = AutoModelForCausalLM.from_config(config).double()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():       # the cells start from an identity recurrent matrix: make every entry count
        for parameter in model.parameters():
            parameter.copy_(0.4 * torch.randn(parameter.shape, dtype=parameter.dtype, generator=generator))
    return model


def tokens(generator, batch, length):
    return torch.randint(1, 40, (batch, length), generator=generator)


@pytest.mark.parametrize("stack", STACKS)
def test_no_regulariser_acts_at_eval_time(make_generator, stack):
    ids = tokens(make_generator(), 3, 9)
    plain, regularised = causal_lm(stack).eval(), causal_lm(stack, **REGULARISERS).eval()
    regularised.load_state_dict(plain.state_dict())
    with torch.no_grad():
        expected = plain(input_ids=ids).logits
        torch.testing.assert_close(regularised(input_ids=ids).logits, expected, rtol=0, atol=0)


def test_locked_dropout_keeps_one_mask_per_row_over_time(make_generator):
    model = causal_lm(locked_dropout=True, embedding_dropout=0.5).train()
    ids = tokens(make_generator(), 4, 10)
    dropped = model(input_ids=ids, output_hidden_states=True).hidden_states[0]
    ratio = dropped / model.model.embed_tokens(ids)
    torch.testing.assert_close(ratio, ratio[:, :1].expand_as(ratio), rtol=0, atol=1e-12)
    assert set(ratio.unique().tolist()) == {0.0, 2.0}
    assert not torch.equal(ratio[0, 0], ratio[1, 0]), "each row draws its own mask"
    model.config.locked_dropout = False
    ratio = model(input_ids=ids, output_hidden_states=True).hidden_states[0] / model.model.embed_tokens(ids)
    assert not torch.equal(ratio, ratio[:, :1].expand_as(ratio)), "per-element dropout varies over time"


def test_locked_dropout_of_packed_documents_is_one_mask_per_document():
    model = causal_lm(locked_dropout=True, embedding_dropout=0.5).train()
    ids = torch.arange(1, 13)[None].remainder(39) + 1
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4]])
    dropped = model(input_ids=ids, position_ids=position_ids, use_cache=False,
                    output_hidden_states=True).hidden_states[0]
    ratio = (dropped / model.model.embed_tokens(ids))[0]
    documents = [ratio[0:4], ratio[4:7], ratio[7:12]]
    for document in documents:
        torch.testing.assert_close(document, document[:1].expand_as(document), rtol=0, atol=1e-12)
    assert len({tuple(document[0].tolist()) for document in documents}) == 3


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("cell", ["momentum", "adam", "lstm"])
def test_packed_documents_train_as_the_same_documents_padded_under_one_seed(make_generator, stack, cell):
    """Every regulariser draws its masks in the same order and shape for a padded batch of n rows and n
    packed documents, so each document's logits and every gradient agree: no mask crosses documents."""
    lengths = (5, 3, 7)
    generator = make_generator()
    documents = [tokens(generator, 1, n)[0] for n in lengths]
    padded = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(padded)
    for row, document in enumerate(documents):
        padded[row, :len(document)] = document
        mask[row, :len(document)] = 1
    packed = torch.cat(documents)[None]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    runs = []
    for inputs, real in ((dict(input_ids=padded, attention_mask=mask), mask.bool()),
                         (dict(input_ids=packed, position_ids=position_ids), packed > 0)):
        model = causal_lm(stack, cell, **REGULARISERS).train()
        torch.manual_seed(11)
        logits = model(**inputs, use_cache=False).logits[real]
        weight = torch.randn(logits.shape[-1], dtype=logits.dtype, generator=make_generator("weight"))
        (logits * weight).sum().backward()
        runs.append((logits, {name: p.grad for name, p in model.named_parameters()}))
    (padded_logits, padded_grads), (packed_logits, packed_grads) = runs
    torch.testing.assert_close(packed_logits, padded_logits, rtol=0, atol=1e-10)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=0, atol=1e-9, msg=name)


@pytest.mark.parametrize("stack", STACKS)
def test_weight_drop_is_dropconnect_on_every_recurrent_matrix(make_generator, stack):
    p = 0.5
    model = causal_lm(stack, weight_drop=p).train()
    reference = causal_lm(stack).eval()
    names = model.model.lstm.recurrent_weight_names()
    assert len(names) == model.config.num_hidden_layers
    ids = tokens(make_generator(), 3, 8)
    torch.manual_seed(5)
    logits = model(input_ids=ids).logits
    torch.manual_seed(5)
    with torch.no_grad():
        masks = {}
        for name in names:
            weight = reference.model.lstm.get_parameter(name)
            weight.copy_(torch.nn.functional.dropout(weight, p, True))
            masks[name] = weight != 0
    expected = reference(input_ids=ids).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)
    upstream = torch.randn(logits.shape, dtype=logits.dtype, generator=make_generator("upstream"))
    (logits * upstream).sum().backward()
    (expected * upstream).sum().backward()
    for name in names:
        ours = model.model.lstm.get_parameter(name).grad
        theirs = reference.model.lstm.get_parameter(name).grad
        torch.testing.assert_close(ours, theirs * masks[name] / (1 - p), rtol=0, atol=1e-12)
        assert (ours[~masks[name]] == 0).all() and ours[masks[name]].abs().sum() > 0


def test_word_dropout_drops_a_word_at_every_position(make_generator):
    model = causal_lm(word_dropout=0.5).train()
    ids = torch.randint(1, 6, (4, 12), generator=make_generator())      # few words, each many times
    embedded = model(input_ids=ids, output_hidden_states=True).hidden_states[0]
    ratio = (embedded / model.model.embed_tokens(ids))[..., 0]
    for word in ids.unique():
        scale = ratio[ids == word]
        assert scale.unique().numel() == 1 and scale[0].item() in (0.0, 2.0), word


def test_word_dropout_runs_the_embedding_module_and_its_hooks(make_generator):
    """Word dropout calls the input embedding, so its forward hooks run: transformers' NEFTune noise
    (Trainer(neftune_noise_alpha=...)) and enable_input_require_grads (PEFT with gradient
    checkpointing). It had looked the tokens up in the weight itself, and both were skipped silently.
    The dropped embeddings still equal a lookup in the weight with whole rows dropped (the mask drawn
    from the same seed)."""
    model = causal_lm(word_dropout=0.3).train()
    ids = tokens(make_generator(), 3, 9)
    calls = []
    hook = model.get_input_embeddings().register_forward_hook(lambda module, args, out: calls.append(out))
    torch.manual_seed(5)
    embedded = model(input_ids=ids, output_hidden_states=True).hidden_states[0]
    hook.remove()
    assert len(calls) == 1
    torch.manual_seed(5)
    weight = model.model.embed_tokens.weight
    rows = torch.empty(weight.shape[0], 1, dtype=weight.dtype).bernoulli_(0.7) / 0.7
    torch.testing.assert_close(embedded, torch.nn.functional.embedding(ids, weight * rows), rtol=0, atol=0)

    model.requires_grad_(False)
    model.enable_input_require_grads()
    model.gradient_checkpointing_enable()
    assert model(input_ids=ids).logits.requires_grad, "the frozen embedding's output asks for gradients"


def test_gradient_checkpointing_recomputes_the_same_masks(make_generator):
    ids = tokens(make_generator(), 3, 9)
    grads = []
    for checkpointing in (False, True):
        model = causal_lm(**REGULARISERS).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        torch.manual_seed(3)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        grads.append([p.grad for p in model.parameters()])
    for plain, recomputed in zip(*grads):
        torch.testing.assert_close(recomputed, plain, rtol=0, atol=1e-12)


def test_a_one_token_training_step_drops_weights_too(make_generator):
    """A one-token forward from a cached state takes the stack's cell step, which must read the dropped
    matrices as the sequence form does."""
    model, reference = causal_lm(weight_drop=0.5).eval(), causal_lm().eval()
    ids = tokens(make_generator(), 3, 5)
    with torch.no_grad():
        cache = model(input_ids=ids[:, :4], use_cache=True).past_key_values
        reference_cache = reference(input_ids=ids[:, :4], use_cache=True).past_key_values
    torch.manual_seed(2)
    logits = model.train()(input_ids=ids[:, 4:], past_key_values=cache).logits
    torch.manual_seed(2)
    with torch.no_grad():
        for name in reference.model.lstm.recurrent_weight_names():
            weight = reference.model.lstm.get_parameter(name)
            weight.copy_(torch.nn.functional.dropout(weight, 0.5, True))
        expected = reference(input_ids=ids[:, 4:], past_key_values=reference_cache).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)
    with torch.no_grad():
        plain = model.eval()(input_ids=ids[:, 4:], past_key_values=cache).logits
    assert not torch.allclose(plain, expected)


@pytest.mark.parametrize("field,value", [("weight_drop", 1.0), ("word_dropout", -0.1),
                                         ("output_dropout", 1.5), ("locked_dropout", "yes")])
def test_bad_regulariser_values_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        MomentumLSTMConfig(**{field: value})


def test_output_dropout_defaults_to_embedding_dropout_and_fields_round_trip(tmp_path):
    assert MomentumLSTMConfig(embedding_dropout=0.3).output_dropout == 0.3
    causal_lm(**REGULARISERS).save_pretrained(tmp_path)
    loaded = MomentumLSTMConfig.from_pretrained(tmp_path)
    assert {name: getattr(loaded, name) for name in REGULARISERS} == REGULARISERS


def test_plugins_layer_refuses_a_non_bool_locked_dropout():
    with pytest.raises(ValueError, match="locked_dropout"):
        MomentumLSTM(4, 5, 2, locked_dropout=1)


def test_weight_drop_drops_the_lora_adapted_matrices():
    """With LoRA on the recurrent matrices (PEFT's target_parameters; a uniform stack: PEFT cannot
    reach a parameter of a module inside another it wraps), weight drop drops the adapted matrix: the
    training logits equal the merged model's with its matrices dropped by hand under the same seed,
    and the LoRA factors get gradients."""
    peft = pytest.importorskip("peft")
    model = causal_lm("uniform", weight_drop=0.5)
    names = model.model.lstm.recurrent_weight_names()
    targets = [f"lstm.{name}" for name in names] + ["lstm.weight_ih_l0"]
    model = peft.get_peft_model(model, peft.LoraConfig(r=2, lora_alpha=4, target_modules=[],
                                                       target_parameters=targets))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:          # LoRA starts as the identity: make the adapter count
                parameter.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    ids = torch.randint(1, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    merged = copy.deepcopy(model).merge_and_unload()
    model.train()
    torch.manual_seed(5)
    logits = model(input_ids=ids).logits
    logits.sum().backward()
    lora = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    assert lora and all(grad is not None and grad.abs().sum() > 0 for grad in lora.values())
    torch.manual_seed(5)
    with torch.no_grad():
        for name in names:
            weight = merged.model.lstm.get_parameter(name)
            weight.copy_(torch.nn.functional.dropout(weight, 0.5, True))
    merged.model.lstm.weight_drop = 0.0
    with torch.no_grad():
        torch.testing.assert_close(logits, merged.train()(input_ids=ids).logits, rtol=0, atol=1e-12)
