"""Build here, without a GPU, the Triton cache the GPU machine would compile, so that its first
call loads the kernels instead of compiling them inside its 10 minutes (issue 27 item 7).

    make triton-carry      # the wheels, then this script: .triton-carry/ for the next device call
    python benchmarks/triton_cache_prebuild.py --site S --device-python PY --device-site D [--out DIR]

The lent H200's image has Triton 3.6.0 under Python 3.12 (cp312); this machine's Python is 3.11.
`--site` holds Triton 3.6.0's cp311 build, `--device-site` its cp312 build, `--device-python` a
Python 3.12. Triton keys each cached kernel by its own build (triton_key(): the sha256 of its
sources and of libtriton's bytes, which differ between cp311 and cp312), by the kernel's source,
constants, specialisation, target and options. The steps:

1. The key check (benchmarks/triton_key_probe.py): the device Python compiles a small kernel for
   sm_90 with the cp312 build, and this Python with the cp311 build under the cp312 key. Both must
   name the same cache folder and write the same cubin, else nothing is built.
2. The build: processes of this Python (`--jobs`, one per core), with the cp311 build under the
   cp312 key and the stand-in driver of tests/triton_standin (Triton's real launcher: binder,
   autotuner, compilation to sm_90 cubins; no-op launches on CPU tensors), drive the library
   through `CASES`: gpu-check's attention, hf and rnn parts and gpu_call.sh's steps at their own
   shapes and dtypes, then the forms of the gpu tests at small shapes. Each process takes the next
   case that no other has, the longest first (`LONGEST_FIRST`). The autotuner compiles every config its
   pruner keeps. The kernels specialise none of their integer arguments but the heads H (a multiple
   of 16, or not), and the kept tiles depend on the sizes only for the scans, where small shapes
   keep them all: the tests' forms run at H = 2 and 16.
3. The pack (benchmarks/triton_cache.py), without the autotuner's timings (none are written:
   TRITON_CACHE_AUTOTUNING is unset here; the stand-in's launches do nothing and time nothing) and
   without launchers (the stand-in builds none). With `--check`, the parts are unpacked into an empty
   cache and the build runs again from them: it must compile nothing.

With `--onto DIR` (`make triton-carry PREBUILD_ARGS="--onto .triton-carry"`) the build starts from
the parts and KEY in DIR, a device call's own cache as gpu_call.sh brings it back (launchers,
the autotuner's timings and Inductor's kernels in it): parts whose KEY names another Triton build or
ptxas are refused, and the union is packed. On 2026-12-04 the device compiled 516 kernels that a
build from nothing had not reached (docs/benchmarks.md); its cache keeps them, the build adds what
the code changed since.

The build's children record each specialisation they compile or load (benchmarks/triton_specs.py),
and the log goes beside the parts as specs.jsonl.gz (with `--onto`, after the one in DIR, where
there is one). On the device, benchmarks/gpu_call.sh unpacks the parts before anything runs, prints
how many kernels it compiled all the same, and which specialisations it used that this log lacks,
with the field that differs from the nearest one built. What this cannot know before a device
call: whether the image's Triton is the cp312 wheel of PyPI's 3.6.0 with its own ptxas (the call
prints its key's and backend's sha256 beside those in the parts' KEY file), and which forms a gpu
test reaches that `CASES` does not (the call's diff names them)."""
import argparse
import contextlib
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path[:0] = [str(BENCH)]

import triton_cache  # noqa: E402  (standard library only)

DEVICE_ARCH = 90
SPECS = "specs.jsonl.gz"   # the build's specialisations (benchmarks/triton_specs.py), beside the parts


def device_key(python: str, site: str) -> str:
    env = dict(os.environ, PYTHONPATH=site)
    return subprocess.run([python, str(BENCH / "triton_key_probe.py"), "--print-key"], env=env, check=True,
                          capture_output=True, text=True).stdout


def probe(python: str, site: str, key_file=None) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPATH=site)
        env.pop("TRITON_INTERPRET", None)
        cmd = [python, str(BENCH / "triton_key_probe.py"), cache]
        cmd += ["--key-file", key_file] if key_file else []
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])


def child_env(site: str, cache: str, key_file: str, specs=None) -> dict:
    """The children's environment; `specs`, where given, the log of the specialisations they build."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "TRITON_CACHE_AUTOTUNING") and not k.startswith("MOMENTUM_")}
    env.update(PYTHONPATH=os.pathsep.join([site, str(ROOT), str(ROOT / "tests")]), TRITON_CACHE_DIR=cache,
               PREBUILD_KEY_FILE=key_file, OMP_NUM_THREADS="1")
    if specs:
        env["PREBUILD_SPECS_LOG"] = str(specs)
    return env


def build(site: str, cache: str, key_file: str, only=None, jobs: int = 1, specs=None) -> dict:
    """Run the build in `jobs` child processes of this Python, on one cache (Triton writes each
    file whole, by a rename), each taking the next case no other has claimed; returns their
    summaries' union. Compiling is single-threaded: one child per core. With `specs`, the children
    append the specialisations they compile or load there (benchmarks/triton_specs.py)."""
    with tempfile.TemporaryDirectory() as work:
        summaries = [Path(work) / f"summary-{i}.json" for i in range(jobs)]
        claims = Path(work) / "claims"
        claims.mkdir()
        children = [subprocess.Popen([sys.executable, __file__, "--child", str(path), "--claims", str(claims)]
                                     + (["--only", *only] if only else []),
                                     env=child_env(site, cache, key_file, specs)) for path in summaries]
        codes = [child.wait() for child in children]
        if any(codes):
            raise subprocess.CalledProcessError(max(codes, key=abs), "the build's children")
        done = [json.loads(path.read_text()) for path in summaries]
    ran = {name for summary in done for name in summary["cases"]}
    return dict(cases=[name for name in CASES if name in ran], kernels=triton_cache.kernel_count(cache),
                launches=sum(summary["launches"] for summary in done))


def claim(claims: Path, case: str) -> bool:
    """Whether this child takes `case`: the first to create its file does (O_EXCL is atomic)."""
    try:
        os.close(os.open(claims / case.replace(" ", "_"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", help="Triton 3.6.0 for this Python (an unpacked wheel)")
    parser.add_argument("--device-python", help="a Python of the device's minor version (3.12)")
    parser.add_argument("--device-site", help="Triton 3.6.0 for the device's Python (an unpacked wheel)")
    parser.add_argument("--out", default=str(ROOT / ".triton-carry"), help="where the parts go")
    parser.add_argument("--check", action="store_true",
                        help="rebuild from the unpacked parts: nothing may compile")
    parser.add_argument("--only", nargs="+", help="run only the cases with these names (a quick look)")
    parser.add_argument("--onto", help="start from the parts and KEY in this folder (a device call's own "
                        "cache, $OUT/triton-cache.tar.xz.N): build only what they lack, pack the union")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="build processes, one per core (default: this machine's cores)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--claims", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.only or ()) - set(CASES)
    if unknown:
        parser.error(f"--only takes case names among {list(CASES)}, got {sorted(unknown)}")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.child:
        return child(args.child, Path(args.claims), args.only)
    for name in ("site", "device_python", "device_site"):
        if not getattr(args, name):
            parser.error(f"--{name.replace('_', '-')} is required (make triton-carry gives all three)")
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("run without TRITON_INTERPRET: the interpreter compiles nothing")
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as work:
        key_file = str(Path(work) / "key")
        Path(key_file).write_text(device_key(args.device_python, args.device_site))
        native, here = probe(args.device_python, args.device_site), probe(sys.executable, args.site, key_file)
        print(f"key check: device Python {native['python']} / Triton {native['triton']} → "
              f"{native['folders']}; this Python {here['python']} / Triton {here['triton']} under its key → "
              f"{here['folders']}")
        if any(native[k] != here[k] for k in ("folders", "cubin_sha256", "backend_sm90_sha256")):
            print("the key check failed: this Triton under the device's key does not name the device's "
                  "cache folder or write its cubin; nothing built", file=sys.stderr)
            return 1
        cache = str(Path(work) / "cache")
        earlier = set()
        if args.onto:
            failure = onto_mismatch(Path(args.onto), native)
            if failure:
                print(failure, file=sys.stderr)
                return 1
            print(f"onto: {triton_cache.unpack(args.onto, cache)} kernels from {args.onto}")
            earlier = set(Path(cache).glob("*/*"))
        start = time.perf_counter()
        specs = Path(work) / "specs.jsonl"
        summary = build(args.site, cache, key_file, args.only, args.jobs, specs)
        print(f"built: {summary['kernels']} kernels in {time.perf_counter() - start:.0f} s "
              f"({summary['launches']} launches, {len(summary['cases'])} cases, {args.jobs} processes)")
        leftovers = [p.name for p in Path(cache).glob("*/*") if p not in earlier
                     and (p.suffix == ".so" or p.name.endswith(".autotune.json"))]
        if leftovers:
            print(f"the build wrote launchers or timings, which are this machine's: {leftovers[:3]}",
                  file=sys.stderr)
            return 1
        out.mkdir(parents=True, exist_ok=True)
        known = read_bytes(Path(args.onto) / SPECS) if args.onto else b""
        for old in triton_cache.part_paths(out) + [out / "KEY", out / SPECS]:      # an earlier carry's
            old.unlink(missing_ok=True)
        parts = triton_cache.pack(cache, out / "triton-cache.tar.xz")
        with gzip.open(out / SPECS, "wb") as log:
            log.write(known + read_bytes(specs, gzipped=False))
        device = {k: native[k] for k in ("triton", "triton_key_sha256", "backend_sm90_sha256")}
        built_by = f"benchmarks/triton_cache_prebuild.py, Python {here['python']}"
        triton_cache.write_key(out / "KEY", built_by + (f", onto {args.onto}" if args.onto else ""),
                               triton_cache.kernel_count(cache), key=device)
        sizes = ", ".join(f"{p.name} ({p.stat().st_size / 2**20:.1f} MiB)" for p in parts)
        print(f"packed: {sizes} in {out}")
        if args.check:
            again = str(Path(work) / "again")
            loaded = triton_cache.unpack(out, again)
            stamp = Path(work) / "stamp"
            stamp.touch()
            time.sleep(1)
            second = build(args.site, again, key_file, args.only, args.jobs)
            counts = triton_cache.compiled(again, stamp)
            print(f"check: {loaded} kernels unpacked; the build again compiled {counts['kernels']} "
                  f"({second['kernels']} kernels used)")
            if counts["kernels"]:
                return 1
    return 0


def read_bytes(path: Path, gzipped: bool = True) -> bytes:
    """A log's lines (b"" where there is none)."""
    if not path.is_file():
        return b""
    return gzip.decompress(path.read_bytes()) if gzipped else path.read_bytes()


def onto_mismatch(folder: Path, native: dict):
    """Why the parts in `folder` cannot be the base of this build (its KEY missing, or written for
    another Triton build or ptxas than the device's), or None."""
    try:
        key = json.loads((folder / "KEY").read_text())
    except (OSError, ValueError) as error:
        return f"--onto {folder}: no readable KEY beside the parts ({error}); nothing built"
    for field in triton_cache.mismatched(key, native)[:1]:
        return (f"--onto {folder}: its KEY's {field} is {str(key.get(field))[:16]}, the device's "
                f"Triton has {native[field][:16]}: its kernels would not load there; nothing built")
    return None


def child(summary_path: str, claims: Path, only=None) -> int:
    """The build itself, in a process the stand-in drives: the cases that no other child has
    claimed, in `claim_order`."""
    import triton_key_probe
    triton_key_probe.use_key(Path(os.environ["PREBUILD_KEY_FILE"]).read_text())
    if os.environ.get("PREBUILD_SPECS_LOG"):
        import triton_specs
        triton_specs.install(os.environ["PREBUILD_SPECS_LOG"])
    import triton_launch_check as check
    import triton_standin
    triton_standin.activate(DEVICE_ARCH)
    check.allow_cpu_tensors(auto=True)
    import torch

    done, start = [], time.perf_counter()
    for name in claim_order():
        if (only and name not in only) or not claim(claims, name):
            continue
        case = CASES[name]
        before = time.perf_counter()
        case(torch, check)
        done.append(name)
        print(f"  {name}: {time.perf_counter() - before:.0f} s, {cached_kernels()} kernels in the cache",
              flush=True)
    Path(summary_path).write_text(json.dumps(dict(cases=done, launches=triton_standin._NoLaunch.launches,
                                                  seconds=time.perf_counter() - start)))
    return 0


def _leaves(torch, dtype, *shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen).to(dtype).requires_grad_() for shape in shapes]


def cached_kernels() -> int:
    return triton_cache.kernel_count(os.environ["TRITON_CACHE_DIR"])


# benchmarks/timing.median_ms's arguments for one untimed pass: the stand-in's launches time nothing
ONCE = dict(warmup=0, min_reps=1, max_reps=1)


def _fp32_dots(value: str):
    """Exact fp32's dots set to `value` (MOMENTUM_TRITON_FP32_DOTS, read at each call: "ieee" FMA in
    every kernel, "bf16x6" six bf16 products in every kernel) for the calls inside."""
    from plugins.attention.triton.utils import FP32_DOTS_VARIABLE
    return mock.patch.dict(os.environ, {FP32_DOTS_VARIABLE: value})


def _gpu_check_sizes():
    import gpu_check
    return gpu_check.SIZES["full"]


def _table(torch, check):
    """gpu-check's attention part: its Triton methods at its shapes and dtypes, forward and
    forward+backward, through benchmarks/gpu_attention.py's own calls."""
    import gpu_attention
    sizes = _gpu_check_sizes()["attention"]
    for dtype, shapes in sizes["cases"]:
        for name in sizes["methods"]:
            if "triton" not in name:
                continue
            fn = gpu_attention.method_fn(name)
            for B, H, D, T in shapes:
                for backward in (False, True):
                    gpu_attention.measure(fn, B, H, D, T, backward, dtype, "cpu", ONCE)


# gpu_call.sh's forced tiles of exact fp32's per-chunk kernels: one V or K tile over the head
WHOLE_HEAD_TILES = {"fwd_o": (16, 64, 8), "bwd_dv": (16, 64, 8), "bwd_dqk": (64, 16, 8)}


def _kernels(torch, check):
    """benchmarks/gpu_call.sh's per-kernel step (gpu_kernels.py --modes default fused) and its
    exact fp32 steps (the default dots, then at the whole-head tiles, and FMA dots in every kernel)
    at B16-H16-T1k."""
    import gpu_attention
    import gpu_kernels
    for name in ("momentum triton", "momentum triton fused"):
        fn = gpu_attention.method_fn(name)
        for B, H, D, T in gpu_kernels.SHAPES:
            gpu_attention.measure(fn, B, H, D, T, True, "bf16", "cpu", ONCE)
    B, H, D, T = gpu_kernels.SHAPES[0]
    chunked = gpu_attention.method_fn("momentum triton")
    gpu_attention.measure(chunked, B, H, D, T, True, "fp32", "cpu", ONCE)
    with gpu_kernels.forced_tiles(WHOLE_HEAD_TILES):
        gpu_attention.measure(chunked, B, H, D, T, True, "fp32", "cpu", ONCE)
    with _fp32_dots("ieee"):
        gpu_attention.measure(chunked, B, H, D, T, True, "fp32", "cpu", ONCE)


def _hf(torch, check):
    """gpu-check's hf part and gpu_call.sh's training step: a training step of the momentum model
    (bf16 autocast) at each length and its batch, and eager greedy decoding (MomentumCache) after
    each prompt length, at the part's hidden size and heads; one layer and a small vocabulary,
    which change no attention call."""
    import gpu_train

    from hf_momentum import MomentumCache
    from hf_momentum.modeling_common import CACHE_NAME
    sizes = _gpu_check_sizes()["hf"]
    size = dict(sizes["size"], layers=1, vocab=256)
    for T in sizes["lengths"]:
        step = gpu_train.training_step(gpu_train.momentum_model, T, sizes["tokens"], size, "cpu")[1]
        step()
    for context in sizes["contexts"]:
        model = gpu_train.momentum_model(context + 4, size).eval()
        prompt = torch.randint(0, size["vocab"], (1, context))
        cache = MomentumCache(model.config)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            token = prompt
            for _ in range(3):               # the prompt, then two cached steps
                logits = model(input_ids=token, **{CACHE_NAME: cache}, use_cache=True).logits
                token = logits[:, -1:].argmax(-1)


def _rnn(torch, check):
    """gpu-check's rnn part and tests/test_rnn_triton.py's gpu test: the Adam/RMSProp LSTM on both
    Triton recurrences at their shapes, fp32 (exact: TF32 is off by default)."""
    import rnn

    from plugins.rnn import MomentumLSTM
    from plugins.rnn.adam_recurrence import recurrence_backend
    for shape in _gpu_check_sizes()["rnn"]["shapes"]:
        size = rnn.SHAPES[shape]
        x = torch.randn(size["T"], size["B"], size["D"]).requires_grad_()
        for cell in ("adam", "rmsprop"):
            model = MomentumLSTM(size["D"], size["H"], num_layers=size.get("L", 1), cell=cell)
            for backend in ("triton", "triton-one-launch"):
                with recurrence_backend(backend):
                    out, _ = model(x)
                    out.sum().backward()


def _plain(torch, dtype, dk, dv, momentum, H, B=2, N=150):
    """What most gpu tests call: forward and forward+backward, no padding, no state."""
    from plugins.attention import momentum_attention
    q, k, v = _leaves(torch, dtype, (B, H, N, dk), (B, H, N, dk), (B, H, N, dv))
    momentum_attention(q, k, v, momentum=momentum, backend="triton").float().sum().backward()
    with torch.no_grad():
        momentum_attention(q, k, v, momentum=momentum, backend="triton")


def _padded_states(torch, dtype, H, dk=64, dv=64):
    """Padding, an initial state and the final state's gradient (tests/test_attention_gpu.py's
    padding-and-states test), and packed rows with per-segment states (its split-scans test)."""
    from plugins.attention import MomentumAttentionState, momentum_attention
    B, N = 2, 150
    q, k, v = _leaves(torch, dtype, (B, H, N, dk), (B, H, N, dk), (B, H, N, dv))
    s, z, m = _leaves(torch, torch.float32, (B, H, dk, dv), (B, H, dk), (B, H, dk, dv), seed=1)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 100:] = False
    out, state = momentum_attention(q, k, v, momentum=0.9, padding_mask=mask, backend="triton",
                                    initial_state=MomentumAttentionState(s=s, z=z, m=m), return_state=True)
    (out.float().sum() + state.s.sum() + state.z.sum() + state.m.sum()).backward()
    cu = torch.tensor([0, 70, 70, 140, N], dtype=torch.int32)
    q, k, v = (t[:1].detach().requires_grad_() for t in (q, k, v))
    zeros = [t.new_zeros(4, *t.shape[1:]).requires_grad_() for t in (s, z, m)]
    for state0 in (None, MomentumAttentionState(*zeros)):
        out, state = momentum_attention(q, k, v, momentum=0.9, cu_seqlens=cu, backend="triton",
                                        initial_state=state0, return_state=True)
        (out.float().sum() + state.s.sum() + state.z.sum() + state.m.sum()).backward()


def _scans(check, body, scans=("launcher", "split", "fused")):
    """body() with the launcher's own splits (none at these sizes), every chunk its own split (the
    launcher's choice at long rows), and the fused kernels."""
    contexts = {"launcher": contextlib.nullcontext, "split": check.split_every_chunk,
                "fused": check.fused_scans}
    for scan in scans:
        with contexts[scan]():
            body()


def _dtype(torch, check, name):
    torch.set_float32_matmul_precision("high" if name == "tf32" else "highest")
    return getattr(torch, check.DTYPES[name])


# The kernels specialise H, the heads, by Triton's rules for integers (a multiple of 16, or not);
# the tests' forms run at one of each.
HEADS = (2, 16)


def _tests_at_64(name, momenta=(0.9, 0.0), scans=("launcher", "split", "fused"), rich=True):
    """The gpu tests' forms at D 64 in one dtype: β > 0 and linear with each scan, padding, states
    and packed rows, and the launch check's calls (a layer's call, the decoding steps)."""
    def case(torch, check):
        dtype = _dtype(torch, check, name)
        for H in HEADS:
            for momentum in momenta:
                _scans(check, lambda: _plain(torch, dtype, 64, 64, momentum, H), scans)
            if rich:
                _scans(check, lambda: _padded_states(torch, dtype, H), scans)
        if rich:
            check.attention(dtype, 64)
            check.large_step(dtype, check.LARGE_DK)
        torch.set_float32_matmul_precision("highest")
    return case


def _dots_settings(torch, check):
    """Exact fp32 with each other setting of its dots (MOMENTUM_TRITON_FP32_DOTS ieee and bf16x6),
    as gpu-check tests them: D 64 with each scan, D 16."""
    for value in ("ieee", "bf16x6"):
        with _fp32_dots(value):
            for H in HEADS:
                _scans(check, lambda: _plain(torch, torch.float32, 64, 64, 0.9, H))
                _plain(torch, torch.float32, 16, 16, 0.999, H)


def _other_dims(name):
    """tests/test_attention_gpu.py's other head sizes in one dtype, β > 0 and linear (at D 128,
    4096 tokens of 16 rows, the launcher splits); with bf16 also Dk 64 with Dv 48, and fused fp16
    at 32 × 24."""
    def case(torch, check):
        dtype = _dtype(torch, check, name)
        for H in HEADS:
            for dk, dv in ((128, 128), (32, 24), (16, 16)):
                for momentum in (0.9, 0.0):
                    _plain(torch, dtype, dk, dv, momentum, H)
                if (dk, dv) == (128, 128):
                    with check.split_every_chunk():
                        _plain(torch, dtype, dk, dv, 0.9, H)
        if name == "bf16":
            for H in HEADS:
                _scans(check, lambda: _plain(torch, torch.bfloat16, 64, 48, 0.9, H))
                with check.fused_scans():
                    _plain(torch, torch.float16, 32, 24, 0.9, H)
    return case


def _layers(torch, check):
    """A decoder layer's call (attend: the feature map and NaN marks in-kernel), heads transposed,
    as tests/test_attention_triton_feature_marks.py's gpu test makes it (B2-H4-T1000, D 64, fp32
    and bf16, each feature map, one row padded) and tests/test_hf_gpu_syncs.py's models (bf16,
    every row real, padded and packed)."""
    from plugins.attention.attend import attend
    from plugins.attention.spec import AttentionSpec
    from plugins.packing import Segments
    B, H, N, D = 2, 4, 1000, 64
    lengths = torch.tensor([N, 777])
    padded = Segments.from_padding_mask(torch.arange(N) < lengths[:, None], B, N)
    packed = Segments.from_cu_seqlens(torch.tensor([0, 7, N // 2, N]), N, batch=1)
    forms = {(torch.bfloat16, "elu"): (None, padded, packed), (torch.bfloat16, "relu"): (padded,),
             (torch.float32, "elu"): (padded,), (torch.float32, "relu"): (padded,)}
    for (dtype, feature_map), segmentations in forms.items():
        raw = [t.transpose(1, 2) for t in _leaves(torch, dtype, *[(B, N, H, D)] * 3)]
        spec = AttentionSpec(momentum=0.6, step_size=0.8, feature_map=feature_map, backend="triton")
        for segments in segmentations:
            rows = raw if segments is not packed else [t[:1] for t in raw]
            attend(*rows, spec, segments=segments).float().sum().backward()


def _lstm(torch, check):
    """The Adam/RMSProp recurrences of tests/test_rnn_triton.py's sizes (the launch check's), exact
    fp32 and with TF32 GEMMs allowed."""
    torch.backends.cuda.matmul.allow_tf32 = False
    check.lstm_recurrences(torch.float32, 64)
    torch.backends.cuda.matmul.allow_tf32 = True
    check.lstm_recurrences(torch.float32, 64)
    torch.backends.cuda.matmul.allow_tf32 = False


# In the order of a device call (benchmarks/gpu_call.sh): gpu-check's parts at their own shapes,
# gpu_call.sh's steps, then the gpu tests' forms (gpu-check's first part, whose shapes vary more).
CASES = {
    "gpu-check attention": _table,
    "gpu-check hf": _hf,
    "gpu-check rnn": _rnn,
    "gpu_call kernels": _kernels,
    "tests bf16": _tests_at_64("bf16"),
    "tests layers": _layers,
    "tests fp32": _tests_at_64("fp32"),
    "tests lstm": _lstm,
    "tests tf32": _tests_at_64("tf32", momenta=(0.9,), scans=("launcher", "split"), rich=False),
    "tests fp32 dots settings": _dots_settings,
    "tests fp16": _tests_at_64("fp16", rich=False),
    "tests other head sizes bf16": _other_dims("bf16"),
    "tests other head sizes fp16": _other_dims("fp16"),
    "tests other head sizes fp32": _other_dims("fp32"),
}
# The build's processes claim these first, then the others in CASES's order: the longest builds
# (make triton-carry, 2026-11-30: the other head sizes of three dtypes together 308 s, fp32 186 s,
# bf16 132 s, the attention table 124 s of 1000), so that no process starts one as the others finish.
LONGEST_FIRST = ("tests other head sizes fp32", "tests other head sizes bf16", "tests other head sizes fp16",
                 "tests fp32", "tests bf16", "gpu-check attention")


def claim_order() -> list:
    return list(LONGEST_FIRST) + [name for name in CASES if name not in LONGEST_FIRST]


if __name__ == "__main__":
    sys.exit(main())
