"""plugins.validation: one rule set for every argument check."""
import math

import numpy as np
import pytest
import torch

from plugins import validation as V


@pytest.mark.parametrize("bad", [True, False, "0.5", None, math.nan, math.inf, -math.inf,
                                 torch.tensor([0.1, 0.2])])
def test_numbers_refuse_bools_strings_and_non_finite(bad):
    with pytest.raises(ValueError, match="momentum"):
        V.check_momentum(bad)


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 0.999, torch.tensor(0.3), np.float32(0.25)])
def test_momentum_accepts_unit_interval_scalars(value):
    assert V.check_momentum(value) == pytest.approx(float(value))
    assert type(V.check_momentum(value)) is float


@pytest.mark.parametrize("bad", [1.0, -1e-9, 2])
def test_momentum_range_named(bad):
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\)"):
        V.check_momentum(bad)


def test_positive_and_probability():
    assert V.check_positive(1e-6, "eps") == 1e-6
    for bad in (0, -1.0, math.inf):
        with pytest.raises(ValueError, match="eps"):
            V.check_positive(bad, "eps")
    assert V.check_probability(0.0, "dropout") == 0.0
    for bad in (1.0, True, -0.1):
        with pytest.raises(ValueError, match="dropout"):
            V.check_probability(bad, "dropout")


def test_int_refuses_bools_floats_and_wrapping_values():
    assert V.check_int(np.int64(7), "restart", low=1) == 7
    assert V.check_int(torch.tensor(3), "restart", low=1) == 3
    for bad in (True, 2.0, "3", 0, 2 ** 63):
        with pytest.raises(ValueError, match="restart"):
            V.check_int(bad, "restart", low=1)


def test_bool_and_choice():
    assert V.check_bool(False, "is_causal") is False
    for bad in ("false", 0, 1, None):
        with pytest.raises(ValueError, match="is_causal"):
            V.check_bool(bad, "is_causal")
    assert V.check_choice("pre", "layer_norm", ("pre", "post")) == "pre"
    with pytest.raises(ValueError, match="layer_norm must be one of 'pre', 'post'"):
        V.check_choice("mid", "layer_norm", ("pre", "post"))


def test_one_sided_ranges_do_not_read_as_allowing_inf():
    with pytest.raises(ValueError, match=r"step_size must be > 0, got 0"):
        V.check_positive(0, "step_size")
    with pytest.raises(ValueError, match=r"x must be <= 1, got 2"):
        V.check_number(2, "x", high=1.0)


OFFSETS = torch.tensor([0, 3, 3, 7])


@pytest.mark.parametrize("name", ["cu_seqlens", "cu_seq_lens_q"])
@pytest.mark.parametrize("bad,reason", [
    ([0, 3, 7], "must be a 1-D int32/int64 tensor of n \\+ 1 offsets, got list"),
    (OFFSETS[None], r"must be a 1-D tensor of n \+ 1 >= 2 offsets .* got shape \(1, 4\)"),
    (torch.tensor([0]), r"must be a 1-D tensor of n \+ 1 >= 2 offsets .* got shape \(1,\)"),
    (OFFSETS.double(), "must have dtype int32 or int64, got torch.float64"),
    (OFFSETS.to(torch.int16), "must have dtype int32 or int64, got torch.int16"),
    (OFFSETS.bool(), "must have dtype int32 or int64, got torch.bool"),
    (torch.tensor([1, 3, 7]), "must start at 0, got 1"),
    (torch.tensor([0, 4, 2, 7]), "must be non-decreasing, got 4 then 2 at index 1"),
    (torch.tensor([0, 3, 6]), "must end at the sequence length 7, got 6"),
    (torch.tensor([0, 3, 8]), "must end at the sequence length 7, got 8"),
])
def test_offsets_refused_naming_the_argument(name, bad, reason):
    """The one cu_seqlens rule of attention (varlen), the RNN layers (segments) and the HF packing."""
    with pytest.raises(ValueError, match=f"^{name} {reason}"):
        V.check_offsets(bad, 7, name=name)


def test_offsets_device_and_batch_checked_when_given():
    with pytest.raises(ValueError, match="cu_seqlens must be on the input's device meta, got cpu"):
        V.check_offsets(OFFSETS, 7, device="meta")
    with pytest.raises(ValueError, match="cu_seqlens needs a batch of one row .* got batch 2"):
        V.check_offsets(OFFSETS, 7, batch=2)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_offsets_accepted_as_int64(dtype):
    cu = V.check_offsets(torch.tensor([0, 0, 5, 7], dtype=dtype), 7, device="cpu", batch=1)
    assert cu.dtype == torch.int64 and cu.tolist() == [0, 0, 5, 7]
