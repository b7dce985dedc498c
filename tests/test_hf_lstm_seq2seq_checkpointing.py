"""Gradient checkpointing of the attentional MomentumLSTM encoder-decoder
(`activation_checkpointing_enable`, `Seq2SeqTrainingArguments(activation_checkpointing=True)`): the encoder's
stack and every decoder token's step are recomputed in the backward, giving the loss and every gradient of
the run without checkpointing (dropout masks included, on padded sources and targets, both checkpoint
implementations), while the forward keeps far fewer bytes for the backward."""
import pytest
import torch
from test_hf_model_common import counting_checkpoint
from test_hf_momentum_lstm_seq2seq import CELLS, VOCAB, model, random_seqs
from test_hf_seq2seq import padded
from test_hf_seq2seq_trainer import reversal_pairs, word_tokenizer
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.modeling_layers import GradientCheckpointingLayer

DROPOUTS = {f"{side}_dropout_{at}": 0.2 for side in ("encoder", "decoder") for at in ("in", "out")}


def padded_batch(generator, source_lengths=(6, 3, 5), target_lengths=(4, 2, 5)):
    """Left-padded sources, right-padded labels (-100 at padding) and their decoder mask."""
    src, src_mask = padded(random_seqs(generator, source_lengths), "left")
    labels, tgt_mask = padded(random_seqs(generator, target_lengths), "right")
    return dict(input_ids=src, attention_mask=src_mask, labels=labels.masked_fill(tgt_mask == 0, -100),
                decoder_attention_mask=tgt_mask)


def loss_and_gradients(m, batch, seed=7):
    m.zero_grad()
    torch.manual_seed(seed)
    loss = m(**batch).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("cell", ["adam", "momentum"])
def test_checkpointing_gives_the_loss_and_gradients_of_the_plain_run(cell, reentrant, make_generator):
    """Training mode with every dropout on: the recomputed encoder and steps draw the masks of the first
    pass. Each checkpointed unit runs twice (forward, recompute): the encoder once, the decoder once per
    target token."""
    batch = padded_batch(make_generator())
    m = model(**CELLS.get(cell, {}), **DROPOUTS).train()
    loss, grads = loss_and_gradients(m, batch)
    calls = []
    m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    units = [u for u in m.modules() if isinstance(u, GradientCheckpointingLayer)]
    assert [u.gradient_checkpointing for u in units] == [True, True]
    for unit in units:
        unit._gradient_checkpointing_func = counting_checkpoint(unit._gradient_checkpointing_func, calls)
    checkpointed_loss, checkpointed = loss_and_gradients(m, batch)
    target_length = batch["labels"].shape[1]
    assert len(calls) == 2 * (1 + target_length)
    torch.testing.assert_close(checkpointed_loss, loss, rtol=1e-12, atol=0)
    assert checkpointed.keys() == grads.keys() and len(grads) == len(list(m.parameters()))
    for name, grad in grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-10, atol=1e-13, msg=name)
    m.activation_checkpointing_disable()
    again_loss, _ = loss_and_gradients(m, batch)
    torch.testing.assert_close(again_loss, loss, rtol=0, atol=0)


def saved_bytes(m, batch):
    """Bytes of the distinct storages autograd keeps from the forward for the backward (not those the
    backward's recomputation keeps for a moment)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = m(**batch).loss
    loss.backward()
    return sum(storages.values())


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_keeps_far_fewer_bytes_for_the_backward(reentrant, make_generator):
    """A long target (24 tokens, 2 layers, hidden 32, attention over 20 source tokens): the decoder
    steps' intermediate tensors (gates, attention scores, weights and contexts) are not kept."""
    g = make_generator()
    batch = padded_batch(g, (20, 14, 17), (24, 19, 24))
    m = model(hidden_size=32, encoder_hidden_size=16, **DROPOUTS).train()
    plain = saved_bytes(m, batch)
    m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    checkpointed = saved_bytes(m, batch)
    assert checkpointed < 0.4 * plain, (checkpointed, plain)


def test_checkpointing_in_training_runs_without_a_cache(make_generator):
    """use_cache=True under checkpointing in training warns and returns no cache (a recomputed step
    would advance it twice); a cache passed in is refused; evaluation keeps its cache."""
    batch = padded_batch(make_generator())
    m = model().train()
    m.activation_checkpointing_enable()
    out = m(**batch, use_cache=True)
    assert out.past_key_values is None
    with pytest.raises(ValueError, match="gradient checkpointing"):
        m(**batch, past_key_values=m.cache_class(m.config))
    m.eval()
    assert m(**batch, use_cache=True).past_key_values is not None


def test_seq2seq_trainer_with_gradient_checkpointing_trains_as_without(tmp_path):
    """Seq2SeqTrainingArguments(activation_checkpointing=True) (formerly gradient_checkpointing): four
    AdamW steps with dropout, batches padded by DataCollatorForSeq2Seq, end at the parameters of the
    same run without checkpointing."""
    data = reversal_pairs(32, seed=0)
    ends = []
    for checkpointing in (False, True):
        m = model(**DROPOUTS).float()
        args = Seq2SeqTrainingArguments(
            output_dir=str(tmp_path / str(checkpointing)), per_device_train_batch_size=8, max_steps=4,
            learning_rate=1e-2, activation_checkpointing=checkpointing, save_strategy="no", report_to=[],
            use_cpu=True, disable_tqdm=True, logging_strategy="no", seed=0)
        collator = DataCollatorForSeq2Seq(word_tokenizer(VOCAB), model=m)
        Seq2SeqTrainer(model=m, args=args, train_dataset=data, data_collator=collator).train()
        assert m.is_activation_checkpointing == checkpointing
        ends.append({name: p.detach().clone() for name, p in m.named_parameters()})
    start = dict(model(**DROPOUTS).float().named_parameters())
    moved = [name for name in ends[0] if not torch.equal(ends[0][name], start[name])]
    assert len(moved) == len(start), set(start) - set(moved)
    for name, expected in ends[0].items():
        torch.testing.assert_close(ends[1][name], expected, rtol=1e-5, atol=1e-6, msg=name)
