"""`make gpu-check` without a GPU: the dry run drives every part on the CPU at tiny sizes and
writes one section (to a temporary file here), a second run reuses the finished parts; and the
roofline's counts agree with what the code does."""
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from plugins.attention.chunk import chunk_causal_momentum_attention
from plugins.attention.rule import momentum_rule

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import goals  # noqa: E402
import roofline  # noqa: E402

CHECK = ROOT / "benchmarks" / "gpu_check.py"
TITLES = ["### Tests (`pytest -m gpu`)", "### Causal attention: ours (Triton, torch) vs SDPA and fla",
          "### HF end to end: training and generation tokens/s", "### MomentumRNN vs cuDNN nn.LSTM"]


def dry_run(out_dir, doc, *extra, env=None):
    proc = subprocess.run([sys.executable, str(CHECK), "--device", "cpu", "--out-dir", str(out_dir),
                           "--doc", str(doc), *extra], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """One dry run of every part into a document that already has content."""
    tmp = tmp_path_factory.mktemp("gpu-check")
    doc = tmp / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nearlier results\n")
    return tmp / "out", doc, dry_run(tmp / "out", doc)


def test_dry_run_writes_one_section_with_every_part_and_resumes(first_run):
    out_dir, doc, first = first_run
    assert first.count(": running") == 4 and ": cached (" not in first
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nearlier results\n")
    assert text.count("<!-- gpu-check:") == 1 and text.count("<!-- /gpu-check -->") == 1
    assert "\n- Device: CPU (" in text and "torch " + torch.__version__ in text
    assert "GPU speed unmeasured" in text
    positions = [text.index(title) for title in ["### Issue 27's goals, as measured"] + TITLES]
    assert positions == sorted(positions)
    table = text[positions[0]:positions[1]]                     # tiny sizes on the CPU: no goal measured
    assert table.count("| not measured |") == len(goals.GOALS) and "| yes |" not in table
    assert "| no |" not in table
    assert text.count("Status: ok") == 4
    assert " 0 failed, 0 errors, " in text and " skipped (" in text      # gpu tests collected, skipped here
    for method in ("| momentum torch | fwd+bwd |", "| linear torch | fwd |", "| sdpa | fwd+bwd |"):
        assert method in text
    assert "| ideal MB | GFLOP | GB/s (% of BW) | TFLOP/s (% of peak) | % of floor (bound) |" in text
    assert "unknown device" in text
    assert "| tiny | torch nn.LSTM |" in text and "| tiny | adam |" in text
    for cell in ("adam", "rmsprop"):
        assert f"| tiny | {cell}, one launch per step |" in text
        assert f"| tiny | tanh {cell}, drive first, fused RNN kernel |" in text    # the tanh RNN's own table
    assert "| shape | variant | fwd+bwd (ms) | × nn.RNN |" in text
    assert "momentum / Llama" in text and "| 16 |" in text
    assert "| momentum, static cache + torch.compile(backend='aot_eager') tok/s |" in text
    for context in (16, 32):                       # eager, compiled (fullgraph) and Llama each gave a rate
        assert re.search(rf"\n\| {context} \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|\n", text)
    for context in (16, 32):                       # the decode profile, at both dry-run contexts
        assert f"Context {context}: " in text
    assert "Ops at context 32 whose name and input shapes do not occur at 16 (" in text
    assert "| calls/step | host µs/step | device µs/step |" in text and "| `aten::" in text
    assert "Where a training step goes at T = 32 (batch 2;" in text      # both models, ops by host time
    for name in ("momentum", "llama"):
        summary = rf"\n{name}: [\d.]+ ms/step; device busy 0.00 ms in 0 kernels; ops' host time [\d.]+ ms\."
        table = r"\| op \| calls \| host µs \| share of host time \|\n\|---\|---:\|---:\|---:\|\n\| `"
        assert re.search(summary + r"\n\n" + table, text)
    assert "within the 480 s of one command" in text

    second = dry_run(out_dir, doc)
    assert second.count(": cached (") == 4 and ": running" not in second
    again = doc.read_text()
    assert again.count("<!-- gpu-check:") == 1                    # replaced, not appended
    assert "from earlier runs of the same code: tests, attention, hf, rnn" in again
    assert "| not measured (from earlier calls: tests, attention, hf, rnn) | not measured |" in again


def test_force_reruns_a_cached_part(first_run, tmp_path):
    out_dir, _, _ = first_run
    out = dry_run(out_dir, tmp_path / "a.md", "--parts", "rnn", "--force")
    assert "gpu-check: rnn: running" in out and ": cached (" not in out
    text = (tmp_path / "a.md").read_text()
    assert text.count("\n### ") == 2 and "\n### MomentumRNN vs cuDNN nn.LSTM" in text


def test_fla_is_opt_in_and_named_when_it_cannot_run(first_run, tmp_path):
    _, doc, _ = first_run
    assert "fla runs with `--fla`" not in doc.read_text()          # the dry run times every method
    out = tmp_path / "fla.md"
    dry_run(tmp_path / "out", out, "--parts", "attention", "--fla")
    text = out.read_text()
    if importlib.util.find_spec("fla") is None:
        assert "fla linear: not run, fla-core is not installed" in text
    else:
        assert "| fla linear | fwd+bwd |" in text


def test_a_part_whose_import_fails_is_skipped_with_the_reason(tmp_path):
    fake = tmp_path / "site" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('transformers hidden by the test')\n")
    dry_run(tmp_path / "out", tmp_path / "a.md", "--parts", "hf",
            env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    text = (tmp_path / "a.md").read_text()
    assert "Status: skipped" in text and "Skipped: ImportError: transformers hidden by the test" in text


def test_carried_wheels_are_installed_first_on_the_parts_path(tmp_path, monkeypatch):
    """What the device tool's README says to carry (.whl) is installed, and put before the
    machine's own packages (its transformers is older than setup.cfg's floor)."""
    import zipfile

    import gpu_check
    folder = tmp_path / ".whl"
    folder.mkdir()
    info = "carried_probe-1.0.dist-info"
    with zipfile.ZipFile(folder / "carried_probe-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("carried_probe/__init__.py", "VERSION = 'carried'\n")
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: carried-probe\nVersion: 1.0\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    target = tmp_path / "site"
    assert gpu_check.install_carried_wheels(folder, target) == ["carried_probe-1.0-py3-none-any.whl"]
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(target), "/elsewhere"]
    probe = subprocess.run([sys.executable, "-c", "import carried_probe; print(carried_probe.VERSION)"],
                           env={**os.environ}, capture_output=True, text=True)
    assert probe.stdout.strip() == "carried", probe.stderr
    assert gpu_check.install_carried_wheels(tmp_path / "none", target) == []


def count_flops(fn, *args):
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


@pytest.mark.parametrize("momentum", [0.0, 0.6])
@pytest.mark.parametrize("T,C", [(256, 64), (192, 32)])
def test_chunked_flops_formula_counts_the_torch_path(momentum, T, C, make_generator):
    """The formula of roofline.attention_flops equals the matmul flops the PyTorch chunked path
    does, forward and forward+backward (every product's two gradients)."""
    B, H, D = 2, 3, 16
    gen = make_generator()
    fq, fk, v = (torch.rand(B, H, T, D, generator=gen, requires_grad=True) for _ in range(3))

    def forward():
        return chunk_causal_momentum_attention(fq, fk, v, rule=momentum_rule(momentum, 1.0), eps=1e-6,
                                               chunk_size=C)[0]

    def forward_backward():
        forward().sum().backward()

    method = "momentum" if momentum else "linear"
    assert count_flops(forward) == roofline.attention_flops(method, B, H, T, D, D, C, backward=False)
    assert count_flops(forward_backward) == roofline.attention_flops(method, B, H, T, D, D, C, backward=True)


def test_softmax_flops_are_the_causal_half_of_the_two_products(make_generator):
    B, H, T, D = 1, 2, 128, 32
    q, k, v = (torch.randn(B, H, T, D, generator=make_generator()) for _ in range(3))
    full = count_flops(lambda: torch.softmax(q @ k.transpose(-1, -2), -1) @ v)
    assert 2 * roofline.attention_flops("sdpa", B, H, T, D, D, 64, backward=False) == full


def test_ideal_bytes_are_the_tensors_read_and_written():
    B, H, T, D = 2, 3, 50, 16
    one = torch.empty(B, H, T, D, dtype=torch.bfloat16).nbytes
    assert roofline.attention_bytes("sdpa", B, H, T, D, D, "bf16", backward=False) == 4 * one   # q k v out
    assert roofline.attention_bytes("momentum", B, H, T, D, D, "bf16", backward=True) == 11 * one
    assert roofline.attention_bytes("linear", B, H, T, D, D, "fp32", backward=False) == 8 * one


@pytest.mark.parametrize("name,label,tb_s", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 3.35), ("NVIDIA H100 PCIe", "H100 PCIe", 2.0),
    ("NVIDIA H100 NVL", "H100 NVL", 3.9), ("NVIDIA H200", "H200 SXM", 4.8),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 2.039), ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1.935),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB", 1.555)])
def test_known_devices_by_name(name, label, tb_s):
    limits = roofline.device_limits(name)
    assert limits.label == label and limits.tb_s == tb_s
    assert limits.tflops("bf16") > limits.tflops("fp32")


@pytest.mark.parametrize("name", ["CPU", "NVIDIA GeForce RTX 4090", "", None])
def test_unknown_devices_get_no_fractions(name):
    assert roofline.device_limits(name) is None
    cells = roofline.Roofline(bytes=10 ** 9, flops=10 ** 9, ms=2.0, limits=None, dtype="bf16").cells()
    assert cells[-1] == "—" and not any("%" in c for c in cells)
    assert cells[2] == "500" and cells[3] == "0.5"                       # GB/s and TFLOP/s still shown


def test_a_case_at_its_floor_reads_100_percent_of_the_bound():
    h100 = roofline.device_limits("NVIDIA H100 80GB HBM3")
    memory = roofline.Roofline(bytes=3 * 10 ** 9, flops=10 ** 9, ms=0.0, limits=h100, dtype="bf16")
    memory = roofline.Roofline(**{**memory.__dict__, "ms": memory.floor_ms()})
    assert memory.cells()[-1] == "100% (memory)" and memory.cells()[2].endswith("(100%)")
    compute = roofline.Roofline(bytes=10 ** 6, flops=10 ** 15, ms=0.0, limits=h100, dtype="fp32")
    compute = roofline.Roofline(**{**compute.__dict__, "ms": 2 * compute.floor_ms()})
    assert compute.cells()[-1] == "50% (compute)" and compute.cells()[3].endswith("(50%)")


def test_attention_table_marks_failed_cases_and_gives_fractions_on_a_known_device():
    import gpu_attention

    def row(method, status="ok", ms=None, backward=True):
        return dict(method=method, B=4, H=16, D=64, T=4096, dtype="bf16", backward=backward, ms=ms,
                    peak_mib=10.0 if ms else None, status=status)

    rows = [row("momentum triton", "error"), row("momentum torch", "OOM"), row("linear torch", "budget"),
            row("fla linear", ms=1.0), row("sdpa", ms=2.0), row("sdpa", ms=0.5, backward=False)]
    lines = gpu_attention.markdown(rows, "NVIDIA H100 80GB HBM3").splitlines()
    assert lines[0].startswith("roofline: H100 SXM published limits 3.35 TB/s")
    table = {line.split(" | ")[2] + " " + line.split(" | ")[3]: line.split(" | ") for line in lines[4:]}
    assert table["momentum triton fwd+bwd"][4:7] == ["error", "—", "—"]
    assert table["momentum torch fwd+bwd"][4] == "OOM" and table["linear torch fwd+bwd"][4] == "budget"
    assert table["fla linear fwd+bwd"][4:7] == ["1.000", "0.50", "1.00"]
    assert table["sdpa fwd"][5] == "1.00" and table["sdpa fwd"][6] == "—"       # no fla fwd case
    assert all("%" in cell for cell in table["sdpa fwd+bwd"][10:])       # GB/s, TFLOP/s, floor
    assert table["momentum triton fwd+bwd"][8:] == ["—"] * 4 + ["— |"]


def test_tests_part_stops_starting_tests_at_its_deadline_and_still_reports(tmp_path):
    """pytest_budget skips what has not started once GPU_CHECK_DEADLINE has passed; the JUnit
    report is written and counted (three trivial tests, a deadline long past)."""
    import gpu_check
    (tmp_path / "test_three.py").write_text("".join(f"def test_{i}():\n    pass\n" for i in range(3)))
    xml = tmp_path / "report.xml"
    record = tmp_path / "not-started"
    env = {**os.environ, "GPU_CHECK_DEADLINE": "0", "GPU_CHECK_NOT_STARTED": str(record),
           "PYTHONPATH": str(ROOT / "benchmarks")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_budget",
           f"--junitxml={xml}", "test_three.py"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts, failures = gpu_check.junit_summary(xml)
    assert counts["tests"] == counts["skipped"] == counts["budget"] == 3 and counts["passed"] == 0
    assert failures == []
    assert sorted(record.read_text().split()) == [f"test_three.py::test_{i}" for i in range(3)]


def test_the_tests_part_runs_only_the_node_ids_it_is_given(tmp_path):
    """The second pass over the tests not started runs those alone (here two gpu tests, skipped on
    a machine without CUDA, and none of the others)."""
    only = ["tests/test_rnn_device.py::test_plain_cell_weights_in_one_cudnn_buffer[MomentumLSTM-LSTM]",
            "tests/test_rnn_device.py::test_cuda_forward_backward_without_synchronisation[MomentumLSTM-adam]"]
    (tmp_path / "only.json").write_text(json.dumps(only))
    result = tmp_path / "tests.run.json"
    worker = ["--worker", "tests", "--mode", "dry-run", "--device", "cpu", "--budget", "120"]
    proc = subprocess.run([sys.executable, str(CHECK), *worker, "--result", str(result),
                           "--only", str(tmp_path / "only.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(result.read_text())
    assert report["counts"]["tests"] == report["counts"]["skipped"] == 2
    assert report["counts"]["budget"] == 0 and report["not_started"] == []
    assert report["lines"][0].startswith("2 tests: 0 passed, 0 failed, 0 errors, 2 skipped")


def test_xdist_workers_leave_two_cores_and_follow_the_tests_given():
    import gpu_check
    assert gpu_check.xdist_workers(16) == 14 and gpu_check.xdist_workers(64) == 14
    assert gpu_check.xdist_workers(8) == 6 and gpu_check.xdist_workers(2) == 1
    assert gpu_check.xdist_workers(16, tests=3) == 3 and gpu_check.xdist_workers(16, tests=40) == 14


def test_merged_passes_count_every_test_once():
    import gpu_check
    first = dict(status="ok", seconds=100.0, lines=["first pass"], failures=[["t.py::x", "bad"]],
                 not_started=["t.py::a", "t.py::b", "t.py::c"],
                 counts=dict(tests=10, passed=5, failed=1, errors=0, skipped=4, budget=3, seconds=90.0))
    rest = dict(status="ok", seconds=30.0, lines=["3 tests: …"], failures=[["t.py::b", "worse"]],
                not_started=["t.py::c"],
                counts=dict(tests=3, passed=1, failed=1, errors=0, skipped=1, budget=1, seconds=20.0))
    merged = gpu_check.merge_tests(first, rest, "later")
    counts = merged["counts"]
    assert (counts["passed"], counts["failed"], counts["skipped"], counts["budget"]) == (6, 2, 2, 1)
    assert counts["passed"] == counts["tests"] - counts["failed"] - counts["errors"] - counts["skipped"]
    assert merged["not_started"] == ["t.py::c"] and merged["seconds"] == 130.0
    assert "- The 3 not started, run later: 3 tests: …" in merged["markdown"]
    assert ("- In all: 6 passed, 2 failed, 0 errors, 2 skipped (110 s), of which 1 not started yet."
            in merged["markdown"])
    assert "FAILED `t.py::x`: bad" in merged["markdown"] and "FAILED `t.py::b`: worse" in merged["markdown"]
    broken = gpu_check.merge_tests(first, dict(status="timeout", markdown="killed", seconds=5.0), "later")
    assert broken["not_started"] == first["not_started"] and broken["counts"] == first["counts"]
    assert "timeout; they are still to run" in broken["markdown"] and "killed" in broken["markdown"]


def test_tests_not_started_run_in_the_time_left_and_a_later_call_resumes_them(tmp_path, monkeypatch):
    """The orchestrator (its parts stand-ins): the tests the tests part did not start run after the
    other parts when enough of --limit is left; else the next call of the same code runs them, and
    only them, before taking the finished parts from its cache."""
    import argparse

    import gpu_check
    calls = []

    def run_part(part, mode, device, out_dir, budget_s, only=None):
        calls.append((part, only and json.loads(Path(only).read_text())))
        if part == "env":
            ceilings = dict(copy_tb_s=1.0, matmul_bf16_tflop_s=1.0, matmul_fp32_tflop_s=1.0)
            return dict(status="ok", seconds=1.0, info=dict(
                name="CPU", cpu="x86_64", cores=2, torch="t", python="p", triton=None, transformers=None,
                fla=None, ceilings=ceilings))
        if part == "tests" and only is None:
            return dict(status="ok", seconds=50.0, lines=["first pass"], failures=[], not_started=["t.py::a"],
                        markdown="first pass",
                        counts=dict(tests=3, passed=2, failed=0, errors=0, skipped=1, budget=1, seconds=40.0))
        if part == "tests":
            return dict(status="ok", seconds=5.0, lines=["1 test: 0 passed, 1 failed"],
                        failures=[["t.py::a", "boom"]], not_started=[], markdown="",
                        counts=dict(tests=1, passed=0, failed=1, errors=0, skipped=0, budget=0, seconds=4.0))
        return dict(status="ok", seconds=1.0, markdown=f"{part} done")

    monkeypatch.setattr(gpu_check, "run_part", run_part)
    doc = tmp_path / "doc.md"
    args = argparse.Namespace(dry_run=True, device="cpu", out_dir=str(tmp_path), doc=str(doc), force=False,
                              parts=gpu_check.PARTS, budgets={}, fla=False, limit=gpu_check.LIMIT_S)
    assert gpu_check.orchestrate(args) == 1                        # the second pass has a failure
    assert calls[-1] == ("tests", ["t.py::a"]) and len(calls) == 6
    assert "- The 1 not started, run in the time the other parts left: 1 test:" in doc.read_text()
    assert "FAILED `t.py::a`: boom" in doc.read_text()

    calls.clear()
    args.force, args.limit = True, gpu_check.REST_MIN_S - 1          # no time left for a second pass
    assert gpu_check.orchestrate(args) == 0
    assert [part for part, only in calls] == ["env"] + gpu_check.PARTS and "- The 1" not in doc.read_text()
    calls.clear()
    args.force = False
    assert gpu_check.orchestrate(args) == 1
    assert calls == [("env", None), ("tests", ["t.py::a"])]          # resumed; the other parts cached
    assert "- The 1 not started, run resuming an earlier call's run: 1 test:" in doc.read_text()
    calls.clear()
    assert gpu_check.orchestrate(args) == 1 and calls == [("env", None)]       # nothing left to run


def test_a_timed_out_part_is_killed_with_the_processes_it_started():
    """run_group ends the worker's whole process group (pytest-xdist's workers would otherwise keep
    the GPU busy) and returns what it printed."""
    import gpu_check
    child = "import time; time.sleep(60)"
    worker = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
              "print(p.pid, flush=True); time.sleep(60)")
    start = time.monotonic()
    code, log = gpu_check.run_group([sys.executable, "-c", worker], dict(os.environ), timeout_s=5)
    assert code is None
    assert time.monotonic() - start < 40          # a surviving grandchild would hold the pipe for 60 s
    grandchild = int(log.split()[0])
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild)


def alive(pid):
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state


def test_the_full_plan_fits_one_eight_minute_command():
    """Issue 27: the GPU run is one command of at most 8 minutes; the plan is each part's budget
    (a part stops starting work before its budget ends) plus the ceilings' measurement."""
    import gpu_check
    assert gpu_check.PARTS[0] == "tests" and gpu_check.PARTS[-1] == "rnn"     # correctness first
    assert gpu_check.plan_seconds() <= 8 * 60
    assert gpu_check.TEST_START_S >= gpu_check.TEST_TIMEOUT_S      # a test started in time ends in time
    assert gpu_check.plan_seconds({**gpu_check.BUDGET_S, "tests": 400}) > 8 * 60


def test_budgets_override_and_refuse_bad_values():
    import argparse

    import gpu_check
    parser = argparse.ArgumentParser()
    assert gpu_check.parse_budgets(parser, ["tests=400", "hf=90"]) == {"tests": 400, "hf": 90}
    for bad in ("tests=10", "foo=100", "tests", "tests=1.5"):
        with pytest.raises(SystemExit):
            gpu_check.parse_budgets(parser, [bad])
