"""benchmarks/triton_cache_prebuild.py builds the GPU machine's Triton cache here, under that
machine's Triton key (benchmarks/triton_key_probe.py's use_key). Checked with this venv's Triton in
both roles (the GPU image's 3.6.0 for Python 3.12 is what `make triton-carry` downloads): the key
given names the cache folder, the build packs what a rebuild from the parts loads without compiling,
and the device call's key line tells a carried cache of its own Triton from another's."""
import gzip
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import triton_cache, triton_specs

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "benchmarks" / "triton_key_probe.py"


def compiled_env():
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def probe(cache, key_file=None):
    cmd = [sys.executable, str(PROBE), str(cache)] + (["--key-file", str(key_file)] if key_file else [])
    done = subprocess.run(cmd, env=compiled_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def own_key():
    return subprocess.run([sys.executable, str(PROBE), "--print-key"], env=compiled_env(), check=True,
                          capture_output=True, text=True, timeout=120).stdout


def test_the_key_given_names_the_folder_and_leaves_the_cubin(tmp_path):
    native = probe(tmp_path / "native")
    (tmp_path / "own").write_text(own_key())
    (tmp_path / "other").write_text(own_key() + "-another build")
    same = probe(tmp_path / "same", tmp_path / "own")
    other = probe(tmp_path / "other-cache", tmp_path / "other")
    assert same["folders"] == native["folders"] and len(native["folders"]) == 1
    assert other["folders"] != native["folders"]
    assert native["cubin_sha256"] == same["cubin_sha256"] == other["cubin_sha256"]
    assert other["triton_key_sha256"] == hashlib.sha256(own_key().encode() + b"-another build").hexdigest()


def test_the_key_line_compares_the_carried_key_with_this_triton(tmp_path):
    own = triton_cache.own_key()
    assert own["triton_key_sha256"] == hashlib.sha256(own_key().encode()).hexdigest()
    triton_cache.write_key(tmp_path / "KEY", "a test", 3)
    assert "the same build and ptxas: they can load" in triton_cache.key_line(tmp_path / "KEY")
    for field in ("triton_key_sha256", "backend_sm90_sha256"):
        triton_cache.write_key(tmp_path / "KEY", "a test", 3, key=dict(own, **{field: "0" * 64}))
        assert "another build or ptxas: none will load" in triton_cache.key_line(tmp_path / "KEY")
    assert "carried" not in triton_cache.key_line(tmp_path / "absent")


def test_the_build_packs_what_a_rebuild_loads_without_compiling(tmp_path):
    """The whole script, its case of the tests' LSTM, with this venv's Triton as the device's too
    and two build processes (one takes the case, the other finds it claimed): the key check
    passes, the parts and KEY are written, and the rebuild from the unpacked parts (--check)
    compiles nothing."""
    import triton
    site = str(Path(triton.__file__).resolve().parents[1])
    out = tmp_path / "carry"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "triton_cache_prebuild.py"), "--site", site,
           "--device-python", sys.executable, "--device-site", site, "--out", str(out),
           "--only", "tests lstm", "--check", "--jobs", "2"]
    done = subprocess.run(cmd, env=compiled_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "the build again compiled 0" in done.stdout, done.stdout
    key = json.loads((out / "KEY").read_text())
    assert key["triton_key_sha256"] == hashlib.sha256(own_key().encode()).hexdigest()
    parts = triton_cache.part_paths(out)
    assert parts and key["kernels"] == triton_cache.unpack(out, tmp_path / "unpacked") > 0
    built = triton_specs.unique(triton_specs.read(out / "specs.jsonl.gz"))   # one per compiled kernel
    assert len(built) == key["kernels"], [entry["kernel"] for entry in built]
    assert all(entry["kernel"].startswith("plugins.rnn.") for entry in built), built[0]["kernel"]


def test_each_case_is_claimed_by_one_build_process(tmp_path):
    """The build's processes share the cases: the first to claim one runs it, the others skip it."""
    from benchmarks import triton_cache_prebuild as prebuild
    order = prebuild.claim_order()
    assert sorted(order) == sorted(prebuild.CASES), "every case once, the longest first"
    assert all(prebuild.claim(tmp_path, name) for name in order)
    assert not any(prebuild.claim(tmp_path, name) for name in order)


def earlier_device_cache(folder: Path, key: dict) -> dict:
    """The parts and KEY of a device call's own cache, as benchmarks/gpu_call.sh returns them: a
    kernel with its launcher and the autotuner's timings (which a build here never writes)."""
    cache = folder / "cache"
    files = {"AAAA/earlier.cubin": b"cubin", "AAAA/earlier.json": b"{}",
             "BBBB/__triton_launcher.cpython-312-x86_64-linux-gnu.so": b"launcher",
             "CCCC/earlier.autotune.json": b'{"timings": []}'}
    for name, data in files.items():
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        (cache / name).write_bytes(data)
    triton_cache.pack(cache, folder / "parts" / "triton-cache.tar.xz")
    triton_cache.write_key(folder / "parts" / "KEY", "benchmarks/gpu_call.sh on the device", 1, key=key)
    with gzip.open(folder / "parts" / "specs.jsonl.gz", "wt") as log:
        log.write(json.dumps(dict(kernel="device.earlier", source="s")) + "\n")
    return files


def test_the_build_onto_a_device_calls_cache_packs_the_union(tmp_path):
    """--onto: the parts a device call brought back are the build's start; it packs them with what
    it compiled (their launchers and timings too, which a build here alone would refuse), and
    refuses parts whose KEY names another Triton build, writing nothing."""
    import triton
    site = str(Path(triton.__file__).resolve().parents[1])
    own = triton_cache.own_key()
    files = earlier_device_cache(tmp_path / "device", own)
    out = tmp_path / "carry"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "triton_cache_prebuild.py"), "--site", site,
           "--device-python", sys.executable, "--device-site", site, "--out", str(out),
           "--only", "tests lstm", "--jobs", "1", "--onto", str(tmp_path / "device" / "parts")]
    done = subprocess.run(cmd, env=compiled_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "onto: 1 kernels" in done.stdout, done.stdout
    unpacked = tmp_path / "unpacked"
    total = triton_cache.unpack(out, unpacked)
    for name, data in files.items():
        assert (unpacked / name).read_bytes() == data, name
    assert total > 1 and json.loads((out / "KEY").read_text())["kernels"] == total
    logged = triton_specs.read(out / "specs.jsonl.gz")         # the device's log, then the build's
    assert logged[0] == dict(kernel="device.earlier", source="s") and len(logged) > 1

    files = earlier_device_cache(tmp_path / "other", dict(own, triton_key_sha256="0" * 64))
    refused = tmp_path / "refused"
    cmd[cmd.index("--out") + 1], cmd[-1] = str(refused), str(tmp_path / "other" / "parts")
    done = subprocess.run(cmd, env=compiled_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "triton_key_sha256" in done.stderr, done.stderr[-2000:]
    assert not refused.exists()
