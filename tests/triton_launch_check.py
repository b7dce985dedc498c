"""Drive the public API through Triton's real launch path for one GPU target, on CPU tensors, with
the stand-in driver of `triton_standin` (compiled kernels, no-op launches):

    python tests/triton_launch_check.py --arch 90 [--dtypes bf16 fp16:64 tf32:128] [--dims 64 128] [--table]

Per dtype and head size: momentum attention forward + backward (padding, initial state, the final
state's gradient), plain linear attention (the one-state kernels), packed sequences (cu_seqlens:
per-segment initial and final states, β > 0 and β = 0), the fused kernels (padded momentum, bf16
at the first head size up to 64), a decoding step, and the Adam/RMSProp LSTM recurrences; then the
attention again at other autotuning buckets of N and B·H, which must compile nothing new; per
dtype, a decoding step at Dk = Dv = 512 (the step kernel loops over Dk blocks). "tf32" is fp32
inputs under torch.set_float32_matmul_precision("high"): tf32 dots. Every config the autotuner
keeps is compiled for the target and bound by the launcher (at each kernel's first tuning key:
sweep_first_key_only); in bf16 at D = 64, plugins.triton_launch.direct is compared with Triton's
own dispatch (tests/triton_direct_launch_check.py). Exit 0 when everything launched and agreed;
`--table` prints registers and spills (ptxas -v) of every compiled kernel as a markdown table.
`--ptx-record FILE` writes each compiled kernel's code (its PTX without line info: helpers/ptx_record.py),
registers and spills; `--same-ptx-as FILE`, run with the same options in another revision of the
kernels, exits 1 naming each kernel whose code differs from that record: a refactor shown to compile
to the same code on every kernel needs no GPU to show that it is as fast. Must run with
TRITON_INTERPRET unset."""
import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET: the interpreter skips the launcher this script checks")

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import triton_standin  # noqa: E402  (the stand-in must be active before any kernel is used)
from helpers import ptx_record  # noqa: E402

LSTM_KERNELS = []           # the Adam/RMSProp step kernels, compiled
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "tf32": "float32"}
LARGE_DK = 512


def allow_cpu_tensors(auto: bool = False):
    """The library sends only CUDA tensors (or CPU tensors under the interpreter) to Triton: let
    CPU tensors through to the compiled kernels, the one thing the stand-in changes. auto: the
    default backend="auto" picks them too, as it would on CUDA (a model that passes no backend)."""
    from plugins.attention import api, backends
    from plugins.attention import triton as attention_kernels
    from plugins.rnn import adam_recurrence_triton

    def use_triton(backend, device, float64):
        return backend == "triton" or (auto and backend == "auto" and not float64)

    backends.use_triton = api.use_triton = use_triton
    attention_kernels._check_device = lambda t: None
    compiled = adam_recurrence_triton._kernel

    def jit_kernel(fn, interpret):
        kernel = compiled(fn, False)
        if kernel not in LSTM_KERNELS:
            LSTM_KERNELS.append(kernel)
        return kernel

    adam_recurrence_triton._kernel = jit_kernel


def sweep_first_key_only(kernels):
    """Each autotuned kernel compiles every config its pruner keeps at the first tuning key it
    meets per input dtype, head sizes and dot precision (the padded momentum call), and the first
    kept config at its other keys (one state, packed sequences, other buckets): the configs and the
    flag variants are each compiled once, not all of one for each of the other (bf16 at D 64: 70
    kernels compiled instead of 146). `--table` keeps every pair."""
    swept = set()
    for kernel in kernels:
        prune = kernel.early_config_prune

        def first_key_sweeps(configs, named_args, _prune=prune, _kernel=kernel, **kwargs):
            kept = _prune(configs, named_args, **kwargs) if _prune else configs
            first = next(iter(named_args.values()))
            key = (_kernel, first.dtype, kwargs["DK"], kwargs["DV"], kwargs.get("IEEE"))
            if key in swept:
                return kept[:1]
            swept.add(key)
            return kept
        kernel.early_config_prune = first_key_sweeps


@contextlib.contextmanager
def fused_scans():
    """The fused kernels (plugins/attention/triton/fused_chunk_kernels) instead of the chunked ones."""
    from plugins.attention.triton import chunk
    chosen, chunk.SCAN = chunk.SCAN, "fused"
    try:
        yield
    finally:
        chunk.SCAN = chosen


@contextlib.contextmanager
def split_every_chunk():
    """The launcher splits the state scans of few, long rows only (split.scan_splits): here every
    chunk is its own split, so that the split scans and merge_splits launch at a small shape."""
    from plugins.attention.triton import chunk
    chosen, chunk.scan_splits = chunk.scan_splits, lambda rows, chunks, device: (chunks, 1)
    try:
        yield
    finally:
        chunk.scan_splits = chosen


def attention(dtype, D, B=2, H=2, N=150, momentum_only=False):
    """N = 150: past two chunks and not a multiple of the chunk. momentum_only: the padded
    momentum forward + backward alone (what the split scans add is compiled once that way; the
    other flags' SPLIT kernels are compiled in tests/test_attention_triton.py)."""
    import torch

    from plugins.attention import (
        MomentumAttentionState,
        linear_attention,
        momentum_attention,
        momentum_attention_step,
    )

    gen = torch.Generator().manual_seed(0)

    def leaf(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(dt).requires_grad_()

    q, k, v = (leaf(B, H, N, D) for _ in range(3))
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 100:] = False
    init = MomentumAttentionState(s=leaf(B, H, D, D, dt=torch.float32), z=leaf(B, H, D, dt=torch.float32),
                                  m=leaf(B, H, D, D, dt=torch.float32))
    out, state = momentum_attention(q, k, v, momentum=0.6, step_size=0.8, padding_mask=mask,
                                    initial_state=init, return_state=True, backend="triton")
    loss = out.float().sum() + state.s.sum() + state.z.sum() + state.m.sum()
    loss.backward()
    if momentum_only:
        return
    trusted_path(leaf, B, H, N, D)
    # the one-state kernels (β = 0), without padding, initial state or final-state gradient
    linear_attention(q, k, v, backend="triton").float().sum().backward()
    q1, k1, v1 = (leaf(B, H, 1, D) for _ in range(3))
    step_state = MomentumAttentionState(s=state.s.detach(), z=state.z.detach(), m=state.m.detach())
    out1, _ = momentum_attention_step(q1, k1, v1, step_state, momentum=0.6, padding_mask=mask[:, :1],
                                      backend="triton")
    out1.float().sum().backward()
    with torch.no_grad():                          # the marked step (feature map and marks in-kernel)
        momentum_attention_step(q1, k1, v1, step_state, momentum=0.6, padding_mask=mask[:, :1],
                                backend="triton")
    packed(leaf, H, N, D)


def trusted_path(leaf, B, H, N, D):
    """A decoder layer's call: raw q, k, v with heads transposed out of (B, N, H, D), the feature
    map and NaN marks in the kernels of feature_marks, forward + backward, every row real, a
    right-padded batch (the kernels' HAS_LEN form), and the first row packed into three sequences
    (HAS_SEG)."""
    import torch

    from plugins.attention.attend import attend
    from plugins.attention.spec import AttentionSpec
    from plugins.packing import Segments

    raw = [leaf(B, N, H, D).transpose(1, 2) for _ in range(3)]
    lengths = torch.tensor([N] + [N - 50] * (B - 1))
    padded = Segments.from_padding_mask(torch.arange(N) < lengths[:, None], B, N)
    packed = Segments.from_cu_seqlens(torch.tensor([0, 7, N // 2, N]), N, device=raw[0].device, batch=1)
    spec = AttentionSpec(momentum=0.6, step_size=0.8, backend="triton")
    for segments in (None, padded):
        attend(*raw, spec, segments=segments).float().sum().backward()
    attend(*(t[:1] for t in raw), spec, segments=packed).float().sum().backward()


def packed(leaf, H, N, D):
    """Packed sequences through the Triton entry point (the IS_VARLEN kernels): one row of N
    tokens in segments of 1, 0, a chunk-crossing middle, and a tail; forward + backward with
    per-segment initial and final states at β > 0, and the one-state kernels at β = 0."""
    import torch

    from plugins.attention import MomentumAttentionState
    from plugins.attention.triton import chunk_momentum_attention

    cu = torch.tensor([0, 1, 1, N // 3, N - 5, N], dtype=torch.int32)
    n = cu.numel() - 1
    q, k, v = (leaf(1, H, N, D) for _ in range(3))
    init = MomentumAttentionState(s=leaf(n, H, D, D, dt=torch.float32), z=leaf(n, H, D, dt=torch.float32),
                                  m=leaf(n, H, D, D, dt=torch.float32))
    for beta, state0 in ((0.6, init), (0.0, None)):
        out, state = chunk_momentum_attention(q, k, v, momentum=beta, step_size=0.8, eps=1e-6, chunk_size=64,
                                              initial_state=state0, return_state=True, cu_seqlens=cu)
        (out.float().sum() + state.s.sum() + state.z.sum() + state.m.sum()).backward()


def large_step(dtype, D):
    import torch

    from plugins.attention import MomentumAttentionState, momentum_attention_step

    q, k, v = (torch.randn(2, 2, 1, D).to(dtype) for _ in range(3))
    state = MomentumAttentionState.zeros(2, 2, D, D, dtype=torch.float32, device=q.device)
    momentum_attention_step(q, k, v, state, momentum=0.6, backend="triton")


def compiled_count(kernels) -> int:
    return sum(1 for kernel in kernels for _ in triton_standin.compiled_kernels(kernel))


def lstm_recurrences(dtype, hidden):
    import torch

    from plugins.rnn import MomentumLSTM
    from plugins.rnn.adam_recurrence import recurrence_backend

    gen = torch.Generator().manual_seed(1)
    for cell in ("adam", "rmsprop"):
        model = MomentumLSTM(16, hidden, num_layers=1, cell=cell).to(dtype)
        x = torch.randn(9, 3, 16, generator=gen).to(dtype).requires_grad_()
        for backend in ("triton", "triton-one-launch"):
            with recurrence_backend(backend):
                out, _ = model(x)
                out.float().sum().backward()


# Kernels whose program walks a row's chunks in order (a scan): each chunk's loads must be issued ahead
# by Triton's software pipeline (num_stages ≥ 2), or every chunk waits for memory before its arithmetic.
# The fused kernels keep one stage for fp32 inputs (fused_chunk_kernels.prune_fused).
SCANS = ("fwd_h", "bwd_dh", "fused_fwd", "fused_bwd_dkv", "fused_bwd_dq")


def unpipelined(compiled) -> list[str]:
    """The compiled scans among (name, dtype, CompiledKernel) whose chunk loop issues no load ahead."""
    waiting = []
    for name, dtype, kernel in compiled:
        if name not in SCANS or (name.startswith("fused") and dtype == "fp32"):
            continue
        if not triton_standin.prefetched_loads(kernel):
            consts = triton_standin.named_constants(kernel)
            waiting.append(f"{name} {dtype} {consts} warps {kernel.metadata.num_warps} "
                           f"stages {kernel.metadata.num_stages}")
    return waiting


def kernel_dtype(kernel) -> str:
    """The dtype of the kernel's first tensor argument: its input dtype."""
    first = next(t for t in kernel.src.signature.values() if t.startswith("*"))
    return first.lstrip("*")


def resource_table(kernels) -> list[str]:
    rows = ["| kernel | dtype | constants | warps | stages | registers | spill stores / loads (B) "
            "| shared (B) |",
            "|---|---|---|---|---|---|---|---|"]
    seen = set()
    for name, dtype, kernel in kernels:
        consts = triton_standin.named_constants(kernel)
        shown = {k: v for k, v in consts.items()
                 if k in ("DK", "DV", "BT", "BK", "BV", "SPLIT_V", "MOMENTUM", "IS_VARLEN", "SPLIT", "IEEE",
                          "BLOCK_B", "BLOCK_H")
                 and (k not in ("IS_VARLEN", "SPLIT") or v)}   # marked on the packed / split kernels only
        key = (name, dtype, str(shown.items()), kernel.metadata.num_warps)
        if key in seen:
            continue
        seen.add(key)
        regs, stores, loads = triton_standin.registers_and_spills(kernel)
        text = " ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in shown.items())
        meta = kernel.metadata
        rows.append(f"| {name} | {dtype} | {text} | {meta.num_warps} | {meta.num_stages} "
                    f"| {regs} | {stores} / {loads} | {meta.shared} |")
    return rows


def code_rows(compiled) -> list[dict]:
    """helpers/ptx_record.py's rows of the compiled kernels: key (with the signature: argument dtypes and
    alignment), label, code, registers, spills."""
    rows = []
    for name, dtype, kernel in compiled:
        consts = " ".join(f"{k}={v}" for k, v in sorted(triton_standin.named_constants(kernel).items()))
        regs, stores, loads = triton_standin.registers_and_spills(kernel)
        meta = kernel.metadata
        label = f"{name} {dtype} {consts} warps {meta.num_warps} stages {meta.num_stages}"
        rows.append({"key": f"{label} {sorted(kernel.src.signature.items())}", "label": label,
                     "code": ptx_record.code_fingerprint(kernel.asm["ptx"]), "registers": regs,
                     "spills": [stores, loads]})
    return rows


def dtype_case(text: str) -> tuple:
    """"bf16" → ("bf16", None): the --dims head sizes; "tf32:128" or "fp16:64,128" → its own."""
    name, _, dims = text.partition(":")
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    try:
        return name, [int(d) for d in dims.split(",")] if dims else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"head sizes after ':' must be integers, got {dims!r}") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, choices=sorted(triton_standin.DEVICES), default=90)
    parser.add_argument("--dtypes", nargs="+", type=dtype_case, default=["bf16", "fp16", "fp32"],
                        help=f"{'/'.join(sorted(DTYPES))}, each with its own head sizes if given (tf32:128)")
    parser.add_argument("--dims", nargs="+", type=int, default=[64, 128],
                        help="head sizes of the dtypes given without")
    parser.add_argument("--table", action="store_true",
                        help="print registers and spills per kernel (every kept config at every tuning key)")
    parser.add_argument("--ptx-record", metavar="FILE", help="write each compiled kernel's code, registers "
                        "and spills to FILE (JSON)")
    parser.add_argument("--same-ptx-as", metavar="FILE", help="exit 1 naming each kernel whose code differs "
                        "from FILE's record (made with the same options in another revision)")
    args = parser.parse_args()
    stand_in = triton_standin.activate(args.arch)

    import torch

    from plugins.attention.triton import (
        chunk_kernels,
        feature_marks,
        fused_chunk_kernels,
        fused_recurrent,
        split,
    )
    allow_cpu_tensors()

    chunked = [chunk_kernels.fwd_h, chunk_kernels.fwd_o, chunk_kernels.bwd_dh,
               chunk_kernels.bwd_dv, chunk_kernels.bwd_dqk, split.merge_splits]
    fused = [getattr(fused_chunk_kernels, name) for name in ("fused_fwd", "fused_bwd_dkv", "fused_bwd_dq")]
    if not args.table:
        sweep_first_key_only(chunked[:5] + fused)
    compiled = []
    cases = [(name, dims or args.dims) for name, dims in args.dtypes]
    first = (cases[0][0], cases[0][1][0])
    # the fused kernels, one pass per row, at the first bf16 head size they take (other dtypes:
    # tests/test_attention_triton.py compiles them); none where no bf16 case has one
    fused_case = next(((name, D) for name, dims in cases for D in dims
                       if name == "bf16" and fused_chunk_kernels.fits(D, D)), None)
    for name, dims in cases:
        torch.set_float32_matmul_precision("high" if name == "tf32" else "highest")
        dtype = getattr(torch, DTYPES[name])
        for D in dims:
            before = triton_standin._NoLaunch.launches
            attention(dtype, D)
            if (name, D) == first:
                with split_every_chunk():          # merge_splits reads fp32 states: one dtype suffices
                    attention(dtype, D, momentum_only=True)
            if (name, D) == fused_case:
                with fused_scans():
                    attention(dtype, D, momentum_only=True)
            lstm_recurrences(dtype, D)
            kept = compiled_count(chunked)
            attention(dtype, D, B=4, H=2, N=1024)            # other buckets of N and B·H
            recompiled = compiled_count(chunked) - kept
            print(f"sm_{args.arch} {name} D={D}: {triton_standin._NoLaunch.launches - before} launches, "
                  f"{recompiled} kernels compiled for other shape buckets", flush=True)
            if recompiled:
                print("a new autotuning bucket compiled kernels: the buckets must stay unspecialised "
                      "arguments", file=sys.stderr)
                return 1
        large_step(dtype, LARGE_DK)
        print(f"sm_{args.arch} {name} step Dk={LARGE_DK}: launched", flush=True)
        if name == "bf16" and 64 in dims:          # compiled above: the direct launcher's check is cheap here
            from triton_direct_launch_check import compare
            failures = compare()
            if failures:
                print("\n".join(failures), file=sys.stderr)
                return 1
    kernels = chunked + (fused if fused_case is not None else []) + [fused_recurrent.step_kernel]
    kernels += [feature_marks.finite_features_fwd, feature_marks.finite_features_bwd,
                feature_marks.mark_causal_kernel]
    kernels += LSTM_KERNELS
    for kernel in kernels:
        name = kernel.fn.__name__ if hasattr(kernel, "configs") else kernel.__name__.lstrip("_")
        count = sum(1 for _ in triton_standin.compiled_kernels(kernel))
        if count == 0:
            print(f"kernel {name} was never compiled", file=sys.stderr)
            return 1
        for ck in triton_standin.compiled_kernels(kernel):
            compiled.append((name, kernel_dtype(ck), ck))
    print(f"sm_{args.arch}: {len(compiled)} attention kernels compiled, {len(stand_in.utils.loaded)} loaded; "
          f"largest shared memory {max(s for _, s in stand_in.utils.loaded)} B")
    if args.ptx_record or args.same_ptx_as:
        rows = code_rows(compiled)
        if args.ptx_record:
            ptx_record.write(args.ptx_record, rows)
        if args.same_ptx_as:
            changed = ptx_record.differences(json.loads(Path(args.same_ptx_as).read_text()), rows)
            print(f"sm_{args.arch}: {len(rows)} compiled kernels against {args.same_ptx_as}: "
                  f"{len(changed)} keys with other code")
            if changed:
                print("\n".join(changed), file=sys.stderr)
                return 1
    waiting = unpipelined(compiled)
    if waiting:
        print("chunk loops that load each chunk only when they reach it (Triton's software pipeline did "
              "not apply):\n" + "\n".join(waiting), file=sys.stderr)
        return 1
    if args.table:
        print("\n".join(resource_table(compiled)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
