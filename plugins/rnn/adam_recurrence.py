"""Fused Adam/RMSProp LSTM recurrence (eq. 15) with a hand-written backward pass.

torch's fused LSTM kernels cannot take a per-step normalised input pre-activation, and an
autograd loop over `lstm_cell` spends most of its time in autograd bookkeeping. This
Function runs eq. 15 step by step on (B, 4H) tensors with in-place ops and
back-propagates through time by hand: the usual LSTM BPTT plus the v_t and m_t
recursions. Only the input pre-activation g = W x + b enters as a whole sequence; v and m
are formed inside the loop. Fresh (T, B, 4H) buffers are the main cost at small batch
sizes (every new page is a page fault), so the gate activations are recomputed in the
backward pass from v_t, r_t and h_{t-1} rather than stored, and the weight gradient is
accumulated step by step; per-step temporaries live in reused (B, 4H) scratch tensors.

Gates are laid out (i, f, o, g) here so that one sigmoid covers three of them; callers
permute the rows of their weights (`gate_order`). Packed sequences use the batch_sizes
convention of torch's kernels: the batch is sorted by decreasing length and step t only
touches the first batch_sizes[t] rows, so finished rows keep their state.

On CUDA tensors `AdamLSTMRecurrence.apply` runs the same recurrence as fused Triton steps
(adam_recurrence_triton.py) when triton is installed: one kernel per step with the recurrent GEMM
inside up to ONE_LAUNCH_MAX_HIDDEN units, a cuBLAS GEMM and one kernel above; `recurrence_backend`
forces either implementation, or ("cudnn") takes MomentumLSTM's Adam/RMSProp layers off this
Function altogether: onto torch's fused LSTM kernel, fed eq. 15's drive of every step
(layers.MomentumLSTM._drive_first_layer). torch.export always takes that form (`drive_first`).
"""
import contextlib
import functools
import importlib.util
import os

import torch

from ..exported_eps import eps_operand
from ..exporting import is_exporting
from ..graph_breaks import eager_under_compile
from ..validation import check_choice
from .adam_recurrence_buffers import forward_buffers, forward_results

BACKENDS = ("auto", "torch", "triton", "triton-one-launch", "cudnn")
# "auto" puts the recurrent GEMM inside the step kernel (one launch per step) up to this many hidden
# units, where the launches bound the step loop: on an H200 (docs/benchmarks.md, 2026-12-04) it took
# 0.40x the two-launch step's time at pMNIST's 256 units (batch 128) and 1.58x at PTB's 1150 (batch 20)
ONE_LAUNCH_MAX_HIDDEN = 256
# the process's default, read once at import (as MOMENTUM_TRITON_SCAN for attention)
_backend = check_choice(os.environ.get("MOMENTUM_LSTM_RECURRENCE", "auto"), "MOMENTUM_LSTM_RECURRENCE",
                        BACKENDS)


@contextlib.contextmanager
def recurrence_backend(name):
    """Inside the block eq. 15 runs on `name`: "torch" (AdamLSTMRecurrence's own loop),
    "triton" (adam_recurrence_triton: a cuBLAS GEMM and a Triton kernel per step, compiled on
    CUDA tensors, Triton's interpreter on CPU tensors), "triton-one-launch" (the same with the
    GEMM inside the step kernel: one launch per step), "cudnn" (MomentumLSTM's layers, and the
    tanh MomentumRNN's, form eq. 15's drive for all steps first and run torch's fused LSTM or
    tanh-RNN kernel on it: cuDNN on CUDA, one call per layer, no step loop in Python; aten on CPU)
    or "auto" (on CUDA tensors when triton is installed: triton-one-launch up to
    ONE_LAUNCH_MAX_HIDDEN hidden units, triton above; else torch). Outside any block:
    MOMENTUM_LSTM_RECURRENCE (default auto)."""
    global _backend
    previous, _backend = _backend, check_choice(name, "backend", BACKENDS)
    try:
        yield
    finally:
        _backend = previous


@functools.cache
def _triton_recurrences():
    """{backend: its autograd Function} for "triton" and "triton-one-launch", or None where triton
    is not installed (or, in a saved model's bundled code, where the kernels of this package are
    not importable)."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        from .adam_recurrence_triton import OneLaunchAdamLSTMRecurrence, TritonAdamLSTMRecurrence
    except ImportError:
        return None
    return {"triton": TritonAdamLSTMRecurrence, "triton-one-launch": OneLaunchAdamLSTMRecurrence}


def drive_first():
    """Whether the Adam/RMSProp layers of MomentumLSTM and of the tanh MomentumRNN run on torch's
    fused kernels ("cudnn"; elsewhere the tanh layers loop over the steps in Python), as they
    always do under torch.export: the other recurrences are autograd Functions whose forward
    writes into its buffers (out=, in place), which an exported program replays without their
    backward, so it would fail wherever gradients are enabled."""
    return _backend == "cudnn" or is_exporting()


def triton_available():
    return _triton_recurrences() is not None


def auto_backend(g):
    """The backend "auto" runs eq. 15 on for g (T, B, 4H): shape and device only, no host read."""
    if not (g.is_cuda and triton_available()):
        return "torch"
    return "triton-one-launch" if g.shape[-1] // 4 <= ONE_LAUNCH_MAX_HIDDEN else "triton"


def _triton_function(g):
    """The Triton Function that runs eq. 15 on g under the current backend, or None (the torch
    loop). Never reached under torch.export (`drive_first`)."""
    if _backend.startswith("triton"):
        if not triton_available():
            raise RuntimeError(f"recurrence backend {_backend!r} needs the triton package "
                               "(pip install momentum-plugins[triton])")
        return _triton_recurrences()[_backend]
    chosen = auto_backend(g) if _backend == "auto" else "torch"
    return None if chosen == "torch" else _triton_recurrences()[chosen]


@eager_under_compile
def adam_lstm_recurrence(g, *args):
    """`AdamLSTMRecurrence.apply`, behind an explicit graph break under torch.compile. Dynamo traces
    an autograd.Function's forward itself, past `apply` and whatever decorates it (so past the
    Triton dispatch there), and its tracing of this one's in-place steps failed with an internal
    assertion ("lift_tracked_freevar_to_input", a batch of one under dynamic shapes, two layers)
    instead of breaking the graph; torch.compile now always runs the recurrence eagerly."""
    return AdamLSTMRecurrence.apply(g, *args)


def gate_order(hidden, device=None):
    """Row permutation from torch's gate order (i, f, g, o) to (i, f, o, g), and back; built
    on `device` by slicing (a list index would be copied from the host)."""
    i, f, g, o = torch.arange(4 * hidden, device=device).view(4, hidden)
    forward = torch.cat([i, f, o, g])
    return forward, torch.argsort(forward)


def _rows(tensors, n, batch):
    return tensors if n == batch else [t[:n] for t in tensors]


class AdamLSTMRecurrence(torch.autograd.Function):
    """For t = 1..T (eq. 15 with eq. 2; gate rows ordered i, f, o, g):

        v_t = μ v_{t-1} + s g_t;   m_t = β m_{t-1} + (1−β) g_t⊙g_t;   r_t = (m_t + ε)^(−1/2)
        gates_t = v_t⊙r_t + b_hh + U h_{t-1};   c_t = f⊙c_{t-1} + i⊙c̃;   h_t = o⊙tanh(c_t)

    μ = 0 is RMSProp (no v is kept). Inputs: g (T, B, 4H); v0, m0 (B, 4H); h0, c0 (B, H);
    weight_hh (4H, H); bias_hh (4H) or None; batch_sizes: list of ints or None. Returns hs
    (T+1, B, H) (hs[0] = h0; rows past a sequence's end are 0) and each sequence's final
    c (B, H), v (B, 4H; None when μ = 0) and m (B, 4H).
    """

    @classmethod
    def apply(cls, g, *args):
        """This Function, or the fused Triton steps (same arguments and results): see
        `recurrence_backend`. Under torch.compile call it through `adam_lstm_recurrence`."""
        function = _triton_function(g)
        if function is not None:
            return function.apply(g, *args)
        return super().apply(g, *args)

    @staticmethod
    def _activations(a, v_t, r, h_prev, bias, w_t, scale, hidden):
        """Gate activations of one step into a: sigmoid(i, f, o), tanh(c̃)."""
        torch.addcmul(bias, v_t, r, value=scale, out=a)
        a.addmm_(h_prev, w_t)
        a[:, :3 * hidden].sigmoid_()
        a[:, 3 * hidden:].tanh_()
        return a.split(hidden, 1)

    @staticmethod
    def forward(ctx, g, v0, h0, c0, m0, weight_hh, bias_hh, momentum, step_size, beta, eps,
                batch_sizes):
        steps, batch, width = g.shape
        hidden = width // 4
        sizes, hs, cs, rs, vs, m, bias = forward_buffers(g, v0, h0, c0, m0, bias_hh, momentum,
                                                         batch_sizes)
        w_t = weight_hh.t()
        scale = 1.0 if momentum else step_size
        acts, tanh_c = torch.empty_like(g[0]), torch.empty_like(hs[0])
        eps_term = eps_operand(eps, g)
        for t, (g_t, r) in enumerate(zip(g.unbind(0), rs.unbind(0))):
            n = sizes[t]
            g_t, r, a, tc, m_n, h_prev, c_prev, c, h = _rows(
                (g_t, r, acts, tanh_c, m, hs[t], cs[t], cs[t + 1], hs[t + 1]), n, batch)
            m_n.mul_(beta).addcmul_(g_t, g_t, value=1.0 - beta)
            torch.add(m_n, eps_term, out=r).rsqrt_()
            v_t = g_t
            if momentum:
                v_prev, v_t = _rows((vs[t], vs[t + 1]), n, batch)
                torch.mul(v_prev, momentum, out=v_t).add_(g_t, alpha=step_size)
            i, f, o, c_tilde = AdamLSTMRecurrence._activations(a, v_t, r, h_prev, bias, w_t,
                                                               scale, hidden)
            torch.mul(f, c_prev, out=c).addcmul_(i, c_tilde)
            torch.mul(o, torch.tanh(c, out=tc), out=h)
        return forward_results(ctx, (sizes, momentum, step_size, beta), g, vs, weight_hh, bias_hh,
                               hs, cs, rs, m)

    @staticmethod
    def backward(ctx, grad_hs, grad_c, grad_v, grad_m):
        g, vs, weight_hh, bias_hh, hs, cs, rs = ctx.saved_tensors
        sizes, momentum, step_size, beta = ctx.config
        steps, batch, width = g.shape
        hidden = width // 4
        # final-state gradients enter each row at its last step: later steps never touch it
        dh = torch.zeros_like(hs[0])
        dc = grad_c.clone()
        dm = grad_m.clone()
        dv = None
        if momentum:
            dv = torch.zeros_like(g[0]) if grad_v is None else grad_v.clone()
        dg = (torch.empty_like if sizes[-1] == batch else torch.zeros_like)(g)
        grad_w = torch.zeros_like(weight_hh)
        d_sum = torch.zeros_like(g[0])
        bias = g.new_zeros(width) if bias_hh is None else bias_hh
        w_t = weight_hh.t()
        scale = 1.0 if momentum else step_size
        acts, dgates, scratch, tanh_c = (torch.empty_like(g[0]), torch.empty_like(g[0]),
                                         torch.empty_like(g[0]), torch.empty_like(hs[0]))
        for t in reversed(range(steps)):
            n = sizes[t]
            dh_n, dc_n, dm_n, tmp, d, a, tc, d_acc = _rows(
                (dh, dc, dm, scratch, dgates, acts, tanh_c, d_sum), n, batch)
            r, h, h_prev, c, c_prev, g_t, dg_t = _rows(
                (rs[t], hs[t + 1], hs[t], cs[t + 1], cs[t], g[t], dg[t]), n, batch)
            v_t = g_t if vs is None else vs[t + 1, :n]
            i, f, o, c_tilde = AdamLSTMRecurrence._activations(a, v_t, r, h_prev, bias, w_t,
                                                               scale, hidden)
            torch.tanh(c, out=tc)
            di, df, do, dc_tilde = d.split(hidden, 1)
            dh_n += grad_hs[t + 1, :n]
            torch.mul(dh_n, tc, out=do)
            # ∂h/∂c = o(1 − tanh²c) = o − tanh(c)·h
            dc_n.addcmul_(dh_n, o).addcmul_(do, h, value=-1.0)
            torch.mul(dc_n, c_tilde, out=di)
            torch.mul(dc_n, c_prev, out=df)
            torch.mul(dc_n, i, out=dc_tilde)
            dc_n.mul_(f)
            # through the nonlinearities: sigmoid' = a(1 − a), tanh' = 1 − a²
            d_sig, a_sig = d[:, :3 * hidden], a[:, :3 * hidden]
            d_sig.mul_(a_sig).addcmul_(d_sig, a_sig, value=-1.0)
            dc_tilde.addcmul_(dc_tilde * c_tilde, c_tilde, value=-1.0)
            grad_w.addmm_(d.t(), h_prev)
            d_acc += d
            torch.mm(d, weight_hh, out=dh_n)
            # gates = σ v⊙r + …, r = (m + ε)^(−1/2): ∂/∂v = σ r, ∂/∂m = −½ σ v r³
            torch.mul(d, r, out=tmp)
            if momentum:
                dv_n = dv[:n]
                dv_n.add_(tmp)
                torch.mul(dv_n, step_size, out=dg_t)
                dv_n.mul_(momentum)
            else:
                torch.mul(tmp, step_size, out=dg_t)
            tmp.mul_(v_t).mul_(r)
            dm_n.addcmul_(tmp, r, value=-0.5 * scale)
            dg_t.addcmul_(dm_n, g_t, value=2.0 * (1.0 - beta))
            dm_n.mul_(beta)
        grad_b = d_sum.sum(0) if bias_hh is not None else None
        return (dg, dv, dh + grad_hs[0], dc, dm, grad_w, grad_b,
                None, None, None, None, None)
