"""The momentum transformer's sequence classifier with `classifier_pooling="first"` (the first real
token: BERT's [CLS], RoBERTa's <s>) and `classifier_hidden_act` (a dense layer and that activation
before the classifier, RoBERTa's classification head): logits recomputed from the parts, a padded
batch on either side equal to each row alone, the plugin's `first_real` against indexing, checks by
name, and an exact save / load; and both families' sequence classifiers under transformers' Trainer
with gradient accumulation."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.hf_heads import PAD, head_config, padded
from transformers import AutoConfig, AutoModelForSequenceClassification

from plugins.transformer.pooling import first_real

LABELS = 3


def build(**overrides):
    torch.manual_seed(0)
    config = head_config("hybrid-bidirectional", num_labels=LABELS, classifier_pooling="first", **overrides)
    return AutoModelForSequenceClassification.from_config(config).eval()


def test_first_real_picks_each_rows_first_real_position(make_generator):
    hidden = torch.randn(3, 5, 4, generator=make_generator())
    real = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]])
    expected = torch.stack([hidden[0, 0], hidden[1, 2], hidden[2, 4]])
    torch.testing.assert_close(first_real(hidden, real), expected, rtol=0, atol=0)
    torch.testing.assert_close(first_real(hidden, None), hidden[:, 0], rtol=0, atol=0)


@pytest.mark.parametrize("act", [None, "tanh"])
def test_logits_are_the_head_on_the_first_tokens_features(act, make_generator):
    model = build(classifier_hidden_act=act)
    ids = torch.randint(0, PAD, (2, 6), generator=make_generator())
    with torch.no_grad():
        first = model.model(input_ids=ids).last_hidden_state[:, 0]
        features = first if act is None else torch.tanh(first @ model.pooler.weight.T + model.pooler.bias)
        expected = features @ model.score.weight.T + model.score.bias
        torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-6)
    assert hasattr(model, "pooler") == (act is not None)


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_rows_are_classified_as_alone(side, make_generator):
    model = build(classifier_hidden_act="tanh")
    gen = make_generator()
    seqs = [torch.randint(0, PAD, (n,), generator=gen) for n in (7, 3, 1)]
    ids, mask = padded(seqs, side)
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=mask).logits
        alone = torch.cat([model(input_ids=s[None]).logits for s in seqs])
        unmasked = model(input_ids=ids).logits
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-5)
    if side == "left":                       # position 0 is padding there: the mask must move the pick
        assert (unmasked[1] - alone[1]).abs().max() > 1e-3


@pytest.mark.parametrize("overrides, field", [
    (dict(classifier_pooling="last"), "classifier_pooling"),
    (dict(classifier_pooling="first", is_causal=True), "classifier_pooling='first' needs is_causal=False"),
    (dict(classifier_hidden_act="tanhh"), "classifier_hidden_act"),
])
def test_bad_pooling_settings_are_refused_by_name(overrides, field):
    with pytest.raises(ValueError, match=field):
        AutoConfig.for_model("momentum_transformer", **{"is_causal": False, **overrides})


def test_save_and_load_keep_the_head(tmp_path, make_generator):
    model = build(classifier_hidden_act="tanh", classifier_dropout=0.1)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert (loaded.config.classifier_pooling, loaded.config.classifier_hidden_act) == ("first", "tanh")
    ids = torch.randint(0, PAD, (2, 6), generator=make_generator())
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)


class Rows(torch.utils.data.Dataset):
    """Four sequences of 2-6 tokens with a class (or, for regression, a real number) each."""

    def __init__(self, regression, generator):
        self.rows = [{"input_ids": torch.randint(0, PAD, (n,), generator=generator).tolist(),
                      "labels": torch.rand((), generator=generator).item() if regression else row % LABELS}
                     for row, n in enumerate((5, 2, 6, 3))]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    """Right-padded ids and the labels (regression targets in float64, the models' dtype here)."""
    ids, mask = padded([torch.tensor(r["input_ids"]) for r in rows], "right")
    labels = torch.tensor([r["labels"] for r in rows])
    return {"input_ids": ids, "attention_mask": mask,
            "labels": labels.double() if labels.is_floating_point() else labels}


@pytest.mark.parametrize("regression", [False, True], ids=["classes", "regression"])
@pytest.mark.parametrize("name", ["transformer-bidirectional", "lstm-adam"])
def test_trainer_with_gradient_accumulation_takes_the_step_of_one_batch(name, regression, tmp_path,
                                                                        make_generator):
    """transformers' Trainer: one SGD step on two accumulated batches of two rows equals one on a
    batch of the four. The loss is a mean over rows and does not read the Trainer's
    num_items_in_batch, so the Trainer must divide it by the accumulation steps
    (SequenceClassificationMixin.accepts_loss_kwargs); without that the step doubled."""
    from transformers import Trainer, TrainingArguments
    data = Rows(regression, make_generator())
    steps = []
    for batch, accumulation in ((4, 1), (2, 2)):
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_config(
            head_config(name, num_labels=1 if regression else LABELS)).double()
        start = [p.detach().clone() for p in model.parameters()]
        args = TrainingArguments(output_dir=str(tmp_path / str(batch)), max_steps=1, learning_rate=0.5,
                                 per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                                 optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0, report_to=[],
                                 use_cpu=True, save_strategy="no", disable_tqdm=True)
        Trainer(model=model, args=args, train_dataset=data, data_collator=collate).train()
        steps.append([p.detach() - s for p, s in zip(model.parameters(), start)])
    assert max(step.abs().max().item() for step in steps[0]) > 1e-4
    for one, accumulated in zip(*steps):
        torch.testing.assert_close(accumulated, one, rtol=1e-9, atol=1e-12)
