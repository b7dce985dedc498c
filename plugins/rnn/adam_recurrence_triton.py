"""Adam/RMSProp LSTM recurrence (MomentumRNN, eq. 15 with eq. 2) as one fused Triton kernel per step.

Same contract as `adam_recurrence.AdamLSTMRecurrence` (gate rows ordered i, f, o, g; packed
sequences by batch_sizes; carried v, m, h, c), but each time step is

    forward:  pre = h_{t-1} W_hhᵀ (one GEMM, torch / cuBLAS), then ONE kernel for
              v_t, m_t, r_t = (m_t + ε)^(−1/2), gates = v_t⊙r_t + b_hh + pre, c_t, h_t;
    backward: ONE kernel for the LSTM and eq. 15 adjoints of the step, then one GEMM
              dh_{t-1} = δ_t W_hh.

instead of ~15 forward and ~25 backward small ops. `OneLaunchAdamLSTMRecurrence` (backend
"triton-one-launch") moves the GEMM into the step kernel, forward (h_{t-1} against the tile's
gate rows of W_hh) and backward (δ_{t+1} against the tile's columns of W_hh): one launch per
step instead of two, for GPUs where the host's launches, not the device, bound the loop
(docs/benchmarks.md: 3 × 70 steps at PTB). As in the torch Function the gate
activations are recomputed in the backward pass rather than stored: all pre-activations
h_{t-1} W_hhᵀ come from one batched GEMM over the saved h_0..h_{T-1}, and that buffer is
overwritten step by step with the gate adjoints δ_t, so the weight and bias gradients are one
GEMM and one sum after the loop.

Kernels run compiled on CUDA tensors and through Triton's interpreter on CPU tensors (tests;
also whenever TRITON_INTERPRET=1). The math is done in float32 (float64 for float64 tensors)
and stored in the tensors' dtype.
"""
import contextlib
import functools

import torch
import triton
import triton.language as tl

from ..triton_launch import cdiv, check_interpreter, direct, next_power_of_2, pin
from .adam_recurrence_buffers import forward_buffers, forward_results

BLOCK_H = 32
# tiles of the steps that run the GEMM themselves: 16 units (64 gate rows of W_hh), K 32 at a time
GEMM_BLOCK_H, GEMM_BLOCK_K = 16, 32


def _adam_lstm_forward_step(g_ptr, pre_ptr, hs_ptr, w_ptr, bias_ptr, m_ptr, vs_ptr, rs_ptr, cs_ptr, hyper_ptr,
                            t, rows, batch, hidden, HAS_V: tl.constexpr, COMPUTE: tl.constexpr,
                            GEMM: tl.constexpr, IEEE: tl.constexpr,
                            BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    """Eq. 15 and eq. 2 for rows [0, rows) of step t; m is updated in place. The recurrent
    pre-activation h_{t-1} W_hhᵀ is read from pre_ptr, or with GEMM computed here from h_{t-1}
    and w_ptr (W_hh, (4H, H)): the tile's 4·BLOCK_H gate rows of W_hh against all H units.

    g, r (T, B, 4H), v (T+1, B, 4H: v_{t-1} at t) and h, c (T+1, B, H) come whole and are indexed
    at t here, so that every step passes the same pointers: the host makes no per-step views,
    and the kernel compiled for the first step fits every other (`t` is not specialised on).

    A program owns BLOCK_B rows × BLOCK_H hidden units and all four gates of those units:
    gate k of unit j of row b sits at b·4H + k·H + j, held here as a (BLOCK_B, BLOCK_H, 4)
    tile. Only Triton builtins are used (no tl.sum / tl.sigmoid, which are themselves jit
    functions), so the kernel also runs in the interpreter when triton was imported without
    TRITON_INTERPRET.
    """
    step_wide = t.to(tl.int64) * batch * (4 * hidden)
    step_narrow = t.to(tl.int64) * batch * hidden
    g_ptr += step_wide
    r_ptr = rs_ptr + step_wide
    v_prev_ptr = vs_ptr + step_wide
    v_ptr = v_prev_ptr + batch * (4 * hidden)
    h_prev_ptr = hs_ptr + step_narrow
    h_ptr = h_prev_ptr + batch * hidden
    c_prev_ptr = cs_ptr + step_narrow
    c_ptr = c_prev_ptr + batch * hidden
    row = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    col = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    gate = tl.arange(0, 4)[None, None, :]
    mask2 = (row < rows)[:, None] & (col < hidden)[None, :]
    mask3 = mask2[:, :, None]
    wide = row[:, None, None] * (4 * hidden) + gate * hidden + col[None, :, None]
    narrow = row[:, None] * hidden + col[None, :]
    momentum = tl.load(hyper_ptr).to(COMPUTE)
    step_size = tl.load(hyper_ptr + 1).to(COMPUTE)
    beta = tl.load(hyper_ptr + 2).to(COMPUTE)
    one_minus_beta = tl.load(hyper_ptr + 3).to(COMPUTE)
    eps = tl.load(hyper_ptr + 4).to(COMPUTE)

    g = tl.load(g_ptr + wide, mask=mask3, other=0.0).to(COMPUTE)
    m = tl.load(m_ptr + wide, mask=mask3, other=0.0).to(COMPUTE)
    m = beta * m + one_minus_beta * (g * g)
    r = 1.0 / tl.sqrt(m + eps)
    tl.store(m_ptr + wide, m.to(m_ptr.dtype.element_ty), mask=mask3)
    tl.store(r_ptr + wide, r.to(r_ptr.dtype.element_ty), mask=mask3)
    if HAS_V:
        v = tl.load(v_prev_ptr + wide, mask=mask3, other=0.0).to(COMPUTE)
        v = momentum * v + step_size * g
        tl.store(v_ptr + wide, v.to(v_ptr.dtype.element_ty), mask=mask3)
        drive = v * r
    else:
        drive = step_size * (g * r)
    bias = tl.load(bias_ptr + gate * hidden + col[None, :, None],
                   mask=(col < hidden)[None, :, None], other=0.0).to(COMPUTE)
    if GEMM:
        # lane jj·4 + k of the product is gate k of unit jj, as in the (BLOCK_B, BLOCK_H, 4) tile
        lane = tl.arange(0, 4 * BLOCK_H)
        unit = tl.program_id(1) * BLOCK_H + lane // 4
        w_row = (lane % 4) * hidden + unit
        acc = tl.zeros((BLOCK_B, 4 * BLOCK_H), dtype=COMPUTE)
        for k0 in range(0, hidden, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            hh = tl.load(h_prev_ptr + row[:, None] * hidden + k[None, :],
                         mask=(row < rows)[:, None] & (k < hidden)[None, :], other=0.0)
            ww = tl.load(w_ptr + w_row[None, :] * hidden + k[:, None],
                         mask=(unit < hidden)[None, :] & (k < hidden)[:, None], other=0.0)
            if IEEE:
                acc += tl.dot(hh, ww, input_precision="ieee", out_dtype=COMPUTE)
            else:
                acc += tl.dot(hh, ww, out_dtype=COMPUTE)
        pre = tl.reshape(acc, (BLOCK_B, BLOCK_H, 4))
    else:
        pre = tl.load(pre_ptr + wide, mask=mask3, other=0.0).to(COMPUTE)
    z = drive + bias + pre
    # sigmoid for i, f, o; tanh(z) = 2 sigmoid(2z) − 1 for the candidate c̃
    z = tl.where(gate == 3, 2.0 * z, z)
    e = tl.exp(-tl.abs(z))  # sigmoid without overflow: e^{-|z|} ≤ 1
    a = tl.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    a = tl.where(gate == 3, 2.0 * a - 1.0, a)
    # gate k = 2p + q: split q (even: i, o; odd: f, c̃), then p
    even, odd = tl.split(tl.reshape(a, (BLOCK_B, BLOCK_H, 2, 2)))
    i, o = tl.split(even)
    f, c_tilde = tl.split(odd)

    c_prev = tl.load(c_prev_ptr + narrow, mask=mask2, other=0.0).to(COMPUTE)
    c = f * c_prev + i * c_tilde
    e = tl.exp(-2.0 * tl.abs(c))
    tanh_c = tl.where(c >= 0, 1.0, -1.0) * (1.0 - e) / (1.0 + e)
    tl.store(c_ptr + narrow, c.to(c_ptr.dtype.element_ty), mask=mask2)
    tl.store(h_ptr + narrow, (o * tanh_c).to(h_ptr.dtype.element_ty), mask=mask2)


def _adam_lstm_backward_step(delta_ptr, g_ptr, vs_ptr, rs_ptr, bias_ptr, cs_ptr, dh_ptr, w_ptr, grad_hs_ptr,
                             dc_ptr, dm_ptr, dv_ptr, dg_ptr, hyper_ptr, t, rows, batch, hidden,
                             HAS_V: tl.constexpr, COMPUTE: tl.constexpr, GEMM: tl.constexpr,
                             HAS_NEXT: tl.constexpr, IEEE: tl.constexpr,
                             BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    """Adjoint of step t of `_adam_lstm_forward_step` for rows [0, rows).

    delta (T, B, 4H) holds pre = h_{t-1} W_hhᵀ on entry and the gate adjoint δ = ∂L/∂gates on
    exit; dc, dm and dv carry ∂L/∂c_t, ∂L/∂m_t, ∂L/∂v_t in and ∂L/∂c_{t-1}, ∂L/∂m_{t-1},
    ∂L/∂v_{t-1} out; dh holds δ_{t+1} W_hh (∂L/∂h_t without the output's own gradient, grad_hs at
    t+1), or with GEMM it is computed here from δ_{t+1} (delta at t+1, all 4H gates of the tile's
    rows; 0 without HAS_NEXT, at the last step) and w_ptr (W_hh's columns of the tile's units).
    Rows in [rows, batch) have finished: their δ and ∂L/∂g are set to 0, their carried adjoints
    kept (so δ_{t+1} is 0 on rows that end at t, and their dh with it). The (T or T+1)-long
    buffers come whole and are indexed at t, as in the forward step.
    """
    step_wide = t.to(tl.int64) * batch * (4 * hidden)
    step_narrow = t.to(tl.int64) * batch * hidden
    delta_ptr += step_wide
    next_ptr = delta_ptr + batch * (4 * hidden)
    g_ptr += step_wide
    r_ptr = rs_ptr + step_wide
    dg_ptr += step_wide
    v_ptr = vs_ptr + step_wide + batch * (4 * hidden)
    c_prev_ptr = cs_ptr + step_narrow
    c_ptr = c_prev_ptr + batch * hidden
    grad_h_ptr = grad_hs_ptr + step_narrow + batch * hidden
    row = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    col = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    gate = tl.arange(0, 4)[None, None, :]
    active = (row < rows)[:, None, None]
    mask2 = (row < rows)[:, None] & (col < hidden)[None, :]
    mask3 = mask2[:, :, None]
    every3 = (row < batch)[:, None, None] & (col < hidden)[None, :, None]
    wide = row[:, None, None] * (4 * hidden) + gate * hidden + col[None, :, None]
    narrow = row[:, None] * hidden + col[None, :]
    momentum = tl.load(hyper_ptr).to(COMPUTE)
    step_size = tl.load(hyper_ptr + 1).to(COMPUTE)
    beta = tl.load(hyper_ptr + 2).to(COMPUTE)
    one_minus_beta = tl.load(hyper_ptr + 3).to(COMPUTE)

    # recompute the forward step's gate activations
    g = tl.load(g_ptr + wide, mask=mask3, other=0.0).to(COMPUTE)
    r = tl.load(r_ptr + wide, mask=mask3, other=0.0).to(COMPUTE)
    if HAS_V:
        v = tl.load(v_ptr + wide, mask=mask3, other=0.0).to(COMPUTE)
        drive = v * r
    else:
        v = g
        drive = step_size * (g * r)
    bias = tl.load(bias_ptr + gate * hidden + col[None, :, None],
                   mask=(col < hidden)[None, :, None], other=0.0).to(COMPUTE)
    z = drive + bias + tl.load(delta_ptr + wide, mask=mask3, other=0.0).to(COMPUTE)
    z = tl.where(gate == 3, 2.0 * z, z)
    e = tl.exp(-tl.abs(z))
    a = tl.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    a = tl.where(gate == 3, 2.0 * a - 1.0, a)
    even, odd = tl.split(tl.reshape(a, (BLOCK_B, BLOCK_H, 2, 2)))
    i, o = tl.split(even)
    f, c_tilde = tl.split(odd)
    c_prev = tl.load(c_prev_ptr + narrow, mask=mask2, other=0.0).to(COMPUTE)
    c = tl.load(c_ptr + narrow, mask=mask2, other=0.0).to(COMPUTE)
    e = tl.exp(-2.0 * tl.abs(c))
    tanh_c = tl.where(c >= 0, 1.0, -1.0) * (1.0 - e) / (1.0 + e)

    # eq. 2 backwards: h = o tanh(c), c = f c_prev + i c̃
    if GEMM:
        dh = tl.zeros((BLOCK_B, BLOCK_H), dtype=COMPUTE)
        if HAS_NEXT:
            for k0 in range(0, 4 * hidden, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                dd = tl.load(next_ptr + row[:, None] * (4 * hidden) + k[None, :],
                             mask=(row < rows)[:, None] & (k < 4 * hidden)[None, :], other=0.0)
                ww = tl.load(w_ptr + k[:, None] * hidden + col[None, :],
                             mask=(k < 4 * hidden)[:, None] & (col < hidden)[None, :], other=0.0)
                if IEEE:
                    dh += tl.dot(dd, ww, input_precision="ieee", out_dtype=COMPUTE)
                else:
                    dh += tl.dot(dd, ww, out_dtype=COMPUTE)
    else:
        dh = tl.load(dh_ptr + narrow, mask=mask2, other=0.0).to(COMPUTE)
    dh += tl.load(grad_h_ptr + narrow, mask=mask2, other=0.0).to(COMPUTE)
    dc = tl.load(dc_ptr + narrow, mask=mask2, other=0.0).to(COMPUTE)
    dc += dh * o * (1.0 - tanh_c * tanh_c)
    tl.store(dc_ptr + narrow, (dc * f).to(dc_ptr.dtype.element_ty), mask=mask2)
    upstream = tl.reshape(tl.join(tl.join(dc * c_tilde, dh * tanh_c), tl.join(dc * c_prev, dc * i)),
                          (BLOCK_B, BLOCK_H, 4))
    # through the nonlinearities: sigmoid' = a(1 − a), tanh' = 1 − a²
    delta = tl.where(active, upstream * tl.where(gate == 3, 1.0 - a * a, a * (1.0 - a)), 0.0)
    tl.store(delta_ptr + wide, delta.to(delta_ptr.dtype.element_ty), mask=every3)

    # eq. 15 backwards: gates = scale v⊙r + …, r = (m + ε)^(−1/2), v = μ v_prev + s g,
    # m = β m_prev + (1 − β) g², scale = 1 (s for μ = 0, where v is g): ∂/∂v = scale r,
    # ∂/∂m = −½ scale v r³
    dr = delta * r
    if HAS_V:
        dv = tl.load(dv_ptr + wide, mask=mask3, other=0.0).to(COMPUTE) + dr
        dg = step_size * dv
        tl.store(dv_ptr + wide, (momentum * dv).to(dv_ptr.dtype.element_ty), mask=mask3)
        dm_drive = -0.5 * (dr * v * r * r)
    else:
        dg = step_size * dr
        dm_drive = (-0.5 * step_size) * (dr * v * r * r)
    dm = tl.load(dm_ptr + wide, mask=mask3, other=0.0).to(COMPUTE) + dm_drive
    dg += (2.0 * one_minus_beta) * (dm * g)
    tl.store(dm_ptr + wide, (beta * dm).to(dm_ptr.dtype.element_ty), mask=mask3)
    tl.store(dg_ptr + wide, tl.where(active, dg, 0.0).to(dg_ptr.dtype.element_ty), mask=every3)


@functools.cache
def _kernel(fn, interpret):
    """`fn` compiled by triton.jit, or run by Triton's interpreter (CPU tensors). The rows a step
    updates change from step to step in packed batches: not specialised on, so that every step of
    a loop runs one compiled kernel (`_StepKernel` pins it). The interpreter's Triton floor is
    checked here, where the interpreter is chosen: `make triton-carry` compiles these kernels on
    CPU tensors with the GPU image's Triton 3.6 (tests/triton_launch_check.allow_cpu_tensors)."""
    if interpret:
        check_interpreter("recurrence backend 'torch' or 'cudnn'")
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(fn)
    return triton.jit(fn, do_not_specialize=["t", "rows"])


class _StepKernel:
    """Launches of one step kernel over a recurrence: kernel, tile and device fixed once.

    BLOCK_B follows the full batch, so packed steps with fewer rows reuse the same compiled
    kernel (only the grid shrinks); with the GEMM inside it is 16, the least tl.dot takes.
    Every step passes the same tensors and differs only in `t` and `rows`, which are not
    specialised on: the kernel is pinned per value of the switches (triton_launch.pin), and the
    later steps skip the direct launcher's key."""

    def __init__(self, fn, g, meta):
        self.kernel = direct(_kernel(fn, g.device.type != "cuda"))
        self.pins = {}
        batch, hidden = g.shape[1], g.shape[2] // 4
        gemm = meta["GEMM"]
        self.block_b = 16 if gemm else min(16, next_power_of_2(batch))
        block_h = GEMM_BLOCK_H if gemm else BLOCK_H
        self.columns = cdiv(hidden, block_h)
        self.meta = dict(meta, BLOCK_B=self.block_b, BLOCK_H=block_h, BLOCK_K=GEMM_BLOCK_K)
        self.device = torch.cuda.device(g.device) if g.is_cuda else contextlib.nullcontext()

    def __call__(self, rows, *args, **switches):
        grid = (cdiv(rows, self.block_b), self.columns)
        switch = tuple(switches.values())
        again = self.pins.get(switch)
        if again is None:
            self.pins[switch] = pin(self.kernel, grid, args, dict(self.meta, **switches))
        else:
            again(grid, *args)


def _constants(g, momentum, step_size, beta, eps, gemm):
    """μ, s, β, 1 − β, ε as a tensor (so that float64 runs get them unrounded) and the
    compile-time switches: whether v is kept (μ > 0), the dtype the math is done in, whether the
    recurrent GEMM runs in the step kernel and, if so, whether its float32 products are exact
    (IEEE; tf32 where torch allows it for float32 matmuls, as cuBLAS would)."""
    wide = g.dtype == torch.float64
    hyper = torch.tensor([momentum, step_size, beta, 1.0 - beta, eps],
                         dtype=torch.float64 if wide else torch.float32)
    if g.is_cuda:
        # from pinned memory the copy is queued behind the kernels instead of waiting for them
        hyper = hyper.pin_memory().to(g.device, non_blocking=True)
    ieee = wide or (g.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32)
    return hyper, {"HAS_V": bool(momentum), "COMPUTE": tl.float64 if wide else tl.float32,
                   "GEMM": gemm, "IEEE": gemm and ieee}


def _forward(ctx, gemm, g, v0, h0, c0, m0, weight_hh, bias_hh, momentum, step_size, beta, eps, batch_sizes):
    g = g.contiguous()
    _, batch, width = g.shape
    hidden = width // 4
    sizes, hs, cs, rs, vs, m, bias = forward_buffers(g, v0, h0, c0, m0, bias_hh, momentum, batch_sizes)
    weight = weight_hh.contiguous()
    w_t = weight.t()
    pre = torch.empty_like(g[0])
    hyper, meta = _constants(g, momentum, step_size, beta, eps, gemm)
    step = _StepKernel(_adam_lstm_forward_step, g, meta)
    h_seq = None if gemm else hs.unbind(0)           # the host GEMM's operands
    v_all = g if vs is None else vs                  # read only where μ > 0
    with step.device:
        for t, n in enumerate(sizes):
            if not gemm:
                torch.mm(h_seq[t] if n == batch else h_seq[t][:n], w_t, out=pre if n == batch else pre[:n])
            step(n, g, pre, hs, weight, bias, m, v_all, rs, cs, hyper, t, n, batch, hidden)
    return forward_results(ctx, (sizes, momentum, step_size, beta, eps), g, vs, weight_hh, bias_hh, hs, cs,
                           rs, m)


def _backward(ctx, gemm, grad_hs, grad_c, grad_v, grad_m):
    g, vs, weight_hh, bias_hh, hs, cs, rs = ctx.saved_tensors
    sizes, momentum, step_size, beta, eps = ctx.config
    steps, batch, width = g.shape
    hidden = width // 4
    grad_hs = grad_hs.contiguous()
    weight = weight_hh.contiguous()
    # final-state gradients enter each row at its last step: later steps never touch it
    dh = torch.zeros_like(hs[0])
    dc = grad_c.contiguous().clone()
    dm = grad_m.contiguous().clone()
    dv = None
    if momentum:
        dv = torch.zeros_like(g[0]) if grad_v is None else grad_v.contiguous().clone()
    dg = torch.empty_like(g)
    bias = g.new_zeros(width) if bias_hh is None else bias_hh.contiguous()
    h_prev = hs[:-1].reshape(steps * batch, hidden)
    delta = torch.mm(h_prev, weight.t()).view(steps, batch, width)
    hyper, meta = _constants(g, momentum, step_size, beta, eps, gemm)
    step = _StepKernel(_adam_lstm_backward_step, g, meta)
    d_seq = None if gemm else delta.unbind(0)        # the host GEMM's operands
    v_all, dv_or_g = (g, g) if vs is None else (vs, dv)   # read only where μ > 0
    with step.device:
        for t in reversed(range(steps)):
            n = sizes[t]
            step(batch, delta, g, v_all, rs, bias, cs, dh, weight, grad_hs, dc, dm, dv_or_g, dg, hyper, t, n,
                 batch, hidden, HAS_NEXT=gemm and t + 1 < steps)
            if not gemm:
                torch.mm(d_seq[t] if n == batch else d_seq[t][:n], weight, out=dh if n == batch else dh[:n])
    if gemm:
        # ∂L/∂h_0 from δ_1 (rows whose sequence is empty have δ = 0)
        torch.mm(delta[0], weight, out=dh)
    delta = delta.view(steps * batch, width)
    grad_w = torch.mm(delta.t(), h_prev)
    grad_b = delta.sum(0) if bias_hh is not None else None
    return (dg, dv, dh + grad_hs[0], dc, dm, grad_w, grad_b, None, None, None, None, None)


def _recurrence_function(name, gemm, doc):
    """The autograd Function of `_forward` / `_backward`, with the GEMM inside the step kernels or not."""
    class Recurrence(torch.autograd.Function):
        @staticmethod
        def forward(ctx, g, v0, h0, c0, m0, weight_hh, bias_hh, momentum, step_size, beta, eps, batch_sizes):
            return _forward(ctx, gemm, g, v0, h0, c0, m0, weight_hh, bias_hh, momentum, step_size, beta, eps,
                            batch_sizes)

        @staticmethod
        def backward(ctx, grad_hs, grad_c, grad_v, grad_m):
            return _backward(ctx, gemm, grad_hs, grad_c, grad_v, grad_m)

    Recurrence.__name__ = Recurrence.__qualname__ = name
    Recurrence.__doc__ = doc
    return Recurrence


TritonAdamLSTMRecurrence = _recurrence_function(
    "TritonAdamLSTMRecurrence", False,
    """`adam_recurrence.AdamLSTMRecurrence` (same arguments and results) on the fused Triton steps, each
    step a cuBLAS GEMM and a Triton kernel.""")
OneLaunchAdamLSTMRecurrence = _recurrence_function(
    "OneLaunchAdamLSTMRecurrence", True,
    """`TritonAdamLSTMRecurrence` with the recurrent GEMM inside the step kernel: one launch per
    step, forward and backward (plus one GEMM after the backward loop, for ∂L/∂h_0).""")
