"""The native families' question-answering heads (`...ForQuestionAnswering`,
AutoModelForQuestionAnswering: start and end logits of an answer span): a padded row (either
side) gets the span logits, loss and gradients of its sequence alone, padding scored lowest; the
loss is transformers' ForQuestionAnswering cross entropy (positions past the row ignored); packed
documents are refused by name, since one span is chosen per row."""
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.hf_heads import MODELS, PAD, head_config, padded
from transformers import AutoModelForQuestionAnswering, DataCollatorWithFlattening

from hf_momentum import MomentumLSTMForQuestionAnswering, MomentumTransformerForQuestionAnswering

TOL = 1e-5


def build(name):
    torch.manual_seed(0)
    return AutoModelForQuestionAnswering.from_config(head_config(name))


def test_auto_class_builds_the_question_answering_heads():
    assert type(build("transformer-bidirectional")) is MomentumTransformerForQuestionAnswering
    assert type(build("lstm-adam")) is MomentumLSTMForQuestionAnswering


def gradients(model, loss):
    return torch.autograd.grad(loss, list(model.parameters()))


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("name", MODELS)
def test_padded_rows_get_the_span_logits_loss_and_gradients_of_each_row_alone(name, side, make_generator):
    model = build(name).train()                      # no dropout in these configs
    generator = make_generator()
    lengths = (6, 11, 2)
    seqs = [torch.randint(0, PAD, (n,), generator=generator) for n in lengths]
    spans = [sorted(torch.randint(0, n, (2,), generator=generator).tolist()) for n in lengths]
    ids, mask = padded(seqs, side)
    offsets = [0 if side == "right" else ids.shape[1] - len(s) for s in seqs]
    start = torch.tensor([span[0] + offset for span, offset in zip(spans, offsets)])
    end = torch.tensor([span[1] + offset for span, offset in zip(spans, offsets)])
    batched = model(input_ids=ids, attention_mask=mask, start_positions=start, end_positions=end)
    singles = [model(input_ids=s[None], start_positions=torch.tensor(span[:1]),
                     end_positions=torch.tensor(span[1:])) for s, span in zip(seqs, spans)]
    lowest = torch.finfo(batched.start_logits.dtype).min
    for row, single in enumerate(singles):
        real = mask[row].bool()
        for got, want in ((batched.start_logits, single.start_logits),
                          (batched.end_logits, single.end_logits)):
            assert (got[row][real] - want[0]).abs().max() <= TOL, row
            assert bool((got[row][~real] == lowest).all()), row
    expected = sum(single.loss for single in singles) / len(singles)
    assert math.isclose(batched.loss.item(), expected.item(), rel_tol=1e-5)
    for g, w in zip(gradients(model, batched.loss), gradients(model, expected)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_loss_is_cross_entropy_of_start_and_end_with_positions_past_the_row_ignored(make_generator):
    """transformers' ForQuestionAnsweringLoss: the mean of the start and end cross entropies over
    the rows, a position past the row (clamped to its length) ignored."""
    model = build("transformer-bidirectional").eval()
    ids = torch.randint(0, PAD, (3, 8), generator=make_generator())
    start, end = torch.tensor([1, 4, 50]), torch.tensor([3, 4, 7])
    out = model(input_ids=ids, start_positions=start, end_positions=end)

    def cross_entropy(logits, positions):
        kept = positions < logits.shape[1]
        picked = logits.log_softmax(-1)[kept].gather(-1, positions[kept, None])
        return -picked.mean()
    expected = (cross_entropy(out.start_logits, start) + cross_entropy(out.end_logits, end)) / 2
    assert math.isclose(out.loss.item(), expected.item(), rel_tol=1e-5)
    loss, start_logits, end_logits = model(input_ids=ids, start_positions=start, end_positions=end,
                                           return_dict=False)[:3]
    assert torch.equal(start_logits, out.start_logits) and torch.equal(end_logits, out.end_logits)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("name", ["transformer-bidirectional", "lstm-adam"])
def test_a_position_on_padding_is_ignored_as_one_past_the_row(name, side, make_generator):
    """An answer position on a padded token (its logit the dtype's lowest) is ignored, as a
    position past the row alone is: the loss and gradients are those of the rows alone with that
    position past their end, finite, where the padding's logit would have overflowed them."""
    model = build(name).double().train()
    generator = make_generator()
    seqs = [torch.randint(0, PAD, (n,), generator=generator) for n in (7, 3, 4)]
    ids, mask = padded(seqs, side)
    offsets = [0 if side == "right" else ids.shape[1] - len(s) for s in seqs]
    pad_of = [next(i for i in range(ids.shape[1]) if not mask[row, i]) for row in range(1, 3)]
    start = torch.tensor([offsets[0] + 2, pad_of[0], offsets[2] + 1])
    end = torch.tensor([offsets[0] + 5, offsets[1] + 2, pad_of[1]])
    batched = model(input_ids=ids, attention_mask=mask, start_positions=start, end_positions=end)
    alone_start, alone_end = [2, 3, 1], [5, 2, 4]   # 3 and 4: past rows of 3 and 4 tokens
    singles = [model(input_ids=s[None]) for s in seqs]
    expected = expected_loss(singles, alone_start, alone_end, [len(s) for s in seqs])
    assert torch.isfinite(batched.loss)
    torch.testing.assert_close(batched.loss, expected, rtol=1e-12, atol=0)
    for g, w in zip(gradients(model, batched.loss), gradients(model, expected)):
        assert bool(torch.isfinite(g).all())
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)
    if side == "left":          # the loss clamps a negative position to 0, padding here: ignored too
        negative = torch.tensor([-1, -1, offsets[2] + 1])
        negative = model(input_ids=ids, attention_mask=mask, start_positions=negative, end_positions=end)
        assert torch.isfinite(negative.loss)


def expected_loss(singles, starts, ends, lengths):
    """ForQuestionAnsweringLoss over the rows alone: each side's mean cross entropy over the rows
    whose position is inside the row, then the mean of the two sides."""
    def side(logits_of, positions):
        kept = [-getattr(s, logits_of).log_softmax(-1)[0, p] for s, p, n in zip(singles, positions, lengths)
                if p < n]
        return sum(kept) / len(kept)
    return (side("start_logits", starts) + side("end_logits", ends)) / 2


@pytest.mark.parametrize("form", ["position_ids", "flash_attn_kwargs", "seq_idx"])
@pytest.mark.parametrize("name", ["transformer-bidirectional", "lstm-adam"])
def test_packed_documents_are_refused_naming_the_head(name, form):
    model = build(name).eval()
    kwargs = {"flash_attn_kwargs": dict(return_flash_attn_kwargs=True), "seq_idx": dict(return_seq_idx=True)}
    collator = DataCollatorWithFlattening(**kwargs.get(form, {}))
    batch = collator([{"input_ids": [3, 4, 5]}, {"input_ids": [6, 7]}])
    batch.pop("labels")
    if form != "position_ids":
        batch.pop("position_ids")
    with pytest.raises(ValueError, match=f"{type(model).__name__} takes one sequence per row.*answer span"):
        model(**batch)
