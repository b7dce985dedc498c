"""benchmarks/triton_specs.py records the Triton specialisations a process needs and names what a
device call used that the prebuilt cache's log lacks. Recorded through Triton's real launch path
(tests/triton_standin.py, compiled for sm_90) in fresh processes, once by `install` and once by the
sitecustomize that benchmarks/gpu_call.sh puts on PYTHONPATH; the diff on those logs and on
hand-made records."""
import gzip
import importlib.util
import json
import os

import pytest
from helpers.compiled_process import ROOT, run_compiled

from benchmarks import triton_specs

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

KERNEL = """
import triton
import triton.language as tl


@triton.jit
def scale(x, out, n, BLOCK: tl.constexpr, TWICE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    value = tl.load(x + offsets, mask=offsets < n)
    tl.store(out + offsets, value * (2 if TWICE else 1), mask=offsets < n)
"""

SCRIPT = """
import json, os, sys
sys.path[:0] = ["tests", ".", "benchmarks", {folder!r}]
import triton_standin
triton_standin.activate(90)
if {install}:
    import triton_specs
    triton_specs.install(os.environ["LOG"])
import torch
from scale_kernel import scale
for dtype, twice in {forms}:
    x = torch.ones(100, dtype=dtype)
    for _ in range(2):                       # the second launch of a form needs no hook call
        scale[(2,)](x, torch.empty_like(x), 100, BLOCK=64, TWICE=twice)
print("ok")
"""


def record_forms(tmp_path, name: str, forms: str, install: bool = True) -> list:
    log = tmp_path / f"{name}.jsonl"
    (tmp_path / "scale_kernel.py").write_text(KERNEL)          # Triton reads a kernel's source from its file
    env = dict(LOG=log, TRITON_CACHE_DIR=tmp_path / f"cache-{name}")
    if not install:
        env.update(MOMENTUM_TRITON_SPECS_LOG=log,
                   PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks" / "triton_specs_site"), str(ROOT)]))
    script = SCRIPT.format(install=install, forms=forms, folder=str(tmp_path))
    assert run_compiled(script, timeout=300, **env) == "ok"
    return triton_specs.read(log)


@needs_triton
def test_each_specialisation_is_recorded_once_and_the_diff_names_what_differs(tmp_path):
    built = record_forms(tmp_path, "built", "[(torch.float32, True)]")
    device = record_forms(tmp_path, "device", "[(torch.float32, True), (torch.float16, True), "
                                              "(torch.float32, False)]", install=False)
    assert len(built) == 1 and len(device) == 3, (built, device)
    first = built[0]
    assert first["kernel"].endswith("scale") and first["signature"]["x"] == "*fp32"
    assert first["constants"]["BLOCK"] == 64 and first["constants"]["TWICE"] is True
    assert first["options"]["num_warps"] == 4 and first["seconds"] >= 0 and first["source"]
    assert first["attrs"]["x"] == [["tt.divisibility", 16]]       # CPU tensors are 16-byte aligned too
    assert all(entry["source"] == first["source"] for entry in device)

    result = triton_specs.diff(device, built)
    assert (result["used"], result["found"]) == (3, 1)
    why = {entry["signature"]["x"] + str(entry["constants"]["TWICE"]): fields
           for entry, fields in result["missing"]}
    assert [field for field, _ in why["*fp16True"]] == ["signature"]
    assert "x *fp16 (built: *fp32)" in why["*fp16True"][0][1]
    assert why["*fp32False"] == [("constants", "TWICE False (built: True)")]
    assert triton_specs.diff(built, device)["missing"] == []


def test_the_diff_prefers_the_same_source_and_says_where_no_kernel_was_built(tmp_path):
    def entry(kernel="m.fwd_h", source="a", **change):
        base = dict(kernel=kernel, source=source, backend="b", env=[], options={"num_warps": 4},
                    signature={"q": "*bf16"}, attrs={}, constants={"BK": 32, "H": 16}, seconds=0.3)
        return dict(base, **change)
    built = [entry(), entry(source="old", constants={"BK": 64, "H": 16})]
    device = [entry(constants={"BK": 64, "H": 16}), entry(constants={"BK": 64, "H": 16}, seconds=0.001),
              entry(kernel="m.bwd_dh"), entry(source="new")]
    path = tmp_path / "built.jsonl.gz"
    with gzip.open(path, "wt") as out:
        out.writelines(json.dumps(e) + "\n" for e in built)
        out.write('{"kernel": "cut sho')                 # a process killed mid-line
    result = triton_specs.diff(device, triton_specs.read(path))
    assert result["used"] == 3 and result["found"] == 0
    why = {(e["kernel"], e["source"]): fields for e, fields in result["missing"]}
    assert why[("m.fwd_h", "a")] == [("constants", "BK 64 (built: 32)")]    # not the other source's
    assert why[("m.bwd_dh", "a")] is None
    assert [field for field, _ in why[("m.fwd_h", "new")]] == ["source"]
    text = triton_specs.report(result)
    assert "not in it: 3" in text and "1 × bwd_dh: no such kernel built" in text
    assert "1 × fwd_h: constants: BK 64 (built: 32)" in text


def test_the_diff_command_refuses_a_missing_log(tmp_path, capsys):
    assert triton_specs.main(["diff", str(tmp_path / "absent"), str(tmp_path / "absent")]) == 1
    assert "no log at" in capsys.readouterr().err
