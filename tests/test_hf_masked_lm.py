"""The bidirectional momentum transformer's masked LM (`MomentumTransformerForMaskedLM`,
AutoModelForMaskedLM; Momentum Transformer, eq. 14): it needs `is_causal=False`; its head is tied to
the input embedding; every token's logits equal those of its sequence run alone, however the batch
arrives (padded on either side, packed by DataCollatorWithFlattening in its three forms); the loss is
transformers' masked-LM cross entropy over the labelled tokens, which `sparse_prediction` computes
from their logits alone; the fill-mask pipeline scores a
padded batch as each text alone; and through transformers' Trainer with
DataCollatorForLanguageModeling it learns to fill a masked first token, which only the tokens to
its right decide."""
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F
from helpers.hf_heads import (
    FORMS,
    PAD,
    VOCAB,
    assert_packed_row_is_its_documents,
    assert_padded_rows_are_their_sequences,
    head_config,
    padded,
)
from transformers import (
    AutoModelForMaskedLM,
    DataCollatorForLanguageModeling,
    DataCollatorWithFlattening,
    Trainer,
    TrainingArguments,
)

from hf_momentum import MomentumTransformerForMaskedLM

MASK = VOCAB - 3                 # the word tokenizer's [MASK]; [UNK] and [PAD] follow it
WORDS = MASK                     # w0 ... w36
ENCODERS = ["transformer-bidirectional", "hybrid-bidirectional"]
TOL = 1e-5


def build(name="transformer-bidirectional", **overrides):
    torch.manual_seed(0)
    return AutoModelForMaskedLM.from_config(head_config(name, **overrides)).eval()


def word_tokenizer():
    """Words "w0" ... over the model's vocabulary, then [MASK], [UNK] and [PAD] (= PAD)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {f"w{i}": i for i in range(WORDS)}
    vocab.update({"[MASK]": MASK, "[UNK]": MASK + 1, "[PAD]": PAD})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]",
                                   mask_token="[MASK]")


def sequences(generator, lengths):
    return [torch.randint(0, WORDS, (n,), generator=generator) for n in lengths]


def test_auto_class_builds_a_masked_lm_with_its_head_tied_to_the_embedding():
    model = build()
    assert type(model) is MomentumTransformerForMaskedLM
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert model.lm_head.bias is not None
    untied = build(tie_word_embeddings=False)
    assert untied.get_output_embeddings().weight is not untied.get_input_embeddings().weight


def test_a_causal_config_is_refused_naming_is_causal():
    with pytest.raises(ValueError, match="is_causal=False"):
        AutoModelForMaskedLM.from_config(head_config("transformer-causal"))


def test_logits_are_the_tied_projection_of_the_transformed_hidden_states(make_generator):
    """lm_head(LayerNorm(act(dense(h)))) with the embedding matrix as lm_head's weight; recomputed
    here from the parts (a head that skipped the transform or the bias would differ)."""
    model = build()
    ids = torch.randint(0, WORDS, (2, 6), generator=make_generator())
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state
        features = F.layer_norm(F.gelu(hidden @ model.transform.dense.weight.T + model.transform.dense.bias),
                                (hidden.shape[-1],), model.transform.norm.weight, model.transform.norm.bias,
                                model.config.layer_norm_eps)
        expected = features @ model.model.embed_tokens.weight.T + model.lm_head.bias
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("name", ENCODERS)
def test_padded_batch_gives_every_token_its_logits_alone(name, side, make_generator):
    model = build(name)
    assert_padded_rows_are_their_sequences(model, sequences(make_generator(), (6, 11, 1)), side, TOL)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", ENCODERS)
def test_packed_documents_get_their_logits_and_loss_alone(name, form, make_generator):
    """DataCollatorWithFlattening's row with masked-LM labels (-100 where nothing is masked), the
    documents told by one form: logits, loss and gradients equal those of each document alone."""
    model = build(name)
    generator = make_generator()
    seqs = sequences(generator, (7, 1, 12, 5))
    labels = [torch.where(torch.rand(len(s), generator=generator) < 0.4, s, -100) for s in seqs]
    labels[1][0] = seqs[1][0]
    inputs = [torch.where(lab != -100, MASK, s) for s, lab in zip(seqs, labels)]
    batch = DataCollatorWithFlattening(**FORMS[form])(
        [{"input_ids": i.tolist(), "labels": lab.tolist()} for i, lab in zip(inputs, labels)])
    batch["labels"] = torch.cat(labels)[None]        # the collator drops each document's first label
    if form != "position_ids":                       # the documents known from that form alone
        del batch["position_ids"]
    model.train()                                    # no dropout in these configs: train and eval agree
    assert_packed_row_is_its_documents(model, batch, inputs, TOL)


def test_loss_is_cross_entropy_over_the_masked_tokens(make_generator):
    """transformers' ForMaskedLM loss: -100 ignored, mean over the labelled tokens, or their sum
    over `num_items_in_batch` (the Trainer's count under gradient accumulation)."""
    model = build()
    generator = make_generator()
    ids = torch.randint(0, WORDS, (3, 8), generator=generator)
    labels = torch.where(torch.rand(3, 8, generator=generator) < 0.3, ids, -100)
    labels[0, 0] = ids[0, 0]
    kept = labels != -100
    masked = ids.masked_fill(kept, MASK)
    out = model(input_ids=masked, labels=labels)
    per_token = -out.logits.detach().log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    assert math.isclose(out.loss.item(), per_token[kept].mean().item(), rel_tol=1e-5)
    summed = model(input_ids=masked, labels=labels, num_items_in_batch=torch.tensor(40)).loss
    assert math.isclose(summed.item(), per_token[kept].sum().item() / 40, rel_tol=1e-5)
    loss, logits = model(input_ids=masked, labels=labels, return_dict=False)[:2]
    torch.testing.assert_close(logits, out.logits, rtol=0, atol=0)


@pytest.mark.parametrize("name", ENCODERS)
def test_sparse_prediction_scores_the_labelled_tokens_alone_with_the_dense_loss(name, make_generator):
    """sparse_prediction=True: the head runs on the labelled tokens only, in row-major order, and the
    loss and every gradient equal the dense model's (float64), with or without num_items_in_batch;
    without labels the logits are dense. Selecting the tokens reads the device once (one `nonzero`)."""
    from test_host_reads import HostReads
    dense = build(name).double()
    sparse = build(name, sparse_prediction=True).double()
    generator = make_generator()
    ids = torch.randint(0, WORDS, (3, 9), generator=generator)
    labels = torch.where(torch.rand(3, 9, generator=generator) < 0.3, ids, -100)
    labels[0, 0], labels[2, 8] = ids[0, 0], ids[2, 8]
    masked = ids.masked_fill(labels != -100, MASK)
    for extra in ({}, {"num_items_in_batch": torch.tensor(17)}):
        expected = dense(input_ids=masked, labels=labels, **extra)
        with HostReads() as reads:
            out = sparse(input_ids=masked, labels=labels, **extra)
        assert reads.count == 1
        kept = labels.reshape(-1) != -100
        assert out.logits.shape == (int(kept.sum()), dense.config.vocab_size)
        torch.testing.assert_close(out.logits, expected.logits.reshape(-1, VOCAB)[kept],
                                   rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out.loss, expected.loss, rtol=1e-12, atol=1e-12)
        grads = torch.autograd.grad(out.loss, list(sparse.parameters()))
        expected_grads = torch.autograd.grad(expected.loss, list(dense.parameters()))
        for got, want in zip(grads, expected_grads):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(sparse(input_ids=masked).logits, dense(input_ids=masked).logits,
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="labels must have one entry per token"):
        sparse(input_ids=masked, labels=labels[:, :4])
    with pytest.raises(ValueError, match="sparse_prediction must be True or False"):
        head_config(name, sparse_prediction=1)


@pytest.mark.parametrize("layout", ["padded-right", "padded-left", "packed"])
def test_sparse_prediction_of_padded_and_packed_batches_is_each_sequence_alone(layout, make_generator):
    """sparse_prediction=True on a padded batch (either side, -100 at the padding) and on a packed row
    (DataCollatorWithFlattening, position_ids that restart): the labelled tokens' logits, in order,
    are those of each sequence run alone (float64)."""
    model = build(sparse_prediction=True).double()
    generator = make_generator()
    seqs = sequences(generator, (7, 1, 12, 5))
    labels = [torch.where(torch.rand(len(s), generator=generator) < 0.4, s, -100) for s in seqs]
    for s, lab in zip(seqs, labels):
        lab[0] = s[0]
    inputs = [torch.where(lab != -100, MASK, s) for s, lab in zip(seqs, labels)]
    if layout == "packed":
        batch = DataCollatorWithFlattening()(
            [{"input_ids": i.tolist(), "labels": lab.tolist()} for i, lab in zip(inputs, labels)])
        batch["labels"] = torch.cat(labels)[None]    # the collator drops each document's first label
    else:
        ids, mask = padded(inputs, layout.split("-")[1])
        batch = {"input_ids": ids, "attention_mask": mask,
                 "labels": padded(labels, layout.split("-")[1])[0].masked_fill(mask == 0, -100)}
    with torch.no_grad():
        logits = model(**batch).logits
        alone = torch.cat([model(input_ids=i[None], labels=lab[None]).logits
                           for i, lab in zip(inputs, labels)])
    assert logits.shape == alone.shape == (sum(int((lab != -100).sum()) for lab in labels), VOCAB)
    torch.testing.assert_close(logits, alone, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("side", ["right", "left"])
def test_fill_mask_pipeline_gives_each_text_its_scores_alone(side):
    """transformers' fill-mask pipeline, texts of different lengths batched and padded: each text's
    candidates and scores are those it gets alone, and those are the softmax of the model's logits
    at the mask."""
    from transformers import pipeline
    tokenizer = word_tokenizer()
    tokenizer.padding_side = side
    model = build("hybrid-bidirectional")
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer, top_k=3)
    texts = ["w3 [MASK] w7", "w1 w2 w3 w4 [MASK] w10 w11 w12", "[MASK]"]
    batched = fill(texts, batch_size=3)
    for text, together in zip(texts, batched):
        single = fill(text)
        assert [c["token"] for c in together] == [c["token"] for c in single]
        for a, b in zip(together, single):
            assert math.isclose(a["score"], b["score"], rel_tol=1e-5), (text, a, b)
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            probs = model(input_ids=ids).logits[0, ids[0].tolist().index(MASK)].softmax(-1)
        top = probs.topk(3)
        assert [c["token"] for c in single] == top.indices.tolist()
        for c, p in zip(single, top.values.tolist()):
            assert math.isclose(c["score"], p, rel_tol=1e-5)


class RepeatedWords(torch.utils.data.Dataset):
    """Rows of 4–11 copies of one word: a masked token is the word of the rest of its row."""

    def __init__(self, rows, seed):
        generator = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(rows):
            n = int(torch.randint(4, 12, (1,), generator=generator))
            word = int(torch.randint(0, WORDS, (1,), generator=generator))
            self.rows.append({"input_ids": [word] * n})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def test_trainer_with_the_masked_lm_collator_teaches_filling_a_first_token_from_its_right(tmp_path):
    """transformers' Trainer with DataCollatorForLanguageModeling (30 % of tokens masked, replaced
    or kept, padded rows): afterwards a masked first token, decided only by the tokens to its
    right, is filled correctly; untrained, at chance (1 / 37)."""
    tokenizer = word_tokenizer()
    model = AutoModelForMaskedLM.from_config(head_config("transformer-bidirectional", hidden_size=32))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3, seed=0)
    held_out = tokenizer.pad(RepeatedWords(64, seed=2).rows, return_tensors="pt")
    first = held_out["input_ids"][:, 0].clone()
    ids = held_out["input_ids"].clone()
    ids[:, 0] = MASK

    def accuracy():
        with torch.no_grad():
            logits = model.eval()(input_ids=ids, attention_mask=held_out["attention_mask"]).logits
        return (logits[:, 0].argmax(-1) == first).float().mean().item()

    before = accuracy()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=200, per_device_train_batch_size=16,
                             learning_rate=1e-2, lr_scheduler_type="constant", report_to=[],
                             save_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0,
                             disable_tqdm=True, logging_steps=50)
    Trainer(model=model, args=args, train_dataset=RepeatedWords(256, seed=1), data_collator=collator).train()
    after = accuracy()
    assert before < 0.2 and after > 0.9, (before, after)
