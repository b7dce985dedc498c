"""transformers' Trainer with `label_smoothing_factor` on both causal LM families: the Trainer
smooths the loss itself and shifts the labels by one only for the causal LM classes it knows by
name, so its loss must be the smoothed next-token loss, computed here from the logits in float64:
(1 - ε) · NLL + ε · the mean over the vocabulary of -log p, each averaged over the scored positions
of a padded batch."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.hf_heads import PAD, head_config, padded
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

EPSILON = 0.2


def smoothed_loss(logits, labels, epsilon, shift=1):
    """The smoothed loss of each position's label `shift` positions on."""
    log_p = logits[:, :logits.shape[1] - shift].double().log_softmax(-1)
    targets = labels[:, shift:]
    scored = targets != -100
    nll = -log_p.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    uniform = -log_p.mean(-1)
    return (1 - epsilon) * nll[scored].mean() + epsilon * uniform[scored].mean()


@pytest.mark.parametrize("name", ["transformer-causal", "lstm-momentum"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_the_trainers_smoothed_loss_is_the_next_token_loss(name, side, tmp_path, make_generator):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(head_config(name, initializer_range=1.0)).double().eval()
    generator = make_generator()
    rows = [torch.randint(0, PAD, (n,), generator=generator) for n in (7, 4, 6)]
    ids, mask = padded(rows, side)
    labels = ids.masked_fill(mask == 0, -100)
    args = TrainingArguments(output_dir=str(tmp_path), label_smoothing_factor=EPSILON, use_cpu=True,
                             report_to=[])
    trainer = Trainer(model=model, args=args)
    with torch.no_grad():
        loss = trainer.compute_loss(model, dict(input_ids=ids, attention_mask=mask, labels=labels.clone()))
        logits = model(input_ids=ids, attention_mask=mask).logits
    expected = smoothed_loss(logits, labels, EPSILON)
    unshifted = smoothed_loss(logits, labels, EPSILON, shift=0)
    assert (expected - unshifted).abs() > 0.05, "the batch does not tell shifted from unshifted labels"
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-7)
