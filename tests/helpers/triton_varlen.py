"""Packed-row inputs and the per-segment float64 reference shared by the Triton varlen and split tests."""
import torch

from plugins.attention.naive import naive_recurrent_momentum_attention
from plugins.attention.state import MomentumAttentionState

from .triton_attention import assert_matches, run_with_grads

EPS = 1e-6


def offsets(lengths):
    return torch.tensor([0] + lengths).cumsum(0)


def packed_inputs(gen, H, T, Dk, Dv):
    """Feature-mapped q, k (elu + 1 of random numbers) and random v, one row of T tokens."""
    fq, fk = (torch.nn.functional.elu(torch.randn(1, H, T, Dk, generator=gen, dtype=torch.float64)) + 1
              for _ in range(2))
    return fq, fk, torch.randn(1, H, T, Dv, generator=gen, dtype=torch.float64)


def random_state(gen, n, H, Dk, Dv):
    return MomentumAttentionState(s=torch.randn(n, H, Dk, Dv, generator=gen, dtype=torch.float64),
                                  z=torch.rand(n, H, Dk, generator=gen, dtype=torch.float64) * 3,
                                  m=torch.randn(n, H, Dk, Dv, generator=gen, dtype=torch.float64))


def each_segment_alone(fq, fk, v, cu, state0, beta, gamma):
    """The float64 reference: eq. 12 token by token on every segment as its own batch-1 sequence,
    from its own initial state (zeros without one); outputs concatenated, states stacked."""
    outs, states = [], []
    for s in range(len(cu) - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        st = None if state0 is None else MomentumAttentionState(state0.s[s:s + 1], state0.z[s:s + 1],
                                                                 state0.m[s:s + 1])
        out, st = naive_recurrent_momentum_attention(fq[:, :, a:b], fk[:, :, a:b], v[:, :, a:b], st,
                                                     momentum=beta, step_size=gamma, feature_map="identity",
                                                     eps=EPS)
        outs.append(out)
        states.append(st)
    return torch.cat(outs, 2), MomentumAttentionState(*(torch.cat([getattr(st, name) for st in states])
                                                        for name in ("s", "z", "m")))


def packed_case(gen, lengths, H, Dk, Dv, init):
    """A packed row of segments of `lengths`: cu_seqlens (int64), q, k, v, the segments' initial
    states (None unless `init`) and random float64 gradients of the output and the final s, z, m."""
    cu = offsets(lengths)
    n, T = len(lengths), sum(lengths)
    inputs = packed_inputs(gen, H, T, Dk, Dv)
    state0 = random_state(gen, n, H, Dk, Dv) if init else None
    ups = [torch.randn(1, H, T, Dv, generator=gen, dtype=torch.float64),
           torch.randn(n, H, Dk, Dv, generator=gen, dtype=torch.float64),
           torch.randn(n, H, Dk, generator=gen, dtype=torch.float64),
           torch.randn(n, H, Dk, Dv, generator=gen, dtype=torch.float64)]
    return cu, inputs, state0, ups


def check_packed_segments(tri, gen, *, lengths, H, Dk, Dv, chunk, beta, gamma, init):
    """The kernels on one packed row of segments of `lengths` (`cu_seqlens`), from random initial
    states if `init`, against each segment run alone through eq. 12's float64 token loop: outputs,
    per-segment final states and every gradient, each within TOL."""
    cu, inputs, state0, ups = packed_case(gen, lengths, H, Dk, Dv, init)
    ref = run_with_grads(lambda q, k, x, st: each_segment_alone(q, k, x, cu, st, beta, gamma),
                         inputs, state0, ups, torch.float64)
    got = run_with_grads(lambda q, k, x, st: tri.chunk_momentum_attention(
        q, k, x, momentum=beta, step_size=gamma, eps=EPS, chunk_size=chunk, initial_state=st,
        cu_seqlens=cu.to(torch.int32), return_state=True), inputs, state0, ups, torch.float32)
    assert_matches(got, ref)
