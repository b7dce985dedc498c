"""The update rule as one object (`plugins.attention.rule`): a toy rule registered here runs through
every path — padded rows (chunk), packed rows (varlen), decoding steps, eq. 14's sums and context
parallelism over 2 gloo ranks — and each equals this file's own float64 token-by-token recurrence
of that rule, forward and gradients, on lengths that are not multiples of the chunk size.

The toy rule is constant Nesterov-style look-ahead momentum:
    m'_i = βm'_{i−1} + φ(k_i)v_iᵀ,   s_i = s_{i−1} + γ(βm'_i + φ(k_i)v_iᵀ),
i.e. decay β, carry γβ², direct γ(1 + β). It is not eq. 12, so a kernel that still computed eq. 12's
coefficients itself would fail these tests."""
import json

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_ranks import spawn_gloo

from plugins.attention import MomentumAttentionState, momentum_attention, momentum_attention_step
from plugins.attention.api import attend_summary, summarize_keys
from plugins.attention.backends import triton_for
from plugins.attention.rule import RULES, MomentumRule, momentum_rule, register_rule
from plugins.attention.spec import AttentionSpec

BETA, GAMMA, EPS, CHUNK = 0.7, 0.6, 1e-6, 4
H, DK, DV = 2, 3, 4


def lookahead(momentum: float, step_size: float) -> MomentumRule:
    return MomentumRule(decay=momentum, carry=step_size * momentum ** 2, direct=step_size * (1 + momentum))


register_rule("lookahead", lookahead)


def phi(x):
    return F.elu(x) + 1


def reference(q, k, v, *, causal=True, state=None):
    """Float64 token-by-token look-ahead rule on one sequence q, k (H, N, DK), v (H, N, DV):
    outputs (H, N, DV) and the final (s, z, m) with m = −m'."""
    fq, fk = phi(q), phi(k)
    if state is None:
        s, z, mp_ = q.new_zeros(H, DK, DV), q.new_zeros(H, DK), q.new_zeros(H, DK, DV)
    else:
        s, z, mp_ = state.s, state.z, -state.m
    outs = []
    for i in range(q.shape[1]):
        kv = fk[:, i, :, None] * v[:, i, None, :]
        mp_ = BETA * mp_ + kv
        s = s + GAMMA * (BETA * mp_ + kv)
        z = z + fk[:, i]
        outs.append(torch.einsum("hd,hde->he", fq[:, i], s) / ((fq[:, i] * z).sum(-1, keepdim=True) + EPS))
    if not causal:
        outs = [torch.einsum("hd,hde->he", fq[:, i], s) / ((fq[:, i] * z).sum(-1, keepdim=True) + EPS)
                for i in range(q.shape[1])]
    out = torch.stack(outs, 1) if outs else v.new_zeros(H, 0, DV)
    return out, MomentumAttentionState(s=s[None], z=z[None], m=-mp_[None])


def leaves(*shapes, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_(True) for s in shapes]


def grads(out, weight, inputs):
    return torch.autograd.grad((out * weight).sum(), inputs)


def close(a, b, tol=1e-9):
    assert a.shape == b.shape
    assert torch.allclose(a, b, atol=tol, rtol=tol), float((a - b).abs().max())


def test_coefficients_equal_stepping_the_two_part_recurrence():
    """input_on_m/input_on_s/m_on_m/m_on_s against powers of the rule's 2×2 transition, stepped in
    float64, for random rules (momentum's r = β, p = γβ, q = γ among them)."""
    g = torch.Generator().manual_seed(3)
    for r, p, q in [(0.9, 0.9 * 0.5, 0.5), (0.0, 0.0, 1.0)] + [tuple(torch.rand(3, generator=g).tolist())
                                                             for _ in range(4)]:
        rule = MomentumRule(decay=r, carry=p, direct=q + 0.1)
        q = q + 0.1
        n = torch.arange(12)
        m_in, s_in = 1.0, q                 # one token's input on (m', s) at its own position
        m_from, s_from = 1.0, 0.0           # an entering m' = 1 before any token
        for i in range(12):
            assert abs(rule.input_on_m(n[i]) - m_in) < 1e-12 and abs(rule.input_on_s(n[i]) - s_in) < 1e-12
            assert abs(rule.m_on_m(n[i]) - m_from) < 1e-12 and abs(rule.m_on_s(n[i]) - s_from) < 1e-12
            s_in, m_in = s_in + p * m_in, r * m_in          # one more token with no input
            s_from, m_from = s_from + p * m_from, r * m_from


def test_the_momentum_rule_is_eq_12():
    rule = momentum_rule(0.8, 0.3)
    n = torch.arange(40, dtype=torch.float64)
    close(rule.input_on_s(n), 0.3 * (1 - 0.8 ** (n + 1)) / (1 - 0.8), 1e-14)
    close(rule.m_on_s(n), 0.3 * 0.8 * (1 - 0.8 ** n) / (1 - 0.8), 1e-14)
    assert rule.is_momentum and not lookahead(0.8, 0.3).is_momentum
    assert not momentum_rule(0.0, 1.0).carries_momentum


def test_bad_rules_and_names_are_refused():
    with pytest.raises(ValueError, match=r"decay must be in \[0, 1\)"):
        MomentumRule(decay=1.0, carry=0.0, direct=1.0)
    with pytest.raises(ValueError, match="direct must be > 0"):
        MomentumRule(decay=0.5, carry=0.0, direct=0.0)
    with pytest.raises(ValueError, match="cannot be replaced"):
        register_rule("momentum", lookahead)
    with pytest.raises(ValueError, match="rule must be one of"):
        AttentionSpec(0.5, rule="nesterov-typo")
    register_rule("broken", lambda b, g: (b, g))
    try:
        with pytest.raises(ValueError, match="must build a MomentumRule"):
            AttentionSpec(0.5, rule="broken")
    finally:
        del RULES["broken"]


def test_triton_runs_eq_12_only():
    cuda = torch.device("cuda")
    assert triton_for("auto", cuda, False, rule=lookahead(0.5, 1.0)) is None
    with pytest.raises(ValueError, match="momentum rule"):
        momentum_attention(*(torch.randn(1, 1, 3, 2) for _ in range(3)), momentum=0.5, rule="lookahead",
                           backend="triton")


def test_padded_rows_chunk_path(make_generator):
    N = 11
    q, k, v, w = leaves((2, H, N, DK), (2, H, N, DK), (2, H, N, DV), (2, H, N, DV), seed=1)
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[0, :3] = False
    mask[1, [4, 9, 10]] = False
    out = momentum_attention(q, k, v, momentum=BETA, step_size=GAMMA, padding_mask=mask, chunk_size=CHUNK,
                             backend="torch", rule="lookahead")
    got = grads(out, w, (q, k, v))
    for b in range(2):
        real = mask[b]
        ref, _ = reference(q[b][:, real], k[b][:, real], v[b][:, real])
        close(out[b][:, real], ref)
        assert not out[b][:, ~real].any()
        want = grads(ref, w[b][:, real], (q, k, v))
        for g_got, g_want in zip(got, want):
            close(g_got[b], g_want[b])


def test_packed_rows_varlen_path_with_states():
    cu = [0, 3, 9, 9, 14]
    N = cu[-1]
    q, k, v, w = leaves((1, H, N, DK), (1, H, N, DK), (1, H, N, DV), (1, H, N, DV), seed=2)
    out, state = momentum_attention(q, k, v, momentum=BETA, step_size=GAMMA, cu_seqlens=torch.tensor(cu),
                                    chunk_size=CHUNK, backend="torch", rule="lookahead", return_state=True)
    got = grads(out, w, (q, k, v))
    for s, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        ref, ref_state = reference(q[0, :, a:b], k[0, :, a:b], v[0, :, a:b])
        close(out[0, :, a:b], ref)
        for part in "szm":
            close(getattr(state, part)[s], getattr(ref_state, part)[0])
        if b > a:
            want = grads(ref, w[0, :, a:b], (q, k, v))
            for g_got, g_want in zip(got, want):
                close(g_got[0, :, a:b], g_want[0, :, a:b])


def test_decoding_steps_continue_a_prefill():
    N, prefix = 10, 6
    q, k, v = leaves((1, H, N, DK), (1, H, N, DK), (1, H, N, DV), seed=3)
    ref, ref_state = reference(q[0], k[0], v[0])
    kw = dict(momentum=BETA, step_size=GAMMA, chunk_size=CHUNK, backend="torch", rule="lookahead")
    out, state = momentum_attention(q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix], return_state=True,
                                    **kw)
    outs = [out]
    for i in range(prefix, N - 3):
        one = slice(i, i + 1)
        step, state = momentum_attention_step(q[:, :, one], k[:, :, one], v[:, :, one], state, **kw)
        outs.append(step)
    step, state = momentum_attention_step(q[:, :, N - 3:], k[:, :, N - 3:], v[:, :, N - 3:], state, **kw)
    outs.append(step)
    close(torch.cat(outs, 2)[0], ref)
    for part in "szm":
        close(getattr(state, part), getattr(ref_state, part))


def test_noncausal_sums_padded_and_packed():
    N = 9
    q, k, v = leaves((2, H, N, DK), (2, H, N, DK), (2, H, N, DV), seed=4)
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[1, :2] = False
    kw = dict(momentum=BETA, step_size=GAMMA, rule="lookahead")
    out = momentum_attention(q, k, v, causal=False, padding_mask=mask, chunk_size=CHUNK, **kw)
    summary = summarize_keys(k, v, padding_mask=mask, **kw)
    for b in range(2):
        ref, _ = reference(q[b][:, mask[b]], k[b][:, mask[b]], v[b][:, mask[b]], causal=False)
        close(out[b][:, mask[b]], ref)
        close(attend_summary(q[b:b + 1], summary.reorder(torch.tensor([b])))[0][:, mask[b]], ref)
    cu = torch.tensor([0, 4, 9])
    packed = momentum_attention(q[:1], k[:1], v[:1], causal=False, cu_seqlens=cu, chunk_size=CHUNK, **kw)
    for a, b in ((0, 4), (4, 9)):
        ref, _ = reference(q[0, :, a:b], k[0, :, a:b], v[0, :, a:b], causal=False)
        close(packed[0, :, a:b], ref)


CP_CASES = {"padded": dict(slices=[5, 6], batch=2), "packed": dict(slices=[6, 7], batch=1, cu=[0, 4, 9, 13]),
            "non-causal": dict(slices=[4, 5], batch=2, causal=False)}


def _cp_case(name, case, rank, group):
    batch, N = case["batch"], sum(case["slices"])
    q, k, v, w = leaves(*[(batch, H, N, d) for d in (DK, DK, DV, DV)], seed=len(name))
    lo = sum(case["slices"][:rank])
    hi = lo + case["slices"][rank]
    causal = case.get("causal", True)
    kw = dict(momentum=BETA, step_size=GAMMA, chunk_size=CHUNK, backend="torch", rule="lookahead",
              causal=causal, process_group=group)
    if "cu" in case:
        kw["cu_seqlens"] = torch.tensor(case["cu"])
    mine = [t[:, :, lo:hi].detach().requires_grad_(True) for t in (q, k, v)]
    out = momentum_attention(*mine, **kw)
    got = grads(out, w[:, :, lo:hi], mine)
    bounds = list(zip(case["cu"][:-1], case["cu"][1:])) if "cu" in case else [(0, N)]
    errors = []
    for b in range(batch):
        for a, e in bounds:
            ref, _ = reference(q[b, :, a:e], k[b, :, a:e], v[b, :, a:e], causal=causal)
            want = grads(ref, w[b, :, a:e], (q, k, v))
            x, y = max(a, lo), min(e, hi)
            if x >= y:
                continue
            errors.append(float((out[b, :, x - lo:y - lo] - ref[:, x - a:y - a]).abs().max()))
            for g_got, g_want in zip(got, want):
                errors.append(float((g_got[b, :, x - lo:y - lo] - g_want[b, :, x:y]).abs().max()))
    return max(errors)


def _cp_worker(rank, world, out_dir):
    results = {name: _cp_case(name, case, rank, dist.group.WORLD) for name, case in CP_CASES.items()}
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(results, f)


def test_context_parallel_over_two_ranks(tmp_path):
    spawn_gloo(_cp_worker, 2, str(tmp_path))
    for rank in range(2):
        for name, error in json.loads((tmp_path / f"rank{rank}.json").read_text()).items():
            assert error < 1e-9, (rank, name, error)
