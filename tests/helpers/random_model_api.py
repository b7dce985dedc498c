"""Random cases of the model API that every transformers model offers, for
tests/test_random_configurations.py: a model of any native class (either causal LM, its base model
and heads, the masked LM, either encoder-decoder) drawn as helpers/random_cases.py draws them, in
float64, must save and load exactly, take `inputs_embeds` for `input_ids`, give the same gradients
under gradient checkpointing, and, where it predicts tokens, resize its vocabulary and then score,
save and load with the new size (`decoder_vocab_size` included)."""
import tempfile

import torch
import torch.nn.functional as F

from .random_cases import assert_close, case_error, lstm_causal_lm, native_causal_lm, padded_ids, seq2seq_lm

NATIVE_HEADS = ["MomentumTransformerForCausalLM", "MomentumTransformerModel",
                "MomentumTransformerForSequenceClassification", "MomentumTransformerForTokenClassification",
                "MomentumTransformerForQuestionAnswering", "MomentumTransformerForMaskedLM"]
LSTM_HEADS = ["MomentumLSTMForCausalLM", "MomentumLSTMModel", "MomentumLSTMForSequenceClassification",
              "MomentumLSTMForTokenClassification", "MomentumLSTMForQuestionAnswering"]


def any_model(rng):
    """(float64 eval model, case, vocabulary size): a native or LSTM class of any head over a drawn
    causal LM's config (the masked LM bidirectional), or an encoder-decoder."""
    import hf_momentum
    family = rng.choice(["native", "lstm", "seq2seq"])
    if family == "seq2seq":
        model, case = seq2seq_lm(rng, draw_tying=True)
        return model, dict(case, head=type(model).__name__), 19
    lm, case = native_causal_lm(rng) if family == "native" else lstm_causal_lm(rng)
    head = rng.choice(NATIVE_HEADS if family == "native" else LSTM_HEADS)
    config = lm.config
    if head.endswith("MaskedLM"):
        config = type(config)(**{**config.to_diff_dict(), "is_causal": False, "layer_types": None,
                                 "sliding_window": None})
    if head.endswith("Classification"):
        config.num_labels = rng.choice([1, 3]) if "Sequence" in head else 3
    case = dict(case, head=head, num_labels=config.num_labels)
    torch.manual_seed(rng.randrange(1 << 30))
    return getattr(hf_momentum, head)(config).double().eval(), case, config.vocab_size


def model_inputs(rng, model, vocab, case):
    """A padded batch (right or left; an encoder-decoder's sources right-padded, with targets), and
    the forward's options: no cache where the model keeps one."""
    seqs = [torch.randint(3, vocab, (rng.randint(1, 8),)) for _ in range(rng.randint(1, 3))]
    side = "right" if model.config.is_encoder_decoder else rng.choice(["right", "left"])
    ids, mask = padded_ids(seqs, side)
    inputs = dict(input_ids=ids, attention_mask=mask)
    if model.config.is_encoder_decoder:
        target = torch.randint(3, vocab, (len(seqs), rng.randint(1, 5)))
        inputs["decoder_input_ids"] = torch.cat([torch.ones(len(seqs), 1, dtype=torch.long), target], 1)
    case.update(lengths=[len(s) for s in seqs], side=side)
    cached = model.config.is_encoder_decoder or type(model).__name__.endswith(("CausalLM", "Model"))
    return inputs, {"use_cache": False} if cached else {}


def main_output(out):
    """The output a head is for, padding's lowest span logits (question answering) set to 0."""
    for name in ("logits", "start_logits", "last_hidden_state"):
        tensor = getattr(out, name, None)
        if tensor is not None:
            return tensor.masked_fill(tensor == torch.finfo(tensor.dtype).min, 0)
    raise AssertionError(f"{type(out).__name__} has no logits or hidden states")


def labels_of(model, inputs, vocab):
    """Labels for the model's loss (none for a base model), on real tokens only."""
    name, ids, mask = type(model).__name__, inputs["input_ids"], inputs["attention_mask"]
    if model.config.is_encoder_decoder:
        return {"labels": torch.randint(3, vocab, inputs["decoder_input_ids"].shape)}
    if name.endswith(("CausalLM", "MaskedLM")):
        return {"labels": ids.masked_fill(mask == 0, -100)}
    if "SequenceClassification" in name:
        labels = torch.randint(0, model.config.num_labels, (ids.shape[0],))
        return {"labels": labels.double() if model.config.num_labels == 1 else labels}
    if "TokenClassification" in name:
        return {"labels": torch.randint(0, model.config.num_labels, ids.shape).masked_fill(mask == 0, -100)}
    if "QuestionAnswering" in name:
        first_real = mask.argmax(1)
        return {"start_positions": first_real, "end_positions": first_real + mask.sum(1) - 1}
    return {}


def is_tied(model) -> bool:
    """Whether the LM head is the matrix the (decoder's) token embedding reads."""
    embedding = model.get_decoder().embed_tokens if model.config.is_encoder_decoder \
        else model.get_input_embeddings()
    return model.get_output_embeddings().weight is embedding.weight


def assert_saves_and_loads(model, inputs, options, case, what):
    """save_pretrained then from_pretrained: the same tensors, ties and outputs."""
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        loaded = type(model).from_pretrained(folder).eval()
    state, back = model.state_dict(), loaded.state_dict()
    assert state.keys() == back.keys(), case_error(case, f"{what}: keys {sorted(set(state) ^ set(back))}")
    for name, tensor in state.items():
        assert torch.equal(tensor, back[name]), case_error(case, f"{what}: {name} differs")
    if model.get_output_embeddings() is not None:
        assert is_tied(loaded) == is_tied(model), case_error(case, f"{what}: tying not kept")
    # the same weights in the safetensors file's buffer or a resized matrix: BLAS may sum in another
    # order (1e-16 apart in float64 on an AMD EPYC)
    with torch.no_grad():
        assert_close(main_output(loaded(**inputs, **options)), main_output(model(**inputs, **options)), case,
                     f"{what}: outputs", tol=1e-13)
    return loaded


def gradients(model, inputs, options, labels, checkpointing):
    """(loss, gradients by name) of one training-mode forward and backward."""
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.zero_grad()
    out = model(**inputs, **options, **labels)
    loss = out.loss if labels else main_output(out).pow(2).sum()
    loss.backward()
    model.gradient_checkpointing_disable()
    model.eval()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_resizes(rng, model, inputs, options, vocab, case):
    """resize_token_embeddings: the kept tokens' logits unchanged, the loss of labels among the new
    tokens the cross entropy over every row of the new vocabulary, and the resized model saved and
    loaded with its new size."""
    with torch.no_grad():
        before = main_output(model(**inputs, **options))
    rows = vocab + rng.randint(1, 6)
    model.resize_token_embeddings(rows, mean_resizing=False)
    with torch.no_grad():
        after = model(**inputs, **options)
    assert_close(main_output(after)[..., :vocab], before, case, "resized: the kept tokens' logits")
    assert_scores_and_reloads_resized(model, inputs, options, vocab, case)


def assert_scores_and_reloads_resized(model, inputs, options, vocab, case, generator=None):
    """After resize_token_embeddings beyond `vocab` tokens: where the model predicts next tokens (a
    causal LM, an encoder-decoder), the loss of labels among the new tokens is the cross entropy over
    every row of the new vocabulary; and the model saves and loads with its new size
    (`assert_saves_and_loads`)."""
    rows = model.get_output_embeddings().weight.shape[0]
    if model.config.is_encoder_decoder or type(model).__name__.endswith("CausalLM"):
        with torch.no_grad():
            after = model(**inputs, **options)
        logits = after.logits if model.config.is_encoder_decoder else after.logits[:, :-1]
        labels = torch.randint(vocab, rows, logits.shape[:2], generator=generator)
        full = labels if model.config.is_encoder_decoder else torch.cat([labels[:, :1], labels], 1)
        with torch.no_grad():
            loss = model(**inputs, **options, labels=full).loss
        expected = F.cross_entropy(logits.reshape(-1, rows).float(), labels.reshape(-1))
        assert_close(loss.float(), expected, case, "resized: the loss over the new vocabulary", tol=1e-6)
    assert_saves_and_loads(model, inputs, options, case, "resized")


def check_model_api(rng):
    """Any native model (`any_model`) on a padded batch: saved and loaded exactly; `inputs_embeds`
    for `input_ids`; gradient checkpointing's loss and gradients; resizing (`assert_resizes`) where
    it predicts tokens."""
    model, case, vocab = any_model(rng)
    inputs, options = model_inputs(rng, model, vocab, case)
    with torch.no_grad():
        reference = main_output(model(**inputs, **options))
    assert_saves_and_loads(model, inputs, options, case, "saved and loaded")
    embedded = dict(inputs, inputs_embeds=model.get_input_embeddings()(inputs["input_ids"]))
    del embedded["input_ids"]
    with torch.no_grad():
        assert_close(main_output(model(**embedded, **options)), reference, case, "inputs_embeds")
    labels = labels_of(model, inputs, vocab)
    loss, plain = gradients(model, inputs, options, labels, checkpointing=False)
    checkpointed_loss, checkpointed = gradients(model, inputs, options, labels, checkpointing=True)
    assert_close(checkpointed_loss, loss, case, "gradient checkpointing: loss")
    assert plain.keys() == checkpointed.keys(), case_error(case, "gradient checkpointing: other parameters")
    for name, grad in plain.items():
        assert_close(checkpointed[name], grad, case, f"gradient checkpointing: gradient of {name}")
    if model.get_output_embeddings() is not None:
        assert_resizes(rng, model, inputs, options, vocab, case)
