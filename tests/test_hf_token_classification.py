"""The native families' token classifiers (`...ForTokenClassification`, AutoModelForTokenClassification):
every token's logits equal those of its sequence run alone, however the batch arrives (padded on
either side, packed by DataCollatorWithFlattening in its three forms); the loss is transformers'
token-classification cross entropy over the labelled tokens; `classifier_dropout` is checked and
applied; the token-classification pipeline scores a padded batch as each text alone; and through
transformers' Trainer with DataCollatorForTokenClassification a bidirectional model (Momentum
Transformer, eq. 14) learns a label that only the next token decides, which a causal one cannot."""
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F
from helpers.hf_heads import (
    FORMS,
    MODELS,
    PAD,
    VOCAB,
    assert_packed_row_is_its_documents,
    assert_padded_rows_are_their_sequences,
    head_config,
)
from transformers import (
    AutoConfig,
    AutoModelForTokenClassification,
    DataCollatorForTokenClassification,
    DataCollatorWithFlattening,
    Trainer,
    TrainingArguments,
)

from hf_momentum import MomentumLSTMForTokenClassification, MomentumTransformerForTokenClassification

LABELS = 5
TOL = 1e-5


def config_of(name, **overrides):
    return head_config(name, num_labels=LABELS, **overrides)


def build(name, **overrides):
    torch.manual_seed(0)
    return AutoModelForTokenClassification.from_config(config_of(name, **overrides)).eval()


def sequences(generator, lengths):
    return [torch.randint(0, PAD, (n,), generator=generator) for n in lengths]


def words():
    """test_hf_model_common's word-level tokenizer ("w0" ...) over VOCAB, its pad id PAD."""
    from test_hf_model_common import ModelTester, word_tokenizer
    return word_tokenizer(ModelTester("momentum_transformer", {}, vocab_size=VOCAB))


def test_auto_classes_build_the_token_classifiers():
    assert type(build("transformer-bidirectional")) is MomentumTransformerForTokenClassification
    assert type(build("lstm-adam")) is MomentumLSTMForTokenClassification


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("name", MODELS)
def test_padded_batch_gives_every_token_its_logits_alone(name, side, make_generator):
    model = build(name)
    assert_padded_rows_are_their_sequences(model, sequences(make_generator(), (6, 11, 1)), side, TOL,
                                           padding_reaches_tokens=side == "left" or "bidirectional" in name)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", MODELS)
def test_packed_documents_get_their_logits_and_loss_alone(name, form, make_generator):
    """DataCollatorWithFlattening's row (its labels -100 at each document's first token), the
    documents told by one form: logits, loss and gradients equal those of each document alone."""
    model = build(name)
    generator = make_generator()
    seqs = sequences(generator, (7, 1, 12, 5))
    tags = [torch.randint(0, LABELS, (len(s),), generator=generator) for s in seqs]
    batch = DataCollatorWithFlattening(**FORMS[form])(
        [{"input_ids": s.tolist(), "labels": t.tolist()} for s, t in zip(seqs, tags)])
    if form != "position_ids":                       # the documents known from that form alone
        del batch["position_ids"]
    model.train()                                    # no dropout in these configs: train and eval agree
    assert_packed_row_is_its_documents(model, batch, seqs, TOL)


@pytest.mark.parametrize("name", ["transformer-bidirectional", "lstm-adam"])
def test_loss_is_cross_entropy_over_the_labelled_tokens(name, make_generator):
    """transformers' ForTokenClassification loss: -100 ignored, mean over the labelled tokens, or
    their sum over `num_items_in_batch` (the Trainer's count under gradient accumulation)."""
    model = build(name)
    generator = make_generator()
    ids = torch.randint(0, PAD, (3, 8), generator=generator)
    labels = torch.randint(0, LABELS, (3, 8), generator=generator)
    labels[0, :3] = -100
    labels[2, 5:] = -100
    out = model(input_ids=ids, labels=labels)
    kept = labels != -100
    logits = out.logits.detach()
    per_token = -logits.log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    assert math.isclose(out.loss.item(), per_token[kept].mean().item(), rel_tol=1e-5)
    summed = model(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(40)).loss
    assert math.isclose(summed.item(), per_token[kept].sum().item() / 40, rel_tol=1e-5)
    loss, logits_tuple = model(input_ids=ids, labels=labels, return_dict=False)[:2]
    torch.testing.assert_close(logits_tuple, out.logits, rtol=0, atol=0)


@pytest.mark.parametrize("model_type", ["momentum_transformer", "momentum_lstm"])
@pytest.mark.parametrize("value", [1.0, -0.1, float("nan"), True])
def test_classifier_dropout_out_of_range_is_refused_by_name(model_type, value):
    with pytest.raises(ValueError, match="classifier_dropout"):
        AutoConfig.for_model(model_type, classifier_dropout=value)


@pytest.mark.parametrize("head", ["token", "sequence"])
@pytest.mark.parametrize("name", ["transformer-bidirectional", "lstm-adam"])
def test_classifier_dropout_drops_the_features_the_head_reads(name, head, make_generator):
    """With classifier_dropout p (every other dropout 0), a training call's logits are the head on
    the final hidden states (pooled for sequences) dropped out at p; eval and p = 0 keep them."""
    from transformers import AutoModelForSequenceClassification
    auto = AutoModelForTokenClassification if head == "token" else AutoModelForSequenceClassification
    torch.manual_seed(0)
    model = auto.from_config(config_of(name, classifier_dropout=0.5))
    ids = torch.randint(0, PAD, (2, 7), generator=make_generator())
    with torch.no_grad():
        features = model.model(input_ids=ids).last_hidden_state
        if head == "sequence":
            features = features.mean(1) if name.startswith("transformer") else features[:, -1]
        model.train()
        torch.manual_seed(1)
        trained = model(input_ids=ids).logits
        torch.manual_seed(1)
        expected = model.score(F.dropout(features, 0.5, training=True))
        model.eval()
        evaluated = model(input_ids=ids).logits
    torch.testing.assert_close(trained, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(evaluated, model.score(features), rtol=1e-5, atol=1e-6)
    assert (trained - evaluated).abs().max() > 1e-3


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("name", ["transformer-bidirectional", "lstm-momentum"])
def test_token_classification_pipeline_gives_each_text_its_scores_alone(name, side):
    from transformers import pipeline
    tokenizer = words()
    tokenizer.padding_side = side
    tag = pipeline("token-classification", model=build(name), tokenizer=tokenizer)
    texts = ["w3 w5 w7", "w1 w2 w3 w4 w9 w10 w11 w12", "w8"]
    batched = tag(texts, batch_size=3)
    for text, together in zip(texts, batched):
        single = tag(text)
        assert [(e["word"], e["entity"]) for e in together] == [(e["word"], e["entity"]) for e in single]
        assert len(single) == len(text.split())
        for a, b in zip(together, single):
            assert math.isclose(a["score"], b["score"], rel_tol=1e-5), (text, a, b)


class NextTokenTags(torch.utils.data.Dataset):
    """Rows of 4–11 tokens; a token's tag is the next token's id mod LABELS (-100 at the last):
    only a model that reads ahead can predict it."""

    def __init__(self, rows, seed):
        generator = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(rows):
            n = int(torch.randint(4, 12, (1,), generator=generator))
            ids = torch.randint(0, PAD, (n,), generator=generator)
            tags = torch.cat([ids[1:] % LABELS, torch.tensor([-100])])
            self.rows.append({"input_ids": ids.tolist(), "labels": tags.tolist()})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def tag_accuracy(model, data, collator):
    batch = collator(data.rows)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    predicted = logits.argmax(-1)
    kept = batch["labels"] != -100
    return (predicted[kept] == batch["labels"][kept]).float().mean().item()


@pytest.mark.parametrize("name, reads_ahead", [("transformer-bidirectional", True),
                                               ("transformer-causal", False)])
def test_trainer_teaches_a_bidirectional_model_tags_decided_by_the_next_token(name, reads_ahead, tmp_path):
    """transformers' Trainer with DataCollatorForTokenClassification (padding, labels padded with
    -100): the bidirectional model (eq. 14) learns the look-ahead tags; the causal one, which sees
    only the tokens up to each tag, stays near chance (1 / LABELS)."""
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_config(config_of(name, hidden_size=32))
    collator = DataCollatorForTokenClassification(words())
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=300, per_device_train_batch_size=16,
                             learning_rate=1e-2, lr_scheduler_type="constant", report_to=[],
                             save_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0,
                             disable_tqdm=True, logging_steps=50)
    Trainer(model=model, args=args, train_dataset=NextTokenTags(256, seed=1), data_collator=collator).train()
    accuracy = tag_accuracy(model.eval(), NextTokenTags(64, seed=2), collator)
    if reads_ahead:
        assert accuracy > 0.9, accuracy
    else:
        assert accuracy < 0.45, accuracy

