"""The demo's one-line verdicts: which model is better, and whether the gap exceeds the seed spread."""
from types import SimpleNamespace

from recipes.common.stats import mean_curve, mean_points, verdict


def test_clear_difference_exceeds_the_spread():
    line = verdict("MomentumLSTM", [30.0, 31.0, 32.0], "LSTM", [22.0, 23.0, 24.0], metric="accuracy",
                   lower_is_better=False)
    assert line.startswith("MomentumLSTM vs LSTM: MomentumLSTM better on accuracy by 8.0")
    assert "exceeds the seed spread (1.4)" in line            # sqrt(1 + 1)


def test_lower_is_better_and_overlap_is_called_unclear():
    line = verdict("momentum", [200.0, 190.0, 210.0], "linear", [195.0, 185.0, 205.0], metric="ppl",
                   lower_is_better=True)
    assert "linear better on ppl by 5.0" in line
    assert "within the seed spread (14.1): no clear difference" in line


def test_one_seed_is_not_conclusive():
    line = verdict("a", [1.0], "b", [2.0], metric="loss", lower_is_better=True)
    assert "a better on loss by 1.0" in line and "not conclusive" in line


def test_mean_points_and_mean_curve_average_each_evaluation_point_over_seeds():
    series = [([1, 2, 3], [0.0, 4.0, 8.0]), ([3, 4, 5], [2.0, 6.0, 7.0])]
    assert mean_points(series) == [(2, 1.0), (3, 5.0), (4, 7.5)]
    histories = [SimpleNamespace(step=xs, loss=ys) for xs, ys in series]
    assert mean_curve(histories, "step", "loss") == mean_points(series)
