"""benchmarks/goals.py: issue 27's goals judged from a gpu-check run's rows, on made-up rows at the
goals' sizes (no GPU here): each verdict follows the threshold, opt-in paths never decide, and a
missing, failed or out-of-budget row is "not measured"."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import goals  # noqa: E402
import roofline  # noqa: E402

H200 = roofline.device_limits("NVIDIA H200")
SHAPES = {1024: (16, 16), 4096: (4, 16), 16384: (1, 16), 32768: (1, 8)}


def attention_row(method, dtype, T, ms, backward=True, status="ok"):
    B, H = SHAPES[T]
    return dict(method=method, B=B, H=H, D=64, T=T, dtype=dtype, backward=backward,
                ms=ms if status == "ok" else None, peak_mib=1.0, status=status)


def floor_ms(T, dtype="bf16"):
    """The floor of the momentum fwd+bwd, counted here from the ideal bytes and the chunked flops."""
    B, H = SHAPES[T]
    moved = roofline.attention_bytes("momentum triton", B, H, T, 64, 64, dtype, True)
    computed = roofline.attention_flops("momentum triton", B, H, T, 64, 64, 64, True)
    return max(moved / (H200.tb_s * 1e9), computed / (H200.tflops(dtype) * 1e9))


def results(floor_share=0.4, sdpa_4k=0.8, sdpa_16k=0.25, fp32=2.5, train=1.4, flat=1.0, decode=2.0,
            adam=2.0, rmsprop=2.0, momentum=1.1, seconds=400, not_started=0, skipped=5):
    """A run's results with each goal's ratio as given (the measured ones are the ratio's inputs)."""
    rows = []
    for T in (4096, 16384, 32768):
        rows.append(attention_row("momentum triton", "bf16", T, floor_ms(T) / floor_share))
    rows += [attention_row("sdpa", "bf16", 4096, rows[0]["ms"] / sdpa_4k),
             attention_row("sdpa", "bf16", 16384, rows[1]["ms"] / sdpa_16k),
             attention_row("momentum triton", "bf16", 1024, 1.5),
             attention_row("momentum triton", "fp32", 1024, 1.5 * fp32),
             attention_row("momentum triton", "bf16", 1024, 0.4, backward=False)]
    gen = {"llama@512": 300.0, "llama@8192": 250.0, "momentum@8192": 250.0 * decode,
           "momentum@512": 250.0 * decode / flat, "momentum compiled@512": 3000.0,
           "momentum compiled@8192": "OOM"}
    rnn = [dict(shape="ptb-3x1150", variant=v, seconds=s, peak_mib=1.0) for v, s in (
        ("nn.LSTM", 0.015), ("adam", 0.015 * adam), ("rmsprop", 0.015 * rmsprop),
        ("momentum", 0.015 * momentum), ("adam-cudnn", 0.015), ("nn.LSTM-per-layer", 0.018))]
    rnn.append(dict(shape="pmnist-256", variant="adam", seconds=1.0, peak_mib=1.0))
    counts = dict(tests=100, failed=0, errors=0, skipped=skipped, seconds=150.0, budget=not_started,
                  passed=100 - skipped)
    return {"tests": dict(status="ok", counts=counts, not_started=[f"t{i}" for i in range(not_started)],
                          seconds=seconds - 200),
            "attention": dict(status="ok", rows=rows, seconds=100),
            "hf": dict(status="ok", seconds=60, rows=dict(
                train={"momentum@8192": [1000.0 * train, 9.0, 1], "llama@8192": [1000.0, 9.0, 1]},
                generation=gen)),
            "rnn": dict(status="ok", rows=rnn, seconds=40)}


def verdicts(run, limits=H200):
    return {goal: (measured, verdict) for goal, measured, verdict in goals.judged(run, limits)}


def verdict(run, start, limits=H200):
    [(measured, met)] = [value for goal, value in verdicts(run, limits).items() if goal.startswith(start)]
    return measured, met


def test_every_goal_met_where_the_rows_meet_it():
    judged = verdicts(results())
    assert len(judged) == len(goals.GOALS)
    compiled = "the same, compiled"
    assert {goal: met for goal, (_, met) in judged.items() if not goal.startswith(compiled)} == dict.fromkeys(
        (goal for goal in judged if not goal.startswith(compiled)), "yes")
    assert verdict(results(), compiled) == ("not measured (OOM)", "not measured")


@pytest.mark.parametrize("start,met,unmet,key", [
    ("≤ 1.0× SDPA's time at 4k", 1.0, 1.01, "sdpa_4k"),
    ("≤ 0.3× SDPA's time at 16k", 0.3, 0.31, "sdpa_16k"),
    ("fp32 fwd+bwd ≤ 3× bf16", 3.0, 3.05, "fp32"),
    ("HF training ≥ 1.3×", 1.3, 1.29, "train"),
    ("Adam LSTM ≤ 2.5×", 2.5, 2.51, "adam"),
    ("RMSProp LSTM ≤ 2.5×", 2.5, 2.6, "rmsprop"),
    ("MomentumLSTM ≤ 1.2×", 1.2, 1.41, "momentum"),
])
def test_a_ratio_at_the_threshold_meets_it_and_one_past_it_does_not(start, met, unmet, key):
    measured, verdict_at = verdict(results(**{key: met}), start)
    assert verdict_at == "yes" and measured.startswith(f"{met:.2f}×")
    measured, verdict_past = verdict(results(**{key: unmet}), start)
    assert verdict_past == "no" and measured.startswith(f"{unmet:.2f}×")


def test_the_memory_floor_takes_every_long_size_and_the_device_limits():
    measured, met = verdict(results(floor_share=0.3), "momentum fwd+bwd bf16 ≥ 30 %")
    assert met == "yes" and measured == "30 % at 4k, 30 % at 16k, 30 % at 32k"
    run = results(floor_share=0.5)
    run["attention"]["rows"][2]["ms"] = floor_ms(32768) / 0.2               # one size short of it
    assert verdict(run, "momentum fwd+bwd") == ("50 % at 4k, 50 % at 16k, 20 % at 32k", "no")
    assert verdict(results(), "momentum fwd+bwd", limits=None) == ("no published limits for this device",
                                                                    "not measured")


def test_the_floor_is_gpu_attentions_own():
    torch = pytest.importorskip("torch")  # noqa: F841  (gpu_attention imports it)
    import gpu_attention
    assert goals.CHUNK == gpu_attention.CHUNK
    for row in results()["attention"]["rows"]:
        assert goals._floor_ms(row, H200) == gpu_attention.roofline(row, H200).floor_ms()


def test_decoding_needs_a_flat_rate_and_a_lead_over_llama():
    assert verdict(results(flat=0.95, decode=1.5), "decoding")[1] == "yes"
    measured, met = verdict(results(flat=0.9), "decoding")
    assert met == "no" and measured.startswith("8192 / 512: 0.90; 2.00× Llama at 8192")
    assert verdict(results(decode=1.4), "decoding")[1] == "no"


def test_decoding_takes_its_ratios_within_each_round():
    """hf_speed times every cell once per round: a round that the host slowed slows all its cells,
    so the verdict is on the ratios within a round (here 1.6, 1.1, 1.62), not on the cells' medians
    (330 / 290 = 1.14, which another round's slowness set)."""
    run = results()
    run["hf"]["rows"]["generation_rounds"] = {
        "llama@8192": [100.0, 300.0, 290.0], "momentum@8192": [160.0, 330.0, 470.0],
        "momentum@512": [160.0, 330.0, 470.0 / 0.96]}
    run["hf"]["rows"]["generation"].update(
        {"llama@8192": 290.0, "momentum@8192": 330.0, "momentum@512": 330.0})
    measured, met = verdict(run, "decoding")
    assert met == "yes", measured
    assert measured.startswith("8192 / 512: 1.00 (rounds 0.96–1.00); 1.60 (rounds 1.10–1.62)× Llama at 8192")
    assert measured.endswith("ratios within each of 3 rounds, medians)")
    run["hf"]["rows"]["generation_rounds"]["momentum@8192"] = [160.0, 330.0, 400.0]     # 1.38 in the third
    assert verdict(run, "decoding")[1] == "no"


def test_per_round_pairs_the_rounds_both_cells_were_timed_in():
    assert goals.per_round([2.0, 6.0, 9.0], [1.0, 2.0]) == (2.5, 2.0, 3.0)    # the budget stopped the second
    assert goals.per_round([], [1.0]) is None and goals.per_round(None, [1.0]) is None


def test_opt_in_paths_are_named_but_only_the_default_decides():
    measured, met = verdict(results(adam=2.78), "Adam LSTM")
    assert met == "no" and measured == "2.78× (41.7 / 15.0 ms); adam-cudnn: 1.00×"
    measured, met = verdict(results(momentum=1.41), "MomentumLSTM")
    assert met == "no" and measured.endswith("; nn.LSTM-per-layer: 1.20×")
    run = results(sdpa_4k=1.2)
    run["attention"]["rows"].append(attention_row("momentum triton fused", "bf16", 4096,
                                                  run["attention"]["rows"][3]["ms"] * 0.9))
    measured, met = verdict(run, "≤ 1.0× SDPA's time at 4k")
    assert met == "no" and measured.endswith("(fused kernels 0.90×)")


@pytest.mark.parametrize("damage,reason", [
    (lambda run: run.pop("attention"), "not measured"),
    (lambda run: run["attention"]["rows"].__setitem__(3, attention_row("sdpa", "bf16", 4096, None,
                                                                       status="budget")),
     "not measured (budget)"),
    (lambda run: run["attention"]["rows"].__setitem__(0, attention_row("momentum triton", "bf16", 4096, None,
                                                                       status="OOM")),
     "not measured (OOM)"),
])
def test_a_missing_or_failed_row_is_not_measured(damage, reason):
    run = results()
    damage(run)
    assert verdict(run, "≤ 1.0× SDPA's time at 4k") == (reason, "not measured")


def test_hf_and_rnn_cells_that_failed_are_not_measured():
    run = results()
    run["hf"]["rows"]["train"]["llama@8192"] = "OOM"
    assert verdict(run, "HF training") == ("not measured (OOM)", "not measured")
    run["rnn"]["rows"] = [row for row in run["rnn"]["rows"] if row["variant"] != "nn.LSTM"]
    assert verdict(run, "Adam LSTM")[1] == "not measured"
    run.pop("hf")
    assert verdict(run, "decoding")[1] == "not measured"


def test_one_command_counts_time_and_tests_not_started():
    assert verdict(results(seconds=480), "make gpu-check") == ("parts 480 s; 0 gpu tests not started", "yes")
    assert verdict(results(seconds=481), "make gpu-check")[1] == "no"
    assert verdict(results(not_started=2), "make gpu-check") == ("parts 400 s; 2 gpu tests not started", "no")
    assert verdict(results(skipped=100), "make gpu-check")[1] == "not measured"
    run = results()
    run["attention"]["earlier"] = True                       # a cached part: not one command
    assert verdict(run, "make gpu-check") == ("not measured (from earlier calls: attention)", "not measured")


def test_markdown_has_one_line_per_goal():
    text = goals.markdown(results(adam=2.78), H200)
    lines = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(lines) == 1 + len(goals.GOALS)
    assert "| Adam LSTM ≤ 2.5× cuDNN (default; then opt-in recurrences) | 2.78× (41.7 / 15.0 ms)" in text


def test_the_goals_sizes_are_those_gpu_check_runs():
    """A goal read at a size the full run does not time would stay "not measured" for ever."""
    import gpu_check
    full = gpu_check.SIZES["full"]
    timed = {(dtype, shape) for dtype, shapes in full["attention"]["cases"] for shape in shapes}
    for T, (B, H, D) in goals.ATTENTION_SHAPES.items():
        assert ("bf16", (B, H, D, T)) in timed
    assert ("fp32", (*goals.ATTENTION_SHAPES[1024], 1024)) in timed
    methods = set(full["attention"]["methods"])
    assert {goals.DEFAULT_METHOD, goals.DEFAULT_METHOD + " fused", "sdpa"} <= methods
    assert goals.RNN_SHAPE in full["rnn"]["shapes"]
    import rnn
    assert {"nn.LSTM", "adam", "rmsprop", "momentum", "adam-cudnn", "rmsprop-cudnn", "adam-triton-one-launch",
            "rmsprop-triton-one-launch", "nn.LSTM-per-layer"} <= set(rnn.GPU_CHECK_VARIANTS)
    assert 8192 in full["hf"]["lengths"] and {512, 8192} <= set(full["hf"]["contexts"])
