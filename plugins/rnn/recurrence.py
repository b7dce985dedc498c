"""Fused Adam/RMSProp LSTM recurrence (eq. 15) with a hand-written backward pass.

torch's fused LSTM kernels cannot take a precomputed, per-step normalised input
pre-activation, and an autograd loop over `lstm_cell` spends most of its time in autograd
bookkeeping. This Function runs eq. 15 step by step on (B, 4H) tensors with in-place ops
(they stay in cache, unlike whole-sequence passes) and back-propagates through time by
hand: the usual LSTM BPTT plus the m_t recursion.

Gates are laid out (i, f, o, g) here so that one sigmoid covers three of them; callers
permute the rows of their weights (GATE_ORDER). Packed sequences use the batch_sizes
convention of torch's kernels: the batch is sorted by decreasing length and step t only
touches the first batch_sizes[t] rows, so finished rows keep their state.
"""
import torch


def gate_order(hidden):
    """Row permutation from torch's gate order (i, f, g, o) to (i, f, o, g), and back."""
    rows = torch.arange(4 * hidden).view(4, hidden)
    forward = rows[[0, 1, 3, 2]].reshape(-1)
    return forward, torch.argsort(forward)


def _rows(tensors, n, batch):
    return tensors if n == batch else [t[:n] for t in tensors]


class AdamLSTMRecurrence(torch.autograd.Function):
    """For t = 1..T (eq. 15 with eq. 2, gate rows ordered i, f, o, g):

        m_t = β m_{t-1} + (1−β) g_t⊙g_t;   r_t = (m_t + ε)^(−1/2)
        gates_t = v_t⊙r_t + b_hh + U h_{t-1};   c_t = f⊙c_{t-1} + i⊙c̃;   h_t = o⊙tanh(c_t)

    v is None for RMSProp (μ = 0), where v_t = s g_t. Inputs: v, g (T, B, 4H); h0, c0
    (B, H); m0 (B, 4H); weight_hh (4H, H); bias_hh (4H) or None; batch_sizes: list of ints
    or None. Returns hs (T+1, B, H) (hs[0] = h0; rows past a sequence's end are 0) and each
    sequence's final c (B, H) and m (B, 4H).
    """

    @staticmethod
    def forward(ctx, v, g, h0, c0, m0, weight_hh, bias_hh, step_size, beta, eps, batch_sizes):
        steps, batch, width = g.shape
        hidden = width // 4
        sizes = batch_sizes or [batch] * steps
        # rows past a sequence's end must read as 0 (padded output, weight gradient)
        alloc = torch.empty if batch_sizes is None else torch.zeros
        hs = alloc((steps + 1, batch, hidden), dtype=g.dtype, device=g.device)
        cs = torch.empty_like(hs)
        acts = torch.empty_like(g)
        derivs = torch.empty_like(acts)
        tanh_c = torch.empty_like(hs[1:])
        rs = torch.empty_like(acts)
        hs[0], cs[0] = h0, c0
        m = m0.clone()
        bias = g.new_zeros(width) if bias_hh is None else bias_hh
        w_t = weight_hh.t()
        sig, tanh_rows = slice(0, 3 * hidden), slice(3 * hidden, width)
        for t, views in enumerate(zip(g.unbind(0), g.unbind(0) if v is None else v.unbind(0),
                                      acts.unbind(0), derivs.unbind(0), rs.unbind(0),
                                      tanh_c.unbind(0))):
            n = sizes[t]
            g_t, v_t, a, der, r, tc = _rows(views, n, batch)
            m_n, h_prev, c_prev, c, h = _rows((m, hs[t], cs[t], cs[t + 1], hs[t + 1]), n, batch)
            m_n.mul_(beta).addcmul_(g_t, g_t, value=1.0 - beta)
            torch.add(m_n, eps, out=r).rsqrt_()
            torch.addcmul(bias, v_t, r, value=step_size if v is None else 1.0, out=a)
            a.addmm_(h_prev, w_t)
            a[:, sig].sigmoid_()
            a[:, tanh_rows].tanh_()
            # derivatives of the gate nonlinearities: a − a² (sigmoid), 1 − a² (tanh)
            torch.mul(a, a, out=der)
            torch.sub(a[:, sig], der[:, sig], out=der[:, sig])
            der[:, tanh_rows].neg_().add_(1.0)
            torch.mul(a[:, hidden:2 * hidden], c_prev, out=c).addcmul_(a[:, :hidden],
                                                                      a[:, tanh_rows])
            torch.tanh(c, out=tc)
            torch.mul(a[:, 2 * hidden:3 * hidden], tc, out=h)
        lengths = (torch.tensor(sizes)[:, None] > torch.arange(batch)).sum(0).to(g.device)
        c_final = cs[lengths, torch.arange(batch, device=g.device)]
        ctx.save_for_backward(v, g, weight_hh, hs, cs, acts, derivs, tanh_c, rs)
        ctx.config = (sizes, step_size, beta, bias_hh is not None)
        return hs, c_final, m

    @staticmethod
    def backward(ctx, grad_hs, grad_c, grad_m):
        v, g, weight_hh, hs, cs, acts, derivs, tanh_c, rs = ctx.saved_tensors
        sizes, step_size, beta, has_bias = ctx.config
        steps, batch, width = g.shape
        hidden = width // 4
        dh = torch.zeros_like(hs[0])
        dc = torch.zeros_like(cs[0])
        dm = grad_m.clone()
        alloc = torch.empty_like if sizes[-1] == batch else torch.zeros_like
        dgates, dv, dg = alloc(acts), alloc(g), alloc(g)
        scratch = torch.empty_like(g[0])
        for t in reversed(range(steps)):
            n = sizes[t]
            done = sizes[t + 1] if t + 1 < steps else 0
            if done < n:  # rows whose last step is t receive the final-c gradient
                dc[done:n] += grad_c[done:n]
            dh_n, dc_n, dm_n, tmp = _rows((dh, dc, dm, scratch), n, batch)
            a, der, d, r, tc, h, c_prev, g_t, dv_t, dg_t = _rows(
                (acts[t], derivs[t], dgates[t], rs[t], tanh_c[t], hs[t + 1], cs[t], g[t],
                 dv[t], dg[t]), n, batch)
            v_t = g_t if v is None else v[t, :n]
            i, f, o, c_tilde = a.split(hidden, 1)
            di, df, do, dc_tilde = d.split(hidden, 1)
            dh_n += grad_hs[t + 1, :n]
            torch.mul(dh_n, tc, out=do)
            # ∂h/∂c = o(1 − tanh²c) = o − tanh(c)·h
            dc_n.addcmul_(dh_n, o).addcmul_(do, h, value=-1.0)
            torch.mul(dc_n, c_tilde, out=di)
            torch.mul(dc_n, c_prev, out=df)
            torch.mul(dc_n, i, out=dc_tilde)
            dc_n.mul_(f)
            d.mul_(der)
            torch.mm(d, weight_hh, out=dh_n)
            # gates = v⊙r + …, r = (m + ε)^(−1/2): ∂/∂v = r, ∂/∂m = −½ v r³
            torch.mul(d, r, out=dv_t)
            torch.mul(dv_t, v_t, out=tmp).mul_(r)
            dm_n.addcmul_(tmp, r, value=-0.5 * (step_size if v is None else 1.0))
            torch.mul(dm_n, g_t, out=dg_t)
            dm_n.mul_(beta)
        dg.mul_(2.0 * (1.0 - beta))
        if v is None:
            dg.add_(dv, alpha=step_size)
            dv = None
        grad_w = torch.mm(dgates.view(-1, width).t(), hs[:-1].reshape(-1, hidden))
        grad_b = dgates.sum((0, 1)) if has_bias else None
        return (dv, dg, dh + grad_hs[0], dc, dm, grad_w, grad_b, None, None, None, None)
