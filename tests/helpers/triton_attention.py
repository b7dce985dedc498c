"""Inputs, float64 helpers and error measures shared by the Triton attention tests."""
import pytest
import torch

from plugins.attention.naive import naive_recurrent_momentum_attention
from plugins.attention.state import MomentumAttentionState

TOL = 1e-4                                   # relative RMS, fp32 kernels vs float64 references
SCANS = ["chunked", "fused"]                 # plugins.attention.triton.chunk.SCANS


def use_scan(monkeypatch, scan):
    """Run the chunked or the fused kernels (chunk.SCAN, which MOMENTUM_TRITON_SCAN sets)."""
    from plugins.attention.triton import chunk
    monkeypatch.setattr(chunk, "SCAN", scan)


def triton_ops():
    from plugins.attention import triton as tri
    if not tri.is_available():
        pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1")
    return tri


def rel_rms(got, expected):
    got, expected = got.detach().double(), expected.detach().double()
    return ((got - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt().clamp(min=1e-30)).item()


def features(gen, B, H, N, D, dtype=torch.float64):
    """Positive features as an elu+1 map would give (the kernels take feature-mapped inputs)."""
    return torch.nn.functional.elu(torch.randn(B, H, N, D, generator=gen, dtype=dtype)) + 1


def make_inputs(gen, B, H, N, Dk, Dv, lengths):
    fq, fk = features(gen, B, H, N, Dk), features(gen, B, H, N, Dk)
    v = torch.randn(B, H, N, Dv, generator=gen, dtype=torch.float64)
    real = torch.arange(N)[None, :] < lengths[:, None]
    keep = real[:, None, :, None]
    fq, fk, v = (torch.where(keep, t, torch.zeros(())) for t in (fq, fk, v))   # padded tokens are 0
    return fq, fk, v, real


def random_state(gen, B, H, Dk, Dv):
    return MomentumAttentionState(s=torch.randn(B, H, Dk, Dv, generator=gen, dtype=torch.float64),
                                  z=torch.rand(B, H, Dk, generator=gen, dtype=torch.float64) * 3,
                                  m=torch.randn(B, H, Dk, Dv, generator=gen, dtype=torch.float64))


def upstreams(gen, B, H, N, Dk, Dv):
    """Random float64 gradients of a loss (loss_of) w.r.t. the output and the final s, z, m."""
    return [torch.randn(B, H, N, Dv, generator=gen, dtype=torch.float64),
            torch.randn(B, H, Dk, Dv, generator=gen, dtype=torch.float64),
            torch.randn(B, H, Dk, generator=gen, dtype=torch.float64),
            torch.randn(B, H, Dk, Dv, generator=gen, dtype=torch.float64)]


def loss_of(out, state, ups):
    loss = (out * ups[0]).sum()
    if state is not None:
        loss = loss + (state.s * ups[1]).sum() + (state.z * ups[2]).sum() + (state.m * ups[3]).sum()
    return loss


def check_padded_batch(tri, gen, *, B, H, N, Dk, Dv, lengths, chunk, beta, gamma):
    """The kernels on a padded batch (`lengths`, a tensor of B) from a random initial state against
    eq. 12's float64 token loop: outputs, final s, z, m, and the gradients of q, k, v and of the
    initial state, each within TOL."""
    fq, fk, v, real = make_inputs(gen, B, H, N, Dk, Dv, lengths)
    state0 = random_state(gen, B, H, Dk, Dv)
    ups = upstreams(gen, B, H, N, Dk, Dv)
    ref = run_with_grads(lambda q, k, x, st: naive_recurrent_momentum_attention(
        q, k, x, st, momentum=beta, step_size=gamma, feature_map="identity", padding_mask=real),
        (fq, fk, v), state0, ups, torch.float64)
    got = run_with_grads(lambda q, k, x, st: tri.chunk_momentum_attention(
        q, k, x, momentum=beta, step_size=gamma, eps=1e-6, chunk_size=chunk, initial_state=st,
        lengths=lengths, return_state=True), (fq, fk, v), state0, ups, torch.float32)
    assert_matches(got, ref)


def run_with_grads(fn, inputs, state0, ups, dtype):
    """fn's output and state, and the gradients of a loss on both w.r.t. q, k, v (and the initial
    state if there is one)."""
    leaves = [t.to(dtype).requires_grad_() for t in inputs]
    st = None
    if state0 is not None:
        st = MomentumAttentionState(*(t.to(dtype).requires_grad_() for t in (state0.s, state0.z, state0.m)))
        leaves += [st.s, st.z, st.m]
    out, state = fn(*leaves[:3], st)
    return out, state, torch.autograd.grad(loss_of(out, state, [u.to(dtype) for u in ups]), leaves)


def assert_matches(got, ref):
    """(output, final state, gradients of q, k, v and of the initial s, z, m if given) of the
    kernels against the float64 reference's, each within TOL."""
    assert rel_rms(got[0], ref[0]) <= TOL
    for name in ("s", "z", "m"):
        assert rel_rms(getattr(got[1], name), getattr(ref[1], name)) <= TOL, f"state.{name}"
    for name, g, r in zip(["fq", "fk", "v", "s0", "z0", "m0"], got[2], ref[2]):
        assert rel_rms(g, r) <= TOL, f"d{name}: {rel_rms(g, r):.2e}"


def force_splits(monkeypatch, cps):
    """The launcher's split choice replaced: `cps` chunks per split, None = one pass."""
    from plugins.attention.triton import chunk

    def splits(rows, chunks, device):
        return (1, chunks) if cps is None else (-(-chunks // cps), cps)
    monkeypatch.setattr(chunk, "scan_splits", splits)
