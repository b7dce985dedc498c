"""Random configurations across the library (tests/helpers/random_cases.py): each case draws its
shapes, hyperparameters, padding, packing, hybrid layers or cell from its seed and checks that every
sequence equals itself run alone and that recurrent and batch forms agree, against float64
references. The other tests fix a few combinations each; these draw from all of them. The seed is
the test's parameter, so a failure reruns alone (its node id, e.g.
`tests/test_random_configurations.py::test_rnn_layers[rnn-17]`), and its message names the case.

MOMENTUM_RANDOM_CASES (default 1) multiplies the number of cases: a longer sweep, outside make test,
is `MOMENTUM_RANDOM_CASES=50 pytest -n 2 tests/test_random_configurations.py`."""
import importlib.util
import os
import random

import pytest
from helpers import random_cases

SCALE = int(os.environ.get("MOMENTUM_RANDOM_CASES", "1"))


def seeds(count: int, family: str) -> list:
    """`count` × SCALE seeds, distinct per family."""
    return [f"{family}-{i}" for i in range(count * SCALE)]


def rng_of(seed: str) -> random.Random:
    return random.Random(seed)


@pytest.mark.parametrize("seed", seeds(80, "attention"))
def test_attention_rows_and_decoding_steps(seed):
    random_cases.check_attention(rng_of(seed))


@pytest.mark.parametrize("seed", seeds(40, "nonfinite"))
def test_attention_non_finite_inputs(seed):
    random_cases.check_attention_nonfinite(rng_of(seed))


TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


@TRITON
@pytest.mark.parametrize("seed", seeds(8, "triton"))
def test_triton_attention(seed):
    random_cases.check_triton_attention(rng_of(seed))


@TRITON
@pytest.mark.parametrize("seed", seeds(8, "triton-api"))
def test_triton_attention_rows_and_decoding_steps(seed):
    """The public functions on the Triton backend (the chunked kernels, the fused decoding step);
    head dimensions of any size, 20 of a 32-lane tile among them."""
    random_cases.check_attention(rng_of(seed), backend="triton")


@pytest.mark.parametrize("seed", seeds(60, "rnn"))
def test_rnn_layers(seed):
    random_cases.check_rnn_layers(rng_of(seed))


@pytest.mark.parametrize("seed", seeds(25, "native"))
def test_native_causal_lm(seed):
    random_cases.check_native_causal_lm(rng_of(seed))


@pytest.mark.parametrize("seed", seeds(15, "lstm-lm"))
def test_lstm_causal_lm(seed):
    random_cases.check_lstm_causal_lm(rng_of(seed))


@pytest.mark.parametrize("seed", seeds(25, "stock"))
def test_stock_causal_lm_with_momentum_attention(seed):
    random_cases.check_stock_causal_lm(rng_of(seed))


@pytest.mark.parametrize("seed", seeds(25, "seq2seq"))
def test_encoder_decoders(seed):
    random_cases.check_seq2seq(rng_of(seed))


@pytest.mark.parametrize("seed", seeds(15, "fairseq"))
def test_fairseq_translation(seed):
    random_cases.check_fairseq_translation(rng_of(seed))
