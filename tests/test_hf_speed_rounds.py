"""benchmarks/hf_speed.decode_rates without models: every (decoder, context) cell is timed once per
round in an order that rotates, after an untimed round; a decoder that cannot be built costs only
its own cells; a budget that runs out keeps the rounds already timed."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import hf_speed  # noqa: E402

SIZES = dict(contexts=[512, 8192], repeats=3)


@pytest.fixture
def passes(monkeypatch):
    """The cells' passes in the order they ran; pass i returns tokens/s 100 + i. A decoder is (name,)."""
    ran = []

    def timed(decoder, context, sizes, device):
        ran.append((decoder[0], context))
        return 100.0 + len(ran) - 1
    monkeypatch.setattr(hf_speed, "_decoder", lambda name, sizes, device: (name,))
    monkeypatch.setattr(hf_speed, "_timed_pass", timed)
    return ran


def test_every_cell_once_a_round_in_turn_after_an_untimed_round(passes):
    medians, rounds = hf_speed.decode_rates(SIZES, "cpu", over=lambda: False)
    cells = [(name, context) for context in SIZES["contexts"] for name in hf_speed.DECODERS]
    assert len(passes) == len(cells) * (SIZES["repeats"] + 1)
    by_round = [passes[i:i + len(cells)] for i in range(0, len(passes), len(cells))]
    assert all(sorted(done) == sorted(cells) for done in by_round)
    assert len({done[0] for done in by_round}) == len(by_round)           # each round starts elsewhere
    for cell in cells:
        timed = [100.0 + i for i, done in enumerate(passes) if done == cell][1:]    # round 0 untimed
        assert rounds[cell] == timed and medians[cell] == timed[1]


def test_a_decoder_that_fails_costs_only_its_cells(passes, monkeypatch):
    def build(name, sizes, device):
        if name == "momentum compiled":
            raise RuntimeError("no compiler")
        return (name,)
    monkeypatch.setattr(hf_speed, "_decoder", build)
    medians, rounds = hf_speed.decode_rates(SIZES, "cpu", over=lambda: False)
    for context in SIZES["contexts"]:
        assert medians["momentum compiled", context] == "error: RuntimeError: no compiler"
        assert ("momentum compiled", context) not in rounds
        assert len(rounds["momentum", context]) == len(rounds["llama", context]) == SIZES["repeats"]


def test_a_budget_that_runs_out_keeps_the_rounds_timed(passes):
    cells = len(SIZES["contexts"]) * len(hf_speed.DECODERS)
    stop = 2 * cells + 2                                   # two cells into the second timed round
    medians, rounds = hf_speed.decode_rates(SIZES, "cpu", over=lambda: len(passes) >= stop)
    assert len(passes) == stop
    assert sorted(len(timed) for timed in rounds.values()) == [1] * (cells - 2) + [2, 2]
    assert all(isinstance(rate, float) for rate in medians.values())
