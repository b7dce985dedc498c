"""Options the native models cannot honour yet are refused before any work, naming the option,
instead of failing halfway or being silently ignored (issue 29): `layer_types` the family does not
build (hybrids of momentum and softmax layers: tests/test_hf_hybrid.py), and packed documents in
the sequence-classification heads (each row is pooled into one label). Speculative decoding works:
tests/test_hf_speculative.py."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from helpers.hf_tiny_models import FAMILIES, config
from transformers import AutoModelForSequenceClassification


def test_unbuilt_layer_types_are_refused_and_all_momentum_is_accepted():
    with pytest.raises(ValueError, match=r"layer_types=.*not \['chunked_attention'\]"):
        config("transformer", layer_types=["linear_attention", "chunked_attention"])
    with pytest.raises(ValueError, match="sliding_window is None"):
        config("transformer", layer_types=["sliding_attention", "linear_attention"])
    accepted = config("transformer", layer_types=["linear_attention", "linear_attention"])
    assert list(accepted.layer_types) == ["linear_attention"] * 2


def classifier(family):
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(config(family, num_labels=3)).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_classification_heads_refuse_packed_documents(family, make_generator):
    model = classifier(family)
    ids = torch.randint(3, 60, (1, 9), generator=make_generator())
    restarting = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1]])
    with pytest.raises(ValueError, match="position_ids restart at 0 within a row"):
        model(input_ids=ids, position_ids=restarting)
    cu = torch.tensor([0, 4, 7, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match="packed documents .cu_seq_lens_q / seq_idx."):
        model(input_ids=ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=4, max_length_k=4)


@pytest.mark.parametrize("family", FAMILIES)
def test_classification_heads_keep_one_sequence_per_row_with_its_positions(family, make_generator):
    """Left padding's positions, as generate() numbers them (1 under the padding, then 0, 1, …),
    are one sequence, not a restart: accepted, and the logits are the same as without them."""
    model = classifier(family)
    ids = torch.randint(3, 60, (2, 6), generator=make_generator())
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        given = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    assert given.shape == (2, 3)
    torch.testing.assert_close(given, plain)
