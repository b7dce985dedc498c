"""Momentum filters of MomentumRNN (eq. 9, 15, Section 2.4), step-wise and for a whole sequence.

Every momentum cell feeds its recurrence a filtered input that does not depend on the
hidden state. For eq. 9, with g_t = W x_t + b the input pre-activation,

    v_t = μ_t v_{t-1} + s g_t  =  s Σ_{k≤t} (Π_{j=k+1..t} μ_j) g_k + (Π_{j≤t} μ_j) v_0,

so the momenta of all T steps come from one lower-triangular (T+1, T+1) *decay matrix*
M[t, k] = Π_{j=k+1..t} μ_j (column 0 weights the carried-in v_0), of which only
(chunk × chunk) blocks are ever formed (`filter_sequence`). Because g is linear in
x, the filter can also run on x itself: v_t = W x̃_t + b c_t
+ M[t, 0] v_0 with x̃_t = s Σ_k M[t, k] x_k and c_t = s Σ_k M[t, k]. The decay matrices
are built from their closed forms, never by dividing by small powers of μ, in float64 on
the sequence's device: no block is copied from the host, so on a GPU the forward pass
never makes the host wait for the device.
"""
import functools

import torch

from ..exported_eps import plus_eps


def closed_form_device(device):
    """Where the float64 closed forms are evaluated: the sequence's own device, except MPS,
    which has no float64 (there they are formed on the CPU and copied)."""
    device = torch.device(device)
    return torch.device("cpu") if device.type == "mps" else device


def restart_index(step, restart):
    """Position k ∈ {1, …, F} of global time step t ≥ 1 within its restart block.

    Section 2.4: μ = (t mod F)/(t mod F + 3) = (k−1)/(k+2) with k = ((t−1) mod F) + 1;
    F = None means no restart (k = t). Step 0 (nothing processed yet) maps to k = 0.
    """
    if restart is None:
        return step
    return torch.where(step > 0, torch.remainder(step - 1, restart) + 1, torch.zeros_like(step))


def nag_momentum(k):
    """NAG-style momentum μ_k = (k − 1)/(k + 2) (Section 2.4); μ_1 = 0 starts a block."""
    return (k - 1) / (k + 2)


def momentum_step(v, g, momentum, step_size):
    """One step of eq. 9's momentum: v_t = μ v_{t-1} + s g_t (μ may be a tensor)."""
    return momentum * v + step_size * g


def second_moment_dtypes(*tensors):
    """(the dtype `tensors` promote to, the dtype eq. 15's second moment and normaliser are computed
    in: float32 where that is float16, else the same). float16 cannot hold them: ε = 1e-8 is below
    its smallest subnormal (6e-8), and g⊙g underflows for |g| < 2.4e-4, so m + ε was 0 where g was
    small (the drive v/√(m + ε) then v/0, or 0/0 on zero inputs) and far from float32's below
    |g| ≈ 1e-2. bfloat16 has float32's range and keeps its own kernels."""
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    return dtype, torch.float32 if dtype == torch.float16 else dtype


def adam_step(v, m, g, momentum, step_size, beta, eps):
    """One step of eq. 15: v_t = μ v + s g; m_t = β m + (1−β) g⊙g; returns v/√(m+ε), v, m, in the
    dtype the inputs promote to, computed in float32 where that is float16 (`second_moment_dtypes`)."""
    dtype, wide = second_moment_dtypes(v, m, g)
    g = g.to(wide)
    v = momentum * v.to(wide) + step_size * g
    m = beta * m.to(wide) + (1.0 - beta) * g * g
    return tuple(t.to(dtype) for t in (v / torch.sqrt(plus_eps(m, eps)), v, m))


class ConstantDecay:
    """Decay of eq. 9 with constant μ: M[t, k] = μ^(t−k) for k ≤ t (one group)."""

    stationary = True  # M[t, k] depends on t − k only

    def __init__(self, momentum, length, device="cpu"):
        self.momentum, self.length, self.groups = float(momentum), length, 1
        self.device = closed_form_device(device)

    def matrix(self, rows, cols):
        """M[rows, cols] as a float64 (1, len(rows), len(cols)) tensor on rows' device."""
        lag = (rows[:, None] - cols[None, :]).to(torch.float64)
        return torch.where(lag >= 0, torch.pow(self.momentum, lag.clamp(min=0)), 0.0).unsqueeze(0)

    def filter_operands(self, n, chunks, step_size, device, dtype):
        """`stationary_filter`'s constants: s·M[1..n, 1..n] (every chunk's block), M[c·n, j·n]
        for c, j < chunks − 1 (the carry across chunks) and M[1..n, 0], cast to `dtype` on
        `device`. They depend on (μ, n, chunks, s) only, so eager calls share them with every
        layer and every later call (`_cached`); traced calls (symbolic sizes) and CUDA
        graph captures build their own."""
        if _builds_its_own(device, step_size):
            return _filter_operands(self.momentum, n, chunks, step_size, device, dtype)
        return _cached(_filter_operands, self.momentum, n, chunks, step_size, device, dtype)

    def carried_and_bias_channel(self, step_size, device, dtype):
        """(M[t, 0], c_t = s Σ_{1≤k≤t} M[t, k]) for t = 1..length, each (length,) in `dtype` on
        `device`: the weight of a carried-in v_0 (or m_0) and the bias channel, shared like
        `filter_operands`."""
        if _builds_its_own(device, step_size):
            return _constant_weights(self.momentum, self.length, step_size, device, dtype)
        return _cached(_constant_weights, self.momentum, self.length, step_size, device, dtype)


def _filter_operands(momentum, n, chunks, step_size, device, dtype):
    """ConstantDecay.filter_operands, formed in float64 on the closed forms' device."""
    decay = ConstantDecay(momentum, n * chunks, device)
    tau = torch.arange(n + 1, device=decay.device)
    ends = torch.arange(chunks, device=decay.device)[:-1] * n
    full, across = decay.matrix(tau, tau)[0], decay.matrix(ends, ends)[0]
    return tuple(t.to(device=device, dtype=dtype) for t in (step_size * full[1:, 1:], across, full[1:, 0]))


def _constant_weights(momentum, length, step_size, device, dtype):
    """ConstantDecay.carried_and_bias_channel: M[t, 0] and the filter of a constant 1 (as
    `bias_channel` forms it for any decay), both formed in float64 and then cast, as
    `_filter_operands` forms its constants. Autocast leaves float64 products alone, so a table
    first built inside an autocast region is the one that a float32 call outside it reads from the
    cache (it was a 16-bit product cast back, and another region's 16-bit type failed the concat)."""
    decay = ConstantDecay(momentum, length, device)
    ones = torch.ones(length, 1, 1, dtype=torch.float64, device=decay.device)
    tables = carried_weight(decay, 1)[:, 0], stationary_filter(ones, decay, step_size)[:, 0, 0]
    return tuple(t.to(device=device, dtype=dtype) for t in tables)


def _builds_its_own(device, step_size):
    """Whether a ConstantDecay's constants are built for this call alone: traced (symbolic
    sizes), inside a CUDA graph capture, or with a step size that is not a number."""
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    return torch.compiler.is_compiling() or capturing or not isinstance(step_size, (int, float))


@functools.lru_cache(maxsize=128)
def _cached(build, *key):
    """build(*key), once per key and process, as ordinary tensors even under
    torch.inference_mode (an inference tensor could not be saved for a later training call's
    backward). A few small tensors per key: a (chunk × chunk) block and vectors of T."""
    with torch.inference_mode(False), torch.no_grad():
        return build(*key)


class NAGDecay:
    """Decay of the NAG/SR momentum (Section 2.4), one group per distinct start step.

    start_step (G,) holds the number of steps each sequence has already processed. Inside
    a restart block k runs a, a+1, …, b and the product telescopes:
    Π_{j=a+1..b} (j−1)/(j+2) = a(a+1)(a+2) / (b(b+1)(b+2)); across a restart it is 0.
    """

    stationary = False

    def __init__(self, start_step, restart, length):
        self.device = closed_form_device(start_step.device)
        self.start, self.restart, self.length = start_step.to(self.device), restart, length
        self.groups = self.start.numel()

    def matrix(self, rows, cols):
        """M[rows, cols] as a float64 (G, len(rows), len(cols)) tensor on rows' device."""
        k_r, k_c = (restart_index(self.start[:, None] + i[None, :], self.restart).to(torch.float64)
                    for i in (rows, cols))
        lag = (rows[:, None] - cols[None, :]).to(torch.float64)
        same_block = (k_r[:, :, None] - k_c[:, None, :]) == lag
        cube = lambda k: k * (k + 1) * (k + 2)
        ratio = cube(k_c)[:, None, :] / cube(k_r)[:, :, None].clamp(min=1.0)
        decay = torch.where(same_block & (lag >= 0), ratio, 0.0)
        return torch.where(lag == 0, 1.0, decay)


class SegmentDecay:
    """Decay of a packed row: many sequences (segments) laid end to end in one row of N steps,
    each filtered exactly as if alone (issue 18). M[t, k] = 0 when steps t and k lie in
    different segments, so every segment's momentum starts from its own v_0 (a reset zeroes
    what the previous segment carried); inside a segment M is `base`, the decay of one
    sequence started at step 0 (the cell's own ConstantDecay / NAGDecay), read at the absolute
    step of each position: start_step[s] + its index in segment s, so NAG/SR schedules count
    from every segment's own start. Positions are 1-based (0: before the row), as for the
    other decays, and `filter_sequence` runs its chunks across segment boundaries unchanged.
    """

    stationary = False
    groups = 1

    def __init__(self, base, offsets, start_step):
        self.base, self.device = base, base.device
        lengths = offsets.diff()
        self.length, self.count = offsets.tolist()[-1], lengths.numel()  # a host copy: no device wait
        segment = torch.repeat_interleave(torch.arange(self.count), lengths).to(self.device)
        index = torch.arange(self.length, device=self.device) - offsets[:-1].to(self.device)[segment]
        self.start = start_step.to(self.device)
        self.segment = torch.cat([segment.new_full((1,), -1), segment])
        self.step = torch.cat([segment.new_zeros(1), self.start[segment] + index + 1])

    def matrix(self, rows, cols):
        """M[rows, cols] as a float64 (1, len(rows), len(cols)) tensor."""
        same = self.segment[rows][:, None] == self.segment[cols][None, :]
        return torch.where(same, self.base.matrix(self.step[rows], self.step[cols]), 0.0)

    def carried(self):
        """Weight of segment s's carried-in v_0 in v_t, float64 (N, n): M[t, start of s] on
        the steps of s, 0 elsewhere."""
        weight = self.base.matrix(self.step[1:], self.start)[0]
        mine = self.segment[1:, None] == torch.arange(self.count, device=self.device)[None, :]
        return torch.where(mine, weight, 0.0)


def filter_sequence(seq, decay, step_size, chunk=128):
    """Parallel form of eq. 9's filter without the carried state: s Σ_{1≤k≤t} M[t, k] seq_k.

    seq (T, B, D), decay a ConstantDecay / NAGDecay with G ∈ {1, B} groups; returns
    (T, B, D). Runs in chunks of `chunk` steps, each chunk's (chunk × chunk) block formed
    from the decay's closed form, so memory is O(T·chunk) and time O(T·chunk·B·D), never a
    T × T matrix: inside a chunk starting after step a the sum is dense, and the part before
    it enters through M[t, a] x̃_a, since the products of μ factor as M[t, k] = M[t, a] M[a, k]
    for k ≤ a ≤ t.
    """
    if decay.stationary:
        return stationary_filter(seq, decay, step_size, chunk)
    steps = seq.size(0)
    outs, prev = [], None
    for a in range(0, steps, chunk):
        b = min(a + chunk, steps)
        tau = torch.arange(a + 1, b + 1, device=decay.device)
        block = (step_size * decay.matrix(tau, tau)).to(device=seq.device, dtype=seq.dtype)
        part = seq[a:b]
        if block.size(0) == 1:
            y = torch.matmul(block[0], part.reshape(b - a, -1)).view_as(part)
        else:
            y = torch.einsum("btk,kbd->tbd", block, part)
        if prev is not None:
            carry = decay.matrix(tau, tau[:1] - 1)[:, :, 0]
            y = y + carry.to(device=seq.device, dtype=seq.dtype).t().unsqueeze(-1) * prev
        prev = y[-1]
        outs.append(y)
    return torch.cat(outs)


def stationary_filter(seq, decay, step_size, chunk=128):
    """`filter_sequence` for a decay that depends on the lag t − k only (constant μ): every
    chunk has the same (n × n) block, so all chunks go through one matrix product, and the
    carry between chunks is one more: the last rows obey L_c = e_c + M[n, 0] L_{c−1} (e_c
    the chunk's own part), i.e. L = A e with A[c, j] = M[c·n, j·n]. A fixed number of
    kernels for any T (the chunk loop launched ~20 per chunk); memory O(T + n² + (T/n)²)."""
    steps = seq.size(0)
    # traced with a symbolic length, the chunk stays `chunk` (min() would guard on the length)
    n = chunk if torch.compiler.is_compiling() else min(chunk, steps)
    chunks = -(-steps // n)
    block, across, carry = decay.filter_operands(n, chunks, step_size, seq.device, seq.dtype)
    x = seq.reshape(steps, -1)
    if chunks == 1 and not torch.compiler.is_compiling():
        # T ≤ chunk (PTB's 70 steps): the block times the sequence, without the chunk layout's
        # reshapes and transposes, each an op to issue forward and an autograd node backward
        return torch.matmul(block, x).view(seq.shape)
    # zeros for the last chunk's missing steps, cut off the result again: a copy of the sequence
    # forward and two of its gradient backward (the slice's, zero-filled, and the pad's), made only
    # where steps are missing (a traced length keeps them: asking would guard on the length)
    padded = torch.compiler.is_compiling() or chunks * n != steps
    if padded:
        x = torch.nn.functional.pad(x, (0, 0, 0, chunks * n - steps))
    x = x.view(chunks, n, -1).transpose(0, 1).reshape(n, -1)
    y = torch.matmul(block, x).view(n, chunks, -1).transpose(0, 1)
    if chunks > 1:
        last = torch.matmul(across, y[:-1, -1])
        shifted = torch.cat([torch.zeros_like(last[:1]), last])
        y = y + carry[None, :, None] * shifted[:, None, :]
    y = y.reshape(chunks * n, *seq.shape[1:])
    return y[:steps] if padded else y


def carried_weight(decay, batch):
    """Weight M[t, 0] of the carried-in v_0 in v_t for t = 1..T, as a float64 (T, B) tensor
    on the decay's device."""
    rows = torch.arange(decay.length + 1, device=decay.device)
    return decay.matrix(rows[1:], rows[:1])[:, :, 0].t().expand(-1, batch)


def carried_channels(decay, batch):
    """Input channels of the carried-in v_0 (their weights are v_0ᵀ), float64: (T, B, B), row b
    weighting v_0 of row b by M[t, 0]; for a SegmentDecay (N, 1, n), one per segment."""
    if isinstance(decay, SegmentDecay):
        return decay.carried().unsqueeze(1)
    return torch.diag_embed(carried_weight(decay, batch))


def bias_channel(decay, step_size, batch, dtype, device):
    """c_t = s Σ_{1≤k≤t} M[t, k]: how much of the input bias b the momentum v_t holds, (T, B).

    The filter of a constant 1 (chunked like every filter, O(T·chunk)); a constant μ's is
    formed once (ConstantDecay.carried_and_bias_channel)."""
    if decay.stationary:
        return decay.carried_and_bias_channel(step_size, device, dtype)[1][:, None].expand(-1, batch)
    ones = torch.ones(decay.length, decay.groups, 1, dtype=dtype, device=device)
    return filter_sequence(ones, decay, step_size)[..., 0].expand(-1, batch)


def second_moment(g_squared, m0, beta, chunked=False):
    """m_t = β m_{t-1} + (1−β) g_t⊙g_t over a sequence (eq. 15); g_squared (T, B, N).

    Default: a loop over T cheap (B, N) steps, the cheaper form on a CPU (the chunked one costs
    T·chunk·B·N multiply-adds there). chunked: eq. 15's m is eq. 9's filter with μ = β and
    s = 1 − β applied to g⊙g, so `stationary_filter` forms it in a fixed number of kernels for
    any T (for accelerators, where T small launches would bound the loop), plus M[t, 0] m_0;
    its terms are all ≥ 0, so no cancellation makes it less accurate than the loop.
    """
    if chunked:
        decay = ConstantDecay(beta, g_squared.size(0), g_squared.device)
        carried, _ = decay.carried_and_bias_channel(1.0 - beta, g_squared.device, g_squared.dtype)
        return stationary_filter(g_squared, decay, 1.0 - beta) + carried[:, None, None] * m0
    scaled = ((1.0 - beta) * g_squared).unbind(0)
    out = []
    m = m0
    for q in scaled:
        m = torch.add(q, m, alpha=beta)
        out.append(m)
    return torch.stack(out)
