"""The buffers both Adam/RMSProp LSTM recurrences (MomentumRNN, eq. 15 with eq. 2) fill, and how
both forward passes end. Shared by the torch loop (adam_recurrence.py) and the fused Triton steps
(adam_recurrence_triton.py) so that imports run one way: adam_recurrence → adam_recurrence_triton
(its optional fast path) → this module."""
import torch


def final_entries(seq, sizes, batch):
    """Each sequence's entry at its own length: seq (T+1, B, N) -> (B, N). Equal lengths
    take the last entry without building (and copying to the device) an index."""
    if sizes[-1] == batch:
        return seq[-1]
    lengths = (torch.tensor(sizes)[:, None] > torch.arange(batch)).sum(0)
    return seq[lengths.to(seq.device), torch.arange(batch, device=seq.device)]


def forward_buffers(g, v0, h0, c0, m0, bias_hh, momentum, batch_sizes):
    """What both forward passes (the torch loop and the Triton steps) fill: the step sizes, hs, cs
    (T+1, B, H) from h0, c0; rs (T, B, 4H); vs (T+1, B, 4H) from v0, or None when μ = 0; a
    contiguous working copy of m0; and b_hh (zeros when absent)."""
    steps, batch, width = g.shape
    sizes = batch_sizes or [batch] * steps
    # rows past a sequence's end must read as 0 (padded output, weight gradient)
    alloc = torch.empty if batch_sizes is None else torch.zeros
    hs = alloc((steps + 1, batch, width // 4), dtype=g.dtype, device=g.device)
    cs = torch.empty_like(hs)
    rs = torch.empty_like(g)
    vs = None
    if momentum:
        vs = torch.empty((steps + 1, batch, width), dtype=g.dtype, device=g.device)
        vs[0] = v0
    hs[0], cs[0] = h0, c0
    m = m0.clone(memory_format=torch.contiguous_format)
    bias = g.new_zeros(width) if bias_hh is None else bias_hh.contiguous()
    return sizes, hs, cs, rs, vs, m, bias


def forward_results(ctx, config, g, vs, weight_hh, bias_hh, hs, cs, rs, m):
    """How both forward passes end: save what the backward needs (config starts with the
    step sizes), and return hs with each sequence's final c, v (None when μ = 0) and m."""
    ctx.save_for_backward(g, vs, weight_hh, bias_hh, hs, cs, rs)
    ctx.config = config
    sizes, batch = config[0], g.size(1)
    v_final = None if vs is None else final_entries(vs, sizes, batch)
    return hs, final_entries(cs, sizes, batch), v_final, m
