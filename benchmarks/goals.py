"""Issue 27's acceptance goals, judged from the results of one gpu-check run (benchmarks/gpu_check.py
writes the table into its section): each goal's measured value, read from the parts' rows at the
goal's own sizes, against its threshold. A goal whose rows are missing, failed or ran out of budget
is "not measured", never estimated; the dry run's tiny sizes measure none.

Each check takes the parts' results ({part: result}) and the device's published limits, and returns
(what was measured, verdict); the verdict is "yes", "no" or "not measured"."""
import statistics
from typing import Callable, Optional

from roofline import Limits, case_roofline

NOT_MEASURED = "not measured"
ATTENTION_SHAPES = {1024: (16, 16, 64), 4096: (4, 16, 64), 16384: (1, 16, 64), 32768: (1, 8, 64)}
DEFAULT_METHOD = "momentum triton"          # the chunked kernels, the CUDA default
RNN_SHAPE = "ptb-3x1150"
CHUNK = 64                                  # gpu_attention.CHUNK, the chunk its rows ran at


def _attention_row(results, method, dtype, T, backward=True):
    rows = results.get("attention", {}).get("rows") or []
    B, H, D = ATTENTION_SHAPES[T]
    for row in rows:
        if (row["method"], row["dtype"], row["B"], row["H"], row["D"], row["T"], row["backward"]) == (
                method, dtype, B, H, D, T, backward):
            return row
    return None


def _ms(row) -> Optional[float]:
    return row["ms"] if row is not None and row.get("status") == "ok" and row.get("ms") else None


def _why_not(*rows) -> str:
    """Why a goal's rows give no number: a row's status (budget, OOM, error) or their absence."""
    states = sorted({row["status"] for row in rows if row is not None and row.get("status") != "ok"})
    return NOT_MEASURED + (f" ({', '.join(states)})" if states else "")


def _floor_ms(row, limits: Limits) -> float:
    """The floor of a row, as gpu_attention's table counts it (without importing torch)."""
    return case_roofline(row, limits, CHUNK).floor_ms()


def memory_floor(results, limits: Optional[Limits]):
    """Momentum fwd+bwd in bf16 at ≥ 30 % of its floor (roofline.Roofline) at every T ≥ 4k."""
    if limits is None:
        return "no published limits for this device", NOT_MEASURED
    rows = [_attention_row(results, DEFAULT_METHOD, "bf16", T) for T in (4096, 16384, 32768)]
    shares = {row["T"]: 100 * _floor_ms(row, limits) / row["ms"] for row in rows if _ms(row)}
    if not shares:
        return _why_not(*rows), NOT_MEASURED
    measured = ", ".join(f"{share:.0f} % at {T // 1024}k" for T, share in shares.items())
    if len(shares) < len(rows):
        return measured + f"; {len(rows) - len(shares)} of the sizes {_why_not(*rows)}", NOT_MEASURED
    return measured, "yes" if min(shares.values()) >= 30 else "no"


def against_sdpa(T: int, at_most: float) -> Callable:
    def check(results, limits):
        ours, sdpa = (_attention_row(results, method, "bf16", T) for method in (DEFAULT_METHOD, "sdpa"))
        if not (_ms(ours) and _ms(sdpa)):
            return _why_not(ours, sdpa), NOT_MEASURED
        ratio = ours["ms"] / sdpa["ms"]
        fused = _ms(_attention_row(results, DEFAULT_METHOD + " fused", "bf16", T))
        extra = f" (fused kernels {fused / sdpa['ms']:.2f}×)" if fused else ""
        return (f"{ratio:.2f}× ({ours['ms']:.3f} / {sdpa['ms']:.3f} ms){extra}",
                "yes" if ratio <= at_most else "no")
    check.__doc__ = f"Momentum bf16 fwd+bwd at T = {T // 1024}k in at most {at_most}× SDPA's time."
    return check


def fp32_against_bf16(results, limits):
    """Momentum fp32 fwd+bwd at 16-16-64-1024 in at most 3× its bf16 time."""
    fp32, bf16 = (_attention_row(results, DEFAULT_METHOD, dtype, 1024) for dtype in ("fp32", "bf16"))
    if not (_ms(fp32) and _ms(bf16)):
        return _why_not(fp32, bf16), NOT_MEASURED
    ratio = fp32["ms"] / bf16["ms"]
    return f"{ratio:.2f}× ({fp32['ms']:.3f} / {bf16['ms']:.3f} ms)", "yes" if ratio <= 3 else "no"


def _hf_rows(results, table):
    return (results.get("hf", {}).get("rows") or {}).get(table) or {}


def _rate(value) -> Optional[float]:
    """tokens/s of an hf cell: a number, a (tokens/s, MiB, params) list, or a string (why not)."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value if isinstance(value, (int, float)) and value > 0 else None


def _hf_why_not(*cells) -> str:
    reasons = sorted({cell for cell in cells if isinstance(cell, str)})
    return NOT_MEASURED + (f" ({'; '.join(reasons)})" if reasons else "")


def hf_training(results, limits):
    """HF training tokens/s at T = 8192 at least 1.3× Llama-SDPA's (eager, as gpu-check trains)."""
    rows = _hf_rows(results, "train")
    ours, llama = rows.get("momentum@8192"), rows.get("llama@8192")
    if not (_rate(ours) and _rate(llama)):
        return _hf_why_not(ours, llama), NOT_MEASURED
    ratio = _rate(ours) / _rate(llama)
    return (f"{ratio:.2f}× ({_rate(ours):.0f} / {_rate(llama):.0f} tokens/s, eager)",
            "yes" if ratio >= 1.3 else "no")


def per_round(numerators, denominators) -> Optional[tuple]:
    """(median, lowest, highest) of numerators[i] / denominators[i] over the rounds in which both cells
    were timed (hf_speed.decode_rates times every cell once per round, in turn; a cell that the budget
    stopped has the first rounds); None without a common round."""
    ratios = sorted(a / b for a, b in zip(numerators or [], denominators or []) if a and b)
    return (statistics.median(ratios), ratios[0], ratios[-1]) if ratios else None


def _ratio_text(ratio: tuple, rounds: int) -> str:
    median, low, high = ratio
    return f"{median:.2f}" + (f" (rounds {low:.2f}–{high:.2f})" if rounds > 1 else "")


def decoding(name: str) -> Callable:
    def check(results, limits):
        rows = _hf_rows(results, "generation")
        short, long, llama = rows.get(f"{name}@512"), rows.get(f"{name}@8192"), rows.get("llama@8192")
        if not (_rate(short) and _rate(long) and _rate(llama)):
            return _hf_why_not(short, long, llama), NOT_MEASURED
        rounds = _hf_rows(results, "generation_rounds")
        cells = [rounds.get(f"{name}@512"), rounds.get(f"{name}@8192"), rounds.get("llama@8192")]
        flat = per_round(cells[1], cells[0]) or (_rate(long) / _rate(short),) * 3
        faster = per_round(cells[1], cells[2]) or (_rate(long) / _rate(llama),) * 3
        timed = min(len(cell or []) for cell in cells)
        how = f"; ratios within each of {timed} rounds, medians" if timed > 1 else ""
        return (f"8192 / 512: {_ratio_text(flat, timed)}; {_ratio_text(faster, timed)}× Llama at 8192 "
                f"({_rate(long):.1f} / {_rate(llama):.1f} tokens/s{how})",
                "yes" if flat[0] >= 0.95 and faster[0] >= 1.5 else "no")
    how = "eager" if name == "momentum" else "static cache, torch.compile(mode='reduce-overhead')"
    check.__doc__ = (f"Greedy decoding ({how}) tokens/s at context 8192 at least 0.95× those at 512, and "
                     "at least 1.5× Llama's: the ratios taken within each round of timing, their medians.")
    return check


def _rnn_seconds(results, variant) -> Optional[float]:
    for row in results.get("rnn", {}).get("rows") or []:
        if row["shape"] == RNN_SHAPE and row["variant"] == variant and row.get("seconds"):
            return row["seconds"]
    return None


def rnn_against_cudnn(variants: tuple, at_most: float, label: str) -> Callable:
    """The first of `variants` is the default path, the verdict's; the others (opt-in) are named."""
    def check(results, limits):
        base = _rnn_seconds(results, "nn.LSTM")
        default = _rnn_seconds(results, variants[0])
        if not (base and default):
            return NOT_MEASURED, NOT_MEASURED
        ratio = default / base
        others = [(variant, _rnn_seconds(results, variant)) for variant in variants[1:]]
        extra = "".join(f"; {variant}: {seconds / base:.2f}×" for variant, seconds in others if seconds)
        return (f"{ratio:.2f}× ({default * 1e3:.1f} / {base * 1e3:.1f} ms){extra}",
                "yes" if ratio <= at_most else "no")
    check.__doc__ = f"{label} at PTB 3 × 1150, fwd+bwd, in at most {at_most}× cuDNN nn.LSTM's time."
    return check


def one_command(results, limits):
    """make gpu-check within 8 minutes, every gpu-marked test started."""
    tests = results.get("tests")
    if not tests or tests.get("status") != "ok" or "counts" not in tests:
        why = f"tests part: {tests['status']}" if tests else "no tests part"
        return f"{NOT_MEASURED} ({why})", NOT_MEASURED
    earlier = [part for part, result in results.items() if result.get("earlier")]
    if earlier:
        return f"{NOT_MEASURED} (from earlier calls: {', '.join(earlier)})", NOT_MEASURED
    counts = tests["counts"]
    if counts["tests"] == counts["skipped"]:
        return f"{NOT_MEASURED} (all {counts['tests']} gpu tests skipped: no CUDA device?)", NOT_MEASURED
    seconds = sum(result.get("seconds", 0.0) for result in results.values())
    waiting = len(tests.get("not_started") or [])
    return (f"parts {seconds:.0f} s; {waiting} gpu tests not started",
            "yes" if seconds <= 8 * 60 and waiting == 0 else "no")


GOALS = [
    ("momentum fwd+bwd bf16 ≥ 30 % of the memory floor at T ≥ 4k", memory_floor),
    ("≤ 1.0× SDPA's time at 4k", against_sdpa(4096, 1.0)),
    ("≤ 0.3× SDPA's time at 16k", against_sdpa(16384, 0.3)),
    ("HF training ≥ 1.3× Llama-SDPA tokens/s at T = 8192", hf_training),
    ("decoding at 8192 ≥ 0.95× that at 512, and ≥ 1.5× Llama's (eager)", decoding("momentum")),
    ("the same, compiled (static cache, CUDA graphs)", decoding("momentum compiled")),
    ("fp32 fwd+bwd ≤ 3× bf16", fp32_against_bf16),
    ("Adam LSTM ≤ 2.5× cuDNN (default; then opt-in recurrences)",
     rnn_against_cudnn(("adam", "adam-cudnn", "adam-triton-one-launch"), 2.5, "The Adam LSTM")),
    ("RMSProp LSTM ≤ 2.5× cuDNN (default; then opt-in recurrences)",
     rnn_against_cudnn(("rmsprop", "rmsprop-cudnn", "rmsprop-triton-one-launch"), 2.5, "The RMSProp LSTM")),
    ("MomentumLSTM ≤ 1.2× nn.LSTM (the paper's Table 14; then nn.LSTM one call per layer)",
     rnn_against_cudnn(("momentum", "nn.LSTM-per-layer"), 1.2, "MomentumLSTM")),
    ("make gpu-check in one command of ≤ 8 minutes, every gpu test started", one_command),
]


def judged(results: dict, limits: Optional[Limits]) -> list:
    """[(goal, measured, verdict)] for every goal of GOALS."""
    return [(goal, *check(results, limits)) for goal, check in GOALS]


def markdown(results: dict, limits: Optional[Limits]) -> str:
    lines = ["Read from this run's rows below, at each goal's sizes (the default paths decide; opt-in "
             "paths are named beside them). \"not measured\": the rows are missing, failed or out of "
             "budget.", "", "| goal | measured | met |", "|---|---|---|"]
    lines += [f"| {goal} | {measured} | {verdict} |" for goal, measured, verdict in judged(results, limits)]
    return "\n".join(lines)
