"""`make gpu-check`: everything a CUDA machine without network can tell about this project, in one
command of at most 8 minutes on an H100 from a bare machine (a lent GPU's command stops at 10),
written as one dated section of docs/benchmarks.md.

Parts, each in its own process with its own time budget (a benchmark part starts no new case in
the last CASE_MARGIN_S of its budget; every part is killed, with what it started, 30 s after its
budget), in this order, correctness first:
  tests      pytest -m gpu over the test files that hold gpu-marked tests, on xdist workers (Triton
             compiles in parallel); tests not started TEST_START_S before the budget ends are
             skipped and counted; the forced tile-config sweep is opt-in (GPU_TILE_SWEEP=1)   200 s
  attention  benchmarks/gpu_attention.py: ours on Triton (chunked and fused kernels), SDPA;
             fwd and fwd+bwd, bf16 at T = 1k, 4k, 16k, 32k and fp32 at 1k, with the roofline.
             fla with --fla (its compilation and autotuning took 160 s on an H200: with
             --parts attention, over the 8 minutes otherwise; FLA_BUDGET_S)                      120 s
  hf         benchmarks/hf_speed.py: training tokens/s, momentum_transformer vs Llama-SDPA (small
             size); greedy decoding tokens/s with the recurrent cache (eager, and a static cache
             under torch.compile(mode="reduce-overhead"), CUDA graphs) vs Llama's KV cache; where an
             eager decode step's time goes at a short and a long context (torch.profiler)        90 s
  rnn        benchmarks/rnn.py --device cuda: every MomentumLSTM cell vs cuDNN nn.LSTM; then,
             where time is left, the tanh MomentumRNN's drive-first Adam/RMSProp vs nn.RNN     50 s
The device line's ceilings (a 1 GiB copy, 8192³ matmuls) come first, in about 15 s. The section
states the plan (the budgets' sum) against the 8-minute limit, then issue 27's goals as this run
measured them (benchmarks/goals.py), then each part. The parts rarely use their whole
budgets (353 of 460 s on an H200, 2026-11-28, while 13 tests did not start): the tests that the
tests part did not start run last (with the kernels the first pass compiled in Triton's cache,
and its tuning timings), in what is left of --limit (8 minutes) when that can start one. A part
whose imports are missing is skipped with the reason. Results go to outputs/gpu-check/<part>.json;
a finished part is not run again while the code (plugins/, hf_momentum/, benchmarks/, tests/), the
device and the mode are the same, unless --force; of a finished tests part, the tests still not
started are run, alone, before anything else.

It runs on whatever python it is started with (the machine's own: `make gpu-check` never builds
.venv, whose torch is a CPU wheel), with the repo on PYTHONPATH and, first, the wheels carried in
.whl (install_carried_wheels: transformers at setup.cfg's floor, and fla-core for --fla).
`--dry-run` (implied by `--device cpu`) runs every part at tiny sizes on the CPU and writes its section to
outputs/gpu-check-dry-run/section.md (its cache lives there too) unless --doc says otherwise: it
checks the orchestration and prints the full run's plan, not speed.

    make gpu-check                                    # on the GPU machine
    make gpu-check GPU_CHECK_ARGS="--parts attention --force"
    python benchmarks/gpu_check.py --device cpu       # the tiny dry run
"""
import argparse
import hashlib
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from datetime import date
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import goals  # noqa: E402
from roofline import device_limits  # noqa: E402

PARTS = ["tests", "attention", "hf", "rnn"]
# measured on an H200 (docs/benchmarks.md, 2026-11-27): tests 154 s with 6 of 113 not started at
# 180 (the fused kernels' GPU tests had joined), attention 84 s with the fused rows, hf 46-57 s
BUDGET_S = {"tests": 200, "attention": 120, "hf": 90, "rnn": 50}
ENV_S = 15                   # the device line and its ceilings (measured: 10–15 s)
LIMIT_S = 8 * 60             # issue 27: the whole check in one command of at most 8 minutes
TEST_TIMEOUT_S = 60          # per test (pytest-timeout; the slowest took 49 s on an H200, compiling)
TEST_START_S = 60            # tests start until this long before the part's budget ends
GRACE_S = 30
REST_MIN_S = TEST_START_S + 20  # the tests not started get a second pass only if it can start some
CASE_MARGIN_S = 20           # benchmark parts start no new case this long before their budget ends
FLA_BUDGET_S = 300           # the attention part's budget with --fla
GOALS_TITLE = "Issue 27's goals, as measured"
TITLES = {"tests": "Tests (`pytest -m gpu`)",
          "attention": "Causal attention: ours (Triton, torch) vs SDPA and fla, with the roofline",
          "hf": "HF end to end: training and generation tokens/s",
          "rnn": "MomentumRNN vs cuDNN nn.LSTM (benchmarks/rnn.py)"}
SIZES = {
    "full": dict(
        # the PyTorch backends are the references of the tests, not contenders: left out here
        attention=dict(cases=[("bf16", [(16, 16, 64, 1024), (4, 16, 64, 4096), (1, 16, 64, 16384),
                                        (1, 8, 64, 32768)]),
                              ("fp32", [(16, 16, 64, 1024)])],
                       methods=["momentum triton", "momentum triton fused", "sdpa", "linear triton"]),
        rnn=dict(shapes=["ptb-3x1150", "pmnist-256"], tanh_shapes=["pmnist-256"], repeats=8),
        hf=dict(size=dict(layers=4, hidden=512, heads=8, ffn=2048, vocab=32000), lengths=[2048, 8192],
                tokens=16384, steps=6, warmup=3, contexts=[512, 8192], new_tokens=64, repeats=5,
                profile_steps=16)),
    "dry-run": dict(
        attention=dict(cases=[("bf16", [(1, 1, 16, 64)]), ("fp32", [(1, 1, 16, 64)])],
                       methods=None, repeats=dict(warmup=0, min_reps=1, max_reps=1)),
        rnn=dict(shapes=["tiny"], tanh_shapes=["tiny"], repeats=2),
        hf=dict(size=dict(layers=2, hidden=32, heads=2, ffn=64, vocab=100), lengths=[32],
                tokens=64, steps=1, warmup=1, contexts=[16, 32], new_tokens=4, repeats=1, profile_steps=2)),
}
SOURCE_DIRS = ["plugins", "hf_momentum", "benchmarks", "tests"]


def code_hash() -> str:
    """Of every .py file a part's result depends on: cached results of older code are not reused."""
    digest = hashlib.sha256()
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def env_worker(mode, device, budget_s):
    """The device line's facts, and two measured ceilings (a large copy and a large matmul)."""
    import torch
    info = dict(torch=torch.__version__, python=platform.python_version(),
                triton=_version("triton"), transformers=_version("transformers"), fla=_version("fla-core"))
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(name=torch.cuda.get_device_name(), capability=f"{props.major}.{props.minor}",
                    sms=props.multi_processor_count, memory_gib=props.total_memory / 2 ** 30,
                    cuda=torch.version.cuda)
    else:
        info.update(name="CPU", cpu=platform.processor() or platform.machine(), cores=os.cpu_count())
    info["ceilings"] = ceilings(device, mode)
    return dict(status="ok", info=info)


def _version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def ceilings(device, mode):
    """Copy bandwidth (bytes read + written) and bf16 / fp32 matmul rates, medians after warm-up."""
    import torch
    from timing import median_ms
    n_copy, n_mm = (2 ** 28, 8192) if mode == "full" else (2 ** 20, 256)
    src = torch.randn(n_copy, device=device)
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), device)
    out = {"copy_tb_s": 2 * src.numel() * 4 / copy_ms / 1e9}
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        a, b = (torch.randn(n_mm, n_mm, device=device, dtype=dtype) for _ in range(2))
        out[f"matmul_{name}_tflop_s"] = 2 * n_mm ** 3 / median_ms(lambda: a @ b, device) / 1e9
    return out


def tests_worker(mode, device, budget_s, result_path, only=None):
    """pytest -m gpu over the files holding gpu-marked tests, or over the node ids listed in the
    file `only` (the tests an earlier pass did not start); counts, failures and the node ids of the
    tests not started from JUnit XML and pytest_budget."""
    files = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").glob("test_*.py"))
             if "mark.gpu" in p.read_text()]
    if importlib.util.find_spec("pytest") is None:
        return dict(status="skipped", markdown="Skipped: pytest is not installed.")
    import pytest
    xml = Path(str(result_path) + ".junit.xml")
    xml.unlink(missing_ok=True)
    not_started = Path(str(result_path) + ".not-started")
    not_started.unlink(missing_ok=True)
    # pytest_budget skips the tests not started by the deadline; xdist workers inherit the environment
    start_margin = TEST_START_S if mode == "full" else 30
    os.environ["GPU_CHECK_DEADLINE"] = str(time.time() + budget_s - start_margin)
    os.environ["GPU_CHECK_NOT_STARTED"] = str(not_started)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    # Triton's autotuner keeps each tuning key's timings on disk, read by every worker that meets the
    # key later: it compiles the chosen config alone instead of every kept one (tests check numerics,
    # not speed; 13 tests did not start on an H200, 2026-11-28). This process only: the benchmark
    # parts tune for themselves, on an idle GPU.
    os.environ["TRITON_CACHE_AUTOTUNING"] = "1"
    targets = json.loads(Path(only).read_text()) if only else files
    args = ["-m", "gpu", "-q", "-p", "no:cacheprovider", "-p", "pytest_budget", f"--junitxml={xml}", *targets]
    if importlib.util.find_spec("pytest_timeout"):
        args.append(f"--timeout={TEST_TIMEOUT_S}")
    if mode == "full" and importlib.util.find_spec("xdist"):
        args += ["-n", str(xdist_workers(os.cpu_count() or 1, len(targets) if only else None))]
    code = pytest.main(args)                     # in this process: the orchestrator's timeout applies
    if not xml.exists():
        return dict(status="error", markdown=f"pytest exited with code {code} and wrote no report "
                    "(its output is in outputs/gpu-check/tests.log).")
    counts, failures = junit_summary(xml)
    waiting = sorted(set(not_started.read_text().split("\n")) - {""}) if not_started.exists() else []
    what = f"{len(targets)} test{'s' * (len(targets) != 1)}" if only else f"`pytest -m gpu {' '.join(files)}`"
    head = f"{what}: {pass_summary(counts, f'in the {budget_s:.0f} s budget')}."
    return dict(status="ok", counts=counts, failures=failures, not_started=waiting, lines=[head],
                markdown=tests_markdown([head], failures))


def xdist_workers(cores, tests=None):
    """Triton compiles every kernel × tile config × dtype × head size the tests meet, one at a time
    per process: workers compile in parallel (the GPU holds their small tensors easily), one per
    core but two left for the orchestrator and the driver, up to 14, and no more than `tests`
    where only those run."""
    return max(1, min(14, cores - 2, tests or 14))


def pass_summary(counts, budget):
    return (f"{counts['passed']} passed, {counts['failed']} failed, {counts['errors']} errors, "
            f"{counts['skipped']} skipped ({counts['seconds']:.0f} s)"
            + (f", of which {counts['budget']} not started {budget}" if counts["budget"] else ""))


def tests_markdown(lines, failures):
    return "\n".join(lines + [f"- FAILED `{name}`: {message}" for name, message in failures])


def merge_tests(first, rest, why):
    """The tests part once the tests `first` did not start have had a pass of their own (`rest`,
    run `why`): the counts of both, the failures of both, and what is still not started."""
    seconds = first.get("seconds", 0.0) + rest.get("seconds", 0.0)
    if rest.get("status") != "ok":
        line = (f"- The {len(first['not_started'])} tests not started, run {why}: {rest['status']}; "
                "they are still to run.")
        lines = first["lines"] + [line]
        return dict(first, lines=lines, seconds=seconds, markdown=tests_markdown(lines, first["failures"])
                    + "\n\n" + rest.get("markdown", ""))
    a, b = first["counts"], rest["counts"]
    counts = {name: a[name] + b[name] for name in ("passed", "failed", "errors", "seconds")}
    counts.update(tests=a["tests"], budget=b["budget"], skipped=a["skipped"] - a["budget"] + b["skipped"])
    lines = first["lines"] + [f"- The {len(first['not_started'])} not started, run {why}: {rest['lines'][0]}",
                              f"- In all: {pass_summary(counts, 'yet')}."]
    failures = first["failures"] + rest["failures"]
    return dict(first, counts=counts, failures=failures, not_started=rest["not_started"], lines=lines,
                seconds=seconds, markdown=tests_markdown(lines, failures))


def junit_summary(path):
    from pytest_budget import REASON
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = dict(tests=0, failed=0, errors=0, skipped=0, seconds=0.0, budget=0)
    failures = []
    for suite in suites:
        counts["tests"] += int(suite.get("tests", 0))
        counts["failed"] += int(suite.get("failures", 0))
        counts["errors"] += int(suite.get("errors", 0))
        counts["skipped"] += int(suite.get("skipped", 0))
        counts["seconds"] += float(suite.get("time", 0.0))
        for case in suite.iter("testcase"):
            counts["budget"] += sum(REASON in (skip.get("message") or "")
                                    for skip in case.findall("skipped"))
            for bad in list(case.findall("failure")) + list(case.findall("error")):
                message = (bad.get("message") or "").splitlines()[0][:200] if bad.get("message") else ""
                failures.append((f"{case.get('classname')}::{case.get('name')}", message))
    counts["passed"] = counts["tests"] - counts["failed"] - counts["errors"] - counts["skipped"]
    return counts, failures


def attention_worker(mode, device, budget_s):
    import gpu_attention as bench
    sizes = SIZES[mode]["attention"]
    methods = sizes["methods"] or bench.METHODS
    if os.environ.get("GPU_CHECK_FLA") == "1" and "fla linear" not in methods:
        methods = methods[:2] + ["fla linear"] + methods[2:]
    notes = [f"{name}: not run, {reason}." for name in methods
             if (reason := bench.unavailable(name, device))]
    left_out = [m for m in bench.METHODS if m not in methods]
    if left_out:
        notes.append("Not run here: " + ", ".join(left_out) + " (the torch paths are the tests' references, "
                     "and `python benchmarks/gpu_attention.py` times them; fla runs with `--fla`).")
    start, rows = time.monotonic(), []
    for dtype, shapes in sizes["cases"]:
        left = budget_s - CASE_MARGIN_S - (time.monotonic() - start)
        rows += bench.run_cases(shapes, [dtype], methods, device, budget_s=left, log=bench.log_row,
                                repeats=sizes.get("repeats"))
    errors = {}                                    # one line per distinct error, with the cases it hit
    for r in rows:
        if r["status"] == "error":
            errors.setdefault(r["error"], []).append(
                f"{r['method']} {r['dtype']} T={r['T']} {'fwd+bwd' if r['backward'] else 'fwd'}")
    header = (f"B-H-D-T as listed (D 64; B·T = 16k tokens, 32k at T = 32k), β = {bench.BETA}, chunk "
              f"{bench.CHUNK}; median of CUDA-event-timed runs after warm-up runs (Triton autotuning and "
              "compilation happen there); peak MiB above the inputs. × SDPA / × fla: time over theirs in "
              "the same case. Roofline columns: benchmarks/roofline.py (ideal bytes: read q, k, v and write "
              "out, plus read q, k, v, d_out and write the three gradients for fwd+bwd; flops of eq. 13's "
              "chunked form, SDPA's causal half).")
    if mode == "dry-run":
        header = "Tiny shapes on the CPU (Triton through its interpreter): checks the plumbing, not speed."
    parts = [header] + notes + ([f"Cases not started within the {budget_s:.0f} s budget are marked `budget`."]
                                if any(r["status"] == "budget" for r in rows) else [])
    markdown = "\n\n".join(parts) + "\n\n" + bench.markdown(rows, bench.device_name(device))
    if errors:
        markdown += "\n\nErrors:\n" + "\n".join(_error_line(error, cases) for error, cases in errors.items())
    return dict(status="ok", rows=rows, markdown=markdown)


def _error_line(error, cases):
    more = " …" if len(cases) > 4 else ""
    return f"- {', '.join(cases[:4])}{more} ({len(cases)} cases): `{error}`"


def rnn_worker(mode, device, budget_s):
    import rnn
    sizes = SIZES[mode]["rnn"]
    start, results, tanh, skipped = time.monotonic(), [], [], []
    # the LSTM rows first (issue 27's goals), then the tanh RNN's where time is left
    for shapes, rows, variants, label in (
            (sizes["shapes"], results, rnn.GPU_CHECK_VARIANTS, "{}"),
            (sizes["tanh_shapes"], tanh, rnn.GPU_CHECK_TANH_VARIANTS, "{} (tanh)")):
        for shape in shapes:
            if time.monotonic() - start > budget_s - CASE_MARGIN_S:
                skipped.append(label.format(shape))
                continue
            rows += rnn.cuda_times(shape, sizes["repeats"], 1, device, variants=variants)
    header = (f"float32 forward + backward; median of {sizes['repeats']} round-robin rounds after a warm-up "
              "round (CUDA events), the Appendix-F loop timed in one round; peak = "
              "torch.cuda.max_memory_allocated during one forward+backward. nn.LSTM is cuDNN, which "
              "takes TF32 for float32 by torch's default, where float32 matmuls (and the Adam/RMSProp "
              "recurrences) stay exact: a column compares with cuDNN without TF32. \"one call per layer\" "
              "is nn.LSTM called as the momentum cells call cuDNN. \"drive first\": the Adam/RMSProp "
              "layers on cuDNN's LSTM after eq. 15's drive of every step (identity input weight, cuDNN's "
              "TF32). Device busy: one forward+backward's "
              "kernel and copy time (torch.profiler) over the median wall time; far below 100 %, the "
              "host bounds the variant.")
    if mode == "dry-run":
        header = "Tiny shape (T 12, B 2, input 3, hidden 8, 2 layers) on the CPU: checks the plumbing."
    if skipped:
        header += f" Not started within the {budget_s:.0f} s budget: {', '.join(skipped)}."
    markdown = header + "\n\n" + rnn.table(results, unit="ms")
    if tanh:
        markdown += ("\n\nThe tanh MomentumRNN's Adam/RMSProp layers against nn.RNN, \"drive first\" "
                     "(eq. 15's drive of every step, then torch's fused tanh-RNN kernel; their default, a "
                     "step loop, is `benchmarks/rnn.py --device cuda --tanh`).\n\n"
                     + rnn.table(tanh, unit="ms"))
    return dict(status="ok", rows=results, tanh_rows=tanh, markdown=markdown)


def hf_worker(mode, device, budget_s):
    import hf_speed
    return hf_speed.run(SIZES[mode]["hf"], mode, device, budget_s - CASE_MARGIN_S)


WORKERS = {"attention": attention_worker, "rnn": rnn_worker, "hf": hf_worker}


def worker_main(part, mode, device, budget_s, result_path, only=None):
    started = time.monotonic()
    if part == "env":
        result = env_worker(mode, device, budget_s)
    elif part == "tests":
        result = tests_worker(mode, device, budget_s, result_path, only)
    else:
        result = WORKERS[part](mode, device, budget_s)
    result["seconds"] = time.monotonic() - started
    Path(result_path).write_text(json.dumps(result, indent=1, default=str))


def run_part(part, mode, device, out_dir, budget_s, only=None):
    """Runs `part` in a fresh process (a CUDA fault or a hang there leaves the others running);
    `only`: a file listing the node ids the tests part runs instead of every gpu test."""
    name = part if only is None else f"{part}-rest"
    result_path = out_dir / f"{name}.run.json"
    result_path.unlink(missing_ok=True)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
    if device == "cpu":
        # the Triton methods run through the interpreter; one thread, since the dry run shares the
        # machine (several threads on busy cores stall at every hand-off)
        env.update(TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", part, "--mode", mode,
           "--device", device, "--budget", str(budget_s), "--result", str(result_path)]
    if only is not None:
        cmd += ["--only", str(only)]
    started = time.monotonic()
    returncode, log = run_group(cmd, env, budget_s + GRACE_S)
    if returncode is None:
        killed = f"Killed after {budget_s + GRACE_S} s (budget {budget_s} s); the end of its output:"
        result = dict(status="timeout", markdown=killed + "\n\n```\n" + log[-1500:] + "\n```")
    elif result_path.exists():
        result = json.loads(result_path.read_text())
    else:
        result = dict(status="error", markdown=f"The worker exited with code {returncode}:\n\n```\n"
                      + log[-3000:] + "\n```")
    return _finish(result, log, started, out_dir, name)


def run_rest(first, mode, device, out_dir, budget_s, why):
    """`first` (the tests part's result) after a pass, of at most `budget_s`, over the tests it did
    not start."""
    only = out_dir / "tests.not-started.json"
    only.write_text(json.dumps(first["not_started"]))
    print(f"gpu-check: tests: the {len(first['not_started'])} not started, {why} (budget {budget_s:.0f} s)",
          flush=True)
    return merge_tests(first, run_part("tests", mode, device, out_dir, budget_s, only=only), why)


def rest_budget(limit_s, elapsed_s):
    """What is left of the whole run's `limit_s` for the tests not started, or None where too little
    is left to start one (pytest_budget starts none in the last TEST_START_S)."""
    left = limit_s - elapsed_s
    return left if left >= REST_MIN_S else None


def run_group(cmd, env, timeout_s):
    """(exit code, or None when killed at the timeout; output). The worker leads its own process
    group, so a timeout or Ctrl-C also ends what it started (pytest-xdist's workers)."""
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        try:
            log, _ = proc.communicate(timeout=timeout_s)
            return proc.returncode, log
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return None, proc.communicate()[0]
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            raise


def _finish(result, log, started, out_dir, part):
    result.setdefault("seconds", time.monotonic() - started)
    (out_dir / f"{part}.log").write_text(log)
    return result


def device_line(info, mode):
    versions = (f"torch {info['torch']}" + (f" (CUDA {info['cuda']})" if info.get("cuda") else "")
                + f", triton {info['triton'] or 'not installed'}, transformers "
                f"{info['transformers'] or 'not installed'}, fla-core {info['fla'] or 'not installed'}, "
                f"Python {info['python']}")
    if info["name"] == "CPU":
        return f"- Device: CPU ({info['cpu']}, {info['cores']} cores), no CUDA; {versions}."
    return (f"- Device: {info['name']}, compute capability {info['capability']}, {info['sms']} SMs, "
            f"{info['memory_gib']:.1f} GiB; {versions}.")


def ceilings_line(ceil, mode):
    size = "1 GiB copy, 8192³ matmuls" if mode == "full" else "4 MiB copy, 256³ matmuls"
    return (f"- Measured ceilings ({size}, medians): copy {ceil['copy_tb_s'] * 1e3:.4g} GB/s (bytes read + "
            f"written), bf16 matmul {ceil['matmul_bf16_tflop_s']:.4g} TFLOP/s, fp32 matmul "
            f"{ceil['matmul_fp32_tflop_s']:.4g} TFLOP/s.")


def section(info, results, mode, cached, marker):
    title = (f"## GPU check, {date.today()}: {info['name']}" if mode == "full" else
             f"## GPU check dry run, {date.today()}: CPU, tiny sizes (GPU speed unmeasured)")
    total = sum(r.get("seconds", 0.0) for r in results.values())
    lines = [f"<!-- gpu-check: {marker} -->", title, "", device_line(info, mode),
             ceilings_line(info["ceilings"], mode),
             f"- Command: `make gpu-check` (benchmarks/gpu_check.py, mode {mode}); parts took {total:.0f} s"
             + (f" (from earlier runs of the same code: {', '.join(cached)})" if cached else "") + "."]
    lines.append(plan_line())
    if mode == "dry-run":
        lines.append("- A dry run on the CPU: every part at tiny sizes, to check the orchestration. "
                     "**GPU speed unmeasured.**")
    lines += ["", f"### {GOALS_TITLE}", "", goals.markdown(results, device_limits(info["name"]))]
    for part, result in results.items():
        lines += ["", f"### {TITLES[part]}", "",
                  f"Status: {result['status']} ({result.get('seconds', 0.0):.0f} s).", "", result["markdown"]]
    lines.append("<!-- /gpu-check -->")
    return "\n".join(lines) + "\n"


def plan_seconds(budgets=None):
    """The full run's longest wall time while no part hangs: the ceilings, then each part's budget."""
    return ENV_S + sum((budgets or BUDGET_S).values())


def plan_line():
    parts = " + ".join(f"{part} {BUDGET_S[part]}" for part in PARTS)
    fits = "within" if plan_seconds() <= LIMIT_S else "OVER"
    return (f"- Plan of the full run (on the GPU): ceilings {ENV_S} + {parts} = {plan_seconds()} s, {fits} "
            f"the {LIMIT_S} s of one command (issue 27); a hung part is killed {GRACE_S} s after its budget.")


def write_section(doc, text, marker):
    """Replaces the section with the same marker (date, device, mode), else appends one."""
    old = doc.read_text() if doc.exists() else ""
    begin = old.find(f"<!-- gpu-check: {marker} -->")
    if begin >= 0:
        end = old.index("<!-- /gpu-check -->", begin) + len("<!-- /gpu-check -->\n")
        new = old[:begin] + text + old[end:]
    else:
        new = old.rstrip("\n") + ("\n\n" if old else "") + text
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(new)


def load_cached(path, key):
    if not path.exists():
        return None
    cached = json.loads(path.read_text())
    return cached if cached.get("status") == "ok" and cached.get("key") == key else None


def install_carried_wheels(folder=ROOT / ".whl", target=Path("/tmp/gpu-check-site")):
    """A lent GPU machine has no network and its own packages (transformers 5.17 on 2026-11-27,
    below setup.cfg's floor): wheels carried in .whl (README of the device tool) are installed into
    `target`, which goes first on every part's PYTHONPATH. Returns the wheels' names."""
    wheels = sorted(str(path) for path in folder.glob("*.whl")) if folder.is_dir() else []
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target), *wheels],
                       check=True)
        paths = [str(target), os.environ.get("PYTHONPATH")]
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    return [Path(wheel).name for wheel in wheels]


def orchestrate(args):
    started = time.monotonic()
    mode = "dry-run" if args.dry_run or args.device == "cpu" else "full"
    device = "cpu" if mode == "dry-run" else "cuda"
    if mode == "full":
        carried = install_carried_wheels()
        if carried:
            print(f"gpu-check: installed the carried wheels {', '.join(carried)}", flush=True)
    default_dir = ROOT / "outputs" / ("gpu-check" if mode == "full" else "gpu-check-dry-run")
    out_dir = Path(args.out_dir or default_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = run_part("env", mode, device, out_dir, 120)
    if env["status"] != "ok":
        sys.exit(f"gpu-check: could not read the device ({env['status']}):\n{env['markdown']}")
    info = env["info"]
    key = dict(mode=mode, device=info["name"], code=code_hash(), fla=args.fla)
    if args.fla:
        os.environ["GPU_CHECK_FLA"] = "1"                  # read by the attention worker
    results, cached = {}, []
    for part in args.parts:
        path = out_dir / f"{part}.json"
        result = None if args.force else load_cached(path, key)
        default = FLA_BUDGET_S if part == "attention" and args.fla else BUDGET_S[part]
        budget = args.budgets.get(part, default) if mode == "full" else 120
        if result is not None and result.get("not_started"):
            result = dict(run_rest(result, mode, device, out_dir, budget, "resuming an earlier call's run"),
                          key=key)
            path.write_text(json.dumps(result, indent=1, default=str))
            result["earlier"] = True                       # not timed within this one command
        elif result is not None:
            print(f"gpu-check: {part}: cached ({path}; --force runs it again)", flush=True)
            cached.append(part)
            result["earlier"] = True
        else:
            print(f"gpu-check: {part}: running (budget {budget} s)", flush=True)
            result = dict(run_part(part, mode, device, out_dir, budget), key=key)
            path.write_text(json.dumps(result, indent=1, default=str))
            print(f"gpu-check: {part}: {result['status']} in {result['seconds']:.0f} s", flush=True)
        results[part] = result
    tests = results.get("tests", {})
    budget = rest_budget(args.limit, time.monotonic() - started) if tests.get("not_started") else None
    if budget is not None:
        results["tests"] = dict(run_rest(tests, mode, device, out_dir, budget,
                                         "in the time the other parts left"), key=key)
        (out_dir / "tests.json").write_text(json.dumps(results["tests"], indent=1, default=str))
    doc = Path(args.doc) if args.doc else (ROOT / "docs" / "benchmarks.md" if mode == "full"
                                           else out_dir / "section.md")
    marker = f"{date.today()} | {info['name']} | {mode}"
    write_section(doc, section(info, results, mode, cached, marker), marker)
    print(f"gpu-check: wrote the section to {doc}")
    tests_failed = results.get("tests", {}).get("counts", {})
    broken = tests_failed.get("failed", 0) + tests_failed.get("errors", 0)
    return 0 if broken == 0 and all(r["status"] in ("ok", "skipped") for r in results.values()) else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (as --device cpu)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS)
    parser.add_argument("--force", action="store_true", help="run the parts again even if cached")
    parser.add_argument("--fla", action="store_true",
                        help=f"time fla's chunk_linear_attn too (attention budget {FLA_BUDGET_S} s)")
    parser.add_argument("--budgets", nargs="+", default=[], metavar="PART=SECONDS",
                        help="override a part's time budget (default: "
                             + ", ".join(f"{p}={s}" for p, s in BUDGET_S.items()) + ")")
    parser.add_argument("--out-dir", help="cache and logs (default: outputs/gpu-check, dry run: "
                                          "outputs/gpu-check-dry-run)")
    parser.add_argument("--doc", help="where the section goes (default: docs/benchmarks.md; dry run: "
                                      "OUT_DIR/section.md)")
    parser.add_argument("--limit", type=int, default=LIMIT_S,
                        help=f"the whole run's seconds (default {LIMIT_S}): tests that the tests part did "
                             "not start run after the other parts in what is left of it")
    parser.add_argument("--worker", choices=["env"] + PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--only", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.budgets = parse_budgets(parser, args.budgets)
    if args.worker:
        worker_main(args.worker, args.mode, args.device, args.budget, args.result, args.only)
        return 0
    if args.device == "cuda" and not args.dry_run and not cuda_present():
        sys.exit("gpu-check: torch sees no CUDA device here; `--device cpu` runs the tiny dry run")
    return orchestrate(args)


def parse_budgets(parser, items):
    budgets = {}
    for item in items:
        part, _, seconds = item.partition("=")
        if part not in PARTS or not seconds.isdigit() or int(seconds) < 60:
            parser.error(f"--budgets: {item!r} is not PART=SECONDS with PART in {PARTS} and SECONDS >= 60")
        budgets[part] = int(seconds)
    return budgets


def cuda_present():
    """Asked in a child process, so that this one never holds a CUDA context while the parts run."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True)
    return probe.stdout.strip() == "True"


if __name__ == "__main__":
    sys.exit(main())
