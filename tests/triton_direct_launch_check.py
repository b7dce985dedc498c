"""plugins.triton_launch.direct against Triton's own dispatch, through Triton's real launch path
with the stand-in driver of `triton_standin` (compiled kernels, no-op launches that record what
they were given): the same calls with direct launching off and on (twice: the second from its
cache) must launch the same compiled kernels (by hash) with the same grids and arguments.

    python tests/triton_direct_launch_check.py       # exit 0 when they agree
tests/triton_launch_check.py runs `compare` after compiling bf16 at D = 64 (the same kernels).
Cases: dense, padded (lengths) with an initial state and the final state's gradient, packed
(cu_seqlens), the split scans, β = 0, the Triton entry with v aligned and then not (at the same
shapes, with an initial state: chunk.py's launch plans must tell the two apart; every planned
launch also checks its arguments' key, triton_launch.VERIFY_PLANS), a decoding step, then one
whose v is not 16-byte aligned (Triton specialises on alignment), and the Adam / RMSProp LSTM
steps of both Triton recurrences (pinned per loop, triton_launch.pin);
then the autotuner's cache cleared (direct launching starts over with it). Must run with
TRITON_INTERPRET unset."""
import functools
import os
import sys
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET: the interpreter skips the launcher this script checks")

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import triton_standin  # noqa: E402  (the stand-in must be active before any kernel is used)


def cases():
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence
    from triton_launch_check import split_every_chunk, trusted_path

    from plugins.attention import MomentumAttentionState, momentum_attention, momentum_attention_step
    from plugins.attention.triton import chunk_momentum_attention, fused_recurrent_step
    from plugins.rnn import MomentumLSTM
    from plugins.rnn.adam_recurrence import recurrence_backend

    gen = torch.Generator().manual_seed(0)
    bf16 = torch.bfloat16

    def leaf(*shape, dtype=bf16):
        return torch.randn(*shape, generator=gen).to(dtype).requires_grad_()

    def dense(beta=0.6, N=150):
        q, k, v = (leaf(2, 2, N, 64) for _ in range(3))
        momentum_attention(q, k, v, momentum=beta, backend="triton").float().sum().backward()

    def padded():
        q, k, v = (leaf(2, 2, 150, 64) for _ in range(3))
        mask = torch.ones(2, 150, dtype=torch.bool)
        mask[1, 90:] = False
        init = MomentumAttentionState(s=leaf(2, 2, 64, 64, dtype=torch.float32),
                                      z=leaf(2, 2, 64, dtype=torch.float32),
                                      m=leaf(2, 2, 64, 64, dtype=torch.float32))
        out, state = momentum_attention(q, k, v, momentum=0.6, padding_mask=mask, initial_state=init,
                                        return_state=True, backend="triton")
        (out.float().sum() + state.s.sum() + state.m.sum() + state.z.sum()).backward()

    def packed():
        cu = torch.tensor([0, 1, 40, 150], dtype=torch.int32)
        q, k, v = (leaf(1, 2, 150, 64) for _ in range(3))
        out, _ = chunk_momentum_attention(q, k, v, momentum=0.6, step_size=0.8, eps=1e-6, chunk_size=64,
                                          cu_seqlens=cu)
        out.float().sum().backward()

    def split():
        with split_every_chunk():
            dense()

    def step():
        q, k, v = (torch.randn(2, 2, 1, 64, generator=gen).to(bf16) for _ in range(3))
        state = MomentumAttentionState.zeros(2, 2, 64, 64, dtype=torch.float32, device=q.device)
        momentum_attention_step(q, k, v, state, momentum=0.6, backend="triton")

    def lstm():
        """Both Triton recurrences, whose step kernels are pinned per loop (every step passes the
        same buffers, indexed at the step in the kernel): hidden 64 (bf16 steps of 384 bytes),
        whole and packed (steps of 3, 2 and 1 rows), and hidden 5, whose 30-byte steps would
        alternate alignment as views."""
        for backend in ("triton", "triton-one-launch"):
            for cell in ("adam", "rmsprop"):
                for hidden, lengths in ((64, None), (64, [9, 4, 1]), (5, [9, 4, 1])):
                    model = MomentumLSTM(16, hidden, num_layers=1, cell=cell).to(bf16)
                    x = torch.randn(9, 3, 16, generator=gen).to(bf16).requires_grad_()
                    with recurrence_backend(backend):
                        if lengths is None:
                            out = model(x)[0]
                        else:
                            out = model(pack_padded_sequence(x, torch.tensor(lengths)))[0].data
                        out.float().sum().backward()

    def chunk_entry(offset, with_state=False):
        """The Triton entry's forward and backward (launch plans of chunk.py) at one shape, v starting
        `offset` elements into its buffer, with an initial state or without: a plan's signature that
        missed v's alignment or the state would launch kernels specialised for another of them."""
        q, k = (torch.rand(1, 2, 150, 64, generator=gen).to(bf16).requires_grad_() for _ in range(2))
        v = torch.randn(2 * 150 * 64 + offset, generator=gen).to(bf16)[offset:].view(1, 2, 150, 64)
        v.requires_grad_()
        init = None
        if with_state:
            init = MomentumAttentionState(s=torch.zeros(1, 2, 64, 64), z=torch.zeros(1, 2, 64),
                                          m=torch.zeros(1, 2, 64, 64))
        out, _ = chunk_momentum_attention(q, k, v, momentum=0.6, step_size=0.8, eps=1e-6, chunk_size=64,
                                          initial_state=init)
        out.float().sum().backward()

    def layer_misaligned_q():
        """A decoder layer's call (`attend`) whose q starts 2 bytes past an aligned address, after the
        aligned calls of the trusted path at the same shape: the feature kernels' launch plans must
        tell the two apart."""
        from plugins.attention.attend import attend
        from plugins.attention.spec import AttentionSpec
        B, N, H, D = 2, 150, 2, 64
        base = torch.randn(B * N * H * D + 1, generator=gen).to(bf16)
        q = base[1:].view(B, N, H, D).requires_grad_()
        k, v = (leaf(B, N, H, D) for _ in range(2))
        spec = AttentionSpec(momentum=0.6, step_size=0.8, backend="triton")
        attend(*(t.transpose(1, 2) for t in (q, k, v)), spec).float().sum().backward()

    def entry_step(offset):
        """A decoding step through the Triton entry point (feature-mapped bf16 inputs), v starting
        `offset` elements into its buffer: 1 puts it 2 bytes past an aligned address, which
        reaches the kernel as it is (one small kernel to compile for that specialisation)."""
        q, k = (torch.rand(2, 2, 64, generator=gen).to(bf16) for _ in range(2))
        v = torch.randn(2 * 2 * 64 + offset, generator=gen).to(bf16)[offset:].view(2, 2, 64)
        state = MomentumAttentionState.zeros(2, 2, 64, 64, dtype=torch.float32, device=q.device)
        fused_recurrent_step(q, k, v, state, momentum=0.6, step_size=0.8, eps=1e-6)

    def keywords():
        """A small kernel: a grid that reads a positional argument by name, then arguments Triton
        specialises on passed by keyword (n = 1 and a float), which go through Triton's dispatch."""
        from plugins.triton_launch import direct
        scale = _scale_kernel()
        x, y = torch.randn(100, generator=gen), torch.empty(100)

        def grid(meta):
            return (-(-meta["n"] // meta["BLOCK"]),)
        for _ in range(2):
            direct(scale)[grid](x, y, 100, 2.0, BLOCK=32)
            direct(scale)[grid](x, y, n=1, factor=2.0, BLOCK=32)
            direct(scale)[grid](x, y, 64, factor=3.0, BLOCK=16)

    return [("dense", dense), ("padded", padded), ("packed", packed), ("split scans", split),
            ("β = 0", lambda: dense(beta=0.0, N=200)),
            ("trusted path", lambda: trusted_path(leaf, 2, 2, 150, 64)),
            ("trusted path, q misaligned", layer_misaligned_q), ("decoding step", step),
            ("chunk entry", lambda: chunk_entry(0)), ("chunk entry, misaligned v", lambda: chunk_entry(1)),
            ("chunk entry, an initial state", lambda: chunk_entry(0, with_state=True)),
            ("aligned v", lambda: entry_step(0)),
            ("misaligned v after aligned", lambda: entry_step(1)), ("Adam/RMSProp LSTM", lstm),
            ("keyword arguments", keywords)]


@functools.cache
def _scale_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def scale(x, y, n, factor, BLOCK: tl.constexpr):
        at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + at, tl.load(x + at, mask=at < n) * factor, mask=at < n)
    return scale


def recorded(fn):
    triton_standin._NoLaunch.record = []
    try:
        fn()
        return triton_standin._NoLaunch.record
    finally:
        triton_standin._NoLaunch.record = None


def compare() -> list[str]:
    """Runs every case with direct launching off, then on (twice); the differences, as messages.
    The stand-in must be active and CPU tensors allowed (triton_launch_check.allow_cpu_tensors)."""
    from plugins import triton_launch
    from plugins.attention.triton import chunk_kernels
    triton_launch.VERIFY_PLANS = True            # each planned launch also checks its arguments' key
    failures = []
    for name, case in cases():
        triton_launch.ENABLED = False
        case()                                   # autotuning's own launches stay out of the records
        expected = recorded(case)
        triton_launch.ENABLED = True
        for attempt in ("first", "cached"):
            try:
                got = recorded(case)
            except AssertionError as error:          # a launch plan's check (VERIFY_PLANS)
                failures.append(f"{name} ({attempt} direct launch): {error}")
                break
            if got != expected:
                at = next(i for i, (g, e) in enumerate(zip(got + [None], expected + [None])) if g != e)
                failures.append(f"{name} ({attempt} direct launch): {len(got)} launches, expected "
                                f"{len(expected)}; they differ from launch {at}: {got[at:at + 1]} "
                                f"instead of {expected[at:at + 1]}")
        print(f"direct launch, {name}: {len(expected)} launches agree", flush=True)
    launcher = triton_launch.direct(chunk_kernels.fwd_o)
    if not launcher.compiled:
        failures.append("fwd_o was never launched directly")
    if not triton_launch.VERIFIED:
        failures.append("no launch was made through a launch plan's key (chunk.py's plans)")
    print(f"direct launch: {triton_launch.VERIFIED} planned launches named the kernel their arguments' key "
          "names, on the grid their grid function gives", flush=True)
    failures += keys_of_a_seen_call(triton_launch, dict(cases()))
    failures += hooks_see_every_launch(dict(cases()))
    chunk_kernels.fwd_o.cache.clear()
    cases()[0][1]()
    if not chunk_kernels.fwd_o.cache:
        failures.append("after the autotuner's cache was cleared, direct launching did not go through it")
    print("direct launch: after the autotuner's cache was cleared it went through the autotuner again",
          flush=True)
    return failures


def keys_of_a_seen_call(triton_launch, named) -> list[str]:
    """The Triton entry's forward+backward, a decoder layer's (`attend`: the feature and marks
    kernels too) and a decoding step's (the marked step, and the entry's plain step), called again
    with inputs that describe alike compute no launch's key: every launch is planned."""
    counted, key = [], triton_launch.DirectLaunch.key
    triton_launch.VERIFY_PLANS = False
    triton_launch.DirectLaunch.key = lambda self, args, kwargs: counted.append(1) or key(self, args, kwargs)
    failures = []
    try:
        for name in ("chunk entry", "trusted path", "decoding step", "aligned v"):
            named[name]()
            counted.clear()
            named[name]()
            if counted:
                failures.append(f"{name}, called again alike: {len(counted)} launch keys computed, "
                                "expected none (a launch outside every launch plan)")
            print(f"direct launch, {name} called again alike: {len(counted)} launch keys", flush=True)
    finally:
        triton_launch.DirectLaunch.key = key
    return failures


def hooks_see_every_launch(named) -> list[str]:
    """With a launch hook registered (Triton's profiler registers one), every launch of a layer's
    call (launch plans) and of the LSTM recurrences' loops (pinned steps) goes through Triton's
    runner, which calls it: none is launched past it."""
    from triton import knobs
    failures = []
    for name in ("trusted path", "Adam/RMSProp LSTM"):
        called = []

        def hook(metadata):
            called.append(1)
        knobs.runtime.launch_enter_hook.add(hook)
        try:
            launches = len(recorded(named[name]))
        finally:
            knobs.runtime.launch_enter_hook.remove(hook)
        print(f"direct launch, {name} with a launch hook: {len(called)} of {launches} launches called it",
              flush=True)
        if len(called) != launches:
            failures.append(f"{name}: a launch hook was called for {len(called)} of {launches} launches")
    return failures


def main() -> int:
    triton_standin.activate(90)
    from triton_launch_check import allow_cpu_tensors
    allow_cpu_tensors()
    failures = compare()
    for failure in failures:
        print("FAILED", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
