"""Random configurations across the library (tests/helpers/random_cases.py): each case draws its
shapes, hyperparameters, padding, packing, hybrid layers or cell from its seed and checks that every
sequence equals itself run alone and that recurrent and batch forms agree, against float64
references; generation (speculative decoding, beams, continued, static and no cache), torch.export
and fairseq's LSTM models give what their reference forms give (helpers/random_generation.py); every
class saves, loads, resizes, takes embeddings and checkpoints its gradients as transformers' models do
(helpers/random_model_api.py). The
other tests fix a few combinations each; these draw from all of them. The seed is
the test's parameter, so a failure reruns alone (its node id, e.g.
`tests/test_random_configurations.py::test_random_case[rnn-17]`), and its message names the case.

MOMENTUM_RANDOM_CASES (default 1) multiplies the number of cases: a longer sweep, outside make test,
is `MOMENTUM_RANDOM_CASES=50 pytest -n 2 tests/test_random_configurations.py`."""
import importlib.util
import os
import random

import pytest
from helpers import random_cases, random_generation, random_model_api

SCALE = int(os.environ.get("MOMENTUM_RANDOM_CASES", "1"))
NEEDS_TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
INTERPRETED = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="runs CPU tensors through Triton's interpreter (TRITON_INTERPRET=1)")

# family: (cases, check, marks)
FAMILIES = {
    "attention": (80, random_cases.check_attention, ()),
    "nonfinite": (40, random_cases.check_attention_nonfinite, ()),
    # the kernels' scans and splits, then the public functions on the Triton backend (its decoding step)
    "triton": (8, random_cases.check_triton_attention, (NEEDS_TRITON,)),
    "triton-api": (8, lambda rng: random_cases.check_attention(rng, backend="triton"), (NEEDS_TRITON,)),
    "rnn": (60, random_cases.check_rnn_layers, ()),
    "native": (25, random_cases.check_native_causal_lm, ()),
    "native-triton": (6, random_cases.check_native_causal_lm_on_triton, (NEEDS_TRITON, INTERPRETED)),
    "lstm-lm": (15, random_cases.check_lstm_causal_lm, ()),
    "stock": (25, random_cases.check_stock_causal_lm, ()),
    "seq2seq": (25, random_cases.check_seq2seq, ()),
    "fairseq": (15, random_cases.check_fairseq_translation, ()),
    "speculative": (20, random_generation.check_speculative, ()),
    "generation": (20, random_generation.check_generation, ()),
    "export": (6, random_generation.check_export, ()),
    "fairseq-lstm": (10, random_generation.check_fairseq_lstm, ()),
    "model-api": (24, random_model_api.check_model_api, ()),
}
SEEDS = [pytest.param(f"{family}-{i}", marks=marks)
         for family, (count, _, marks) in FAMILIES.items() for i in range(count * SCALE)]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_case(seed):
    family = seed.rsplit("-", 1)[0]
    FAMILIES[family][1](random.Random(seed))
