"""`make gpu-check` without a GPU: the dry run drives every part on the CPU at tiny sizes and
writes one section (to a temporary file here), a second run reuses the finished parts; and the
roofline's counts agree with what the code does."""
import importlib.util
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
    positions = [text.index(title) for title in TITLES]
    assert positions == sorted(positions)
    assert text.count("Status: ok") == 4
    assert " 0 failed, 0 errors, " in text and " skipped (" in text      # gpu tests collected, skipped here
    for method in ("| momentum torch | fwd+bwd |", "| linear torch | fwd |", "| sdpa | fwd+bwd |"):
        assert method in text
    assert "| ideal MB | GFLOP | GB/s (% of BW) | TFLOP/s (% of peak) | % of floor (bound) |" in text
    assert "unknown device" in text
    assert "| tiny | torch nn.LSTM |" in text and "| tiny | adam |" in text
    for cell in ("adam", "rmsprop"):
        assert f"| tiny | {cell}, one launch per step |" in text
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


def test_force_reruns_a_cached_part(first_run, tmp_path):
    out_dir, _, _ = first_run
    out = dry_run(out_dir, tmp_path / "a.md", "--parts", "rnn", "--force")
    assert "gpu-check: rnn: running" in out and ": cached (" not in out
    assert (tmp_path / "a.md").read_text().count("\n### ") == 1


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
    env = {**os.environ, "GPU_CHECK_DEADLINE": "0", "PYTHONPATH": str(ROOT / "benchmarks")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_budget",
           f"--junitxml={xml}", "test_three.py"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts, failures = gpu_check.junit_summary(xml)
    assert counts["tests"] == counts["skipped"] == counts["budget"] == 3 and counts["passed"] == 0
    assert failures == []


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
