"""Multi-layer MomentumLSTM / MomentumRNN with the nn.LSTM calling convention.

Every cell comes from the table in variants.py: which states it carries, its momentum
filter for the whole-sequence form and its one-step drive (used by `step`).

Fast path. The momentum of every cell depends on the input only (filters.py), so:
- plain cell ("lstm" / "rnn"): all layers in one call of torch's fused multi-layer kernel
  on the module's own parameter tensors, dropout between layers included, exactly nn.LSTM /
  nn.RNN's call; on CUDA the parameters live in one cuDNN buffer (`flatten_parameters`).
- momentum / nag / sr: the whole filtered sequence is formed first, in input space, as
  x̃_t = s Σ_k M[t, k] x_k plus a bias channel c_t and, for a carried-in v_0, B channels
  M[t, 0]·e_b whose input weights are v_0 itself. Then v_t = [W, b_ih, v_0ᵀ]·[x̃_t, c_t,
  M[t, 0] e_b] exactly, and the recurrence runs in torch's fused LSTM / tanh-RNN kernel
  with that input weight, at the cost of nn.LSTM with d + 1 (+ B) inputs (with INPUT_ALIGN > 1
  each part padded with zero channels to a multiple of it, so that the inputs' rows stay aligned);
  [W, b_ih] is kept between calls while no gradient is recorded (JoinedWeightCache). With μ ≡ 0
  the step size is folded into the input and the kernel gets the module's own weight.
- adam / rmsprop (LSTM): the input projection g = W x + b is one matrix product for all
  steps; v, m and the normalised pre-activation of eq. 15 are formed inside one fused
  per-step recurrence with a hand-written backward (adam_recurrence.py); under the recurrence
  backend "cudnn" they are formed for all steps first, as the tanh RNN forms them, and the
  recurrence is one fused LSTM call per layer with an identity input weight. The tanh RNN forms
  v/√(m + ε) for all steps first and loops over its cheap tanh steps under autograd.
Dropout between layers as in nn.LSTM, or with locked_dropout=True one mask per sequence shared
by its steps (AWD-LSTM's variational dropout, awd.py); the layers then run one by one.

Packed rows (`forward(..., cu_seqlens=...)` or `segment_starts=...`, segments.py): every
segment runs exactly as if alone. Plain and eq.-9 cells (MomentumLSTM, MomentumRNN) stay on
the row without padding: each layer's filter uses a SegmentDecay (filters.py; no momentum
crosses a segment start, NAG/SR count steps from each segment's start) and the fused kernel
runs the segments as a batch in torch's packed layout (the row's steps gathered into it and
scattered back by one index each). Cells with a second moment (eq. 15) and the orthogonal
RNN take the segments as a PackedSequence through their usual lengths path (padded to the
longest segment inside, as for any PackedSequence input): eq. 15's recurrence, torch loop or
Triton steps, then starts every segment from its own state with no change to its kernels.

bidirectional=True lays parameters, state rows and outputs out as nn.LSTM's: each layer's
backward direction is a layer of its own (`_reverse` parameters, its own v, m) run on every
sequence reversed within its length, the next layer reading [forward | backward]. It runs
whole sequences (padded or a PackedSequence, and a symbolic length under torch.export,
export_scan.py), not packed rows nor `step`.
"""
import contextlib
import functools
import math
import warnings

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.utils.rnn import PackedSequence

from ..exported_eps import plus_eps
from ..validation import check_bool, check_int, check_offsets, check_probability
from .adam_recurrence import adam_lstm_recurrence, drive_first, gate_order
from .awd import segment_ids, sequence_dropout
from .checks import check_input_dtype, check_sizes
from .export_scan import exports_a_length, scanned_forward
from .filters import (
    SegmentDecay,
    bias_channel,
    carried_channels,
    filter_sequence,
    second_moment,
    second_moment_dtypes,
)
from .lstm_cells import lstm_update
from .segments import check_host_offsets, check_offsets_metadata, offsets_from_starts, segment_layout
from .sequence import (
    RecurrentState,
    as_output,
    as_sequence,
    fused_packed,
    fused_recurrence,
    in_dtype,
    in_weight_dtype,
    initial_state,
    last_step,
    valid_mask,
)
from .variants import DEFAULT_CELL, Hyper, layer_hyper

# The filtered input's channels, and so its input weight's columns, are padded with zeros to a
# multiple of this (1: none). d + 1 channels (401 and 1151 at PTB's sizes) give every row an odd
# pitch, which the input GEMMs of cuDNN's LSTM and of cuBLAS can read only in their narrowest (4-byte)
# vectors; 8 aligns them, at the cost of two more kernels per layer (the zeros) in the forward. Unset
# until a GPU has timed both (benchmarks/rnn.py's momentum-padded, benchmarks/gpu_call.sh).
INPUT_ALIGN = 1


def input_map(x, decay, step_size, weight, bias, v0, joined=None):
    """(inp, w, b) such that the momentum of eq. 9 is v_t = w·inp_t + b for every step.

    decay None means μ ≡ 0 (v_t = s g_t): s is folded into the input, so w and b are the
    layer's own parameters when s = 1 (the plain cell), and torch's fused kernels (cuDNN on
    GPU) receive the module's tensors. Otherwise the filtered input gains a bias channel
    and, for a carried-in v_0 (None: none carried), B channels; see the module docstring.
    The input weight is then [W | b_ih] (`joined`, or formed here by `join_input_weight`),
    with v_0ᵀ appended when v_0 is carried; on CUDA cuDNN copies it into its layout
    (docs/benchmarks.md says why no persistent buffer holds it). Each part ends on a multiple of
    INPUT_ALIGN channels: zero channels with zero weights where it does not.
    """
    if decay is None:
        if step_size == 1:
            return x, weight, bias
        return step_size * x, weight, None if bias is None else step_size * bias
    steps, batch = x.shape[:2]
    cols = [filter_sequence(x, decay, step_size)]
    if bias is not None:
        cols.append(bias_channel(decay, step_size, batch, x.dtype, x.device).unsqueeze(-1))
    pad = aligning_channels(x.size(-1) + (bias is not None))
    if pad:
        cols.append(x.new_zeros(steps, batch, pad))
    w = join_input_weight(weight, bias) if joined is None else joined
    if v0 is not None:
        carried = carried_channels(decay, batch)
        # Zero weights (e.g. NAG's μ_1 = 0) drop the B channels; asking whether they are all
        # zero would make the host wait for an accelerator, and a traced graph (torch.export,
        # torch.compile) has no values to ask, so only eager calls on the CPU ask.
        if carried.device.type != "cpu" or torch.compiler.is_compiling() or bool(carried.any()):
            cols.append(carried.to(device=x.device, dtype=x.dtype))
            pad = aligning_channels(carried.size(-1))
            w = torch.cat([w, v0.t()] + ([v0.new_zeros(v0.size(1), pad)] if pad else []), 1)
            if pad:
                cols.append(x.new_zeros(steps, batch, pad))
    return torch.cat(cols, -1), w, None


def aligning_channels(width: int) -> int:
    """Zero channels that bring `width` channels to a multiple of INPUT_ALIGN."""
    return -width % INPUT_ALIGN


def join_input_weight(weight, bias):
    """[W | b_ih]: the input weight of the filtered input and its bias channel (eq. 9:
    v_t = W x̃_t + b_ih c_t), W itself when the layer has no input bias; then zero columns up to
    a multiple of INPUT_ALIGN (`input_map`)."""
    parts = [weight] + ([] if bias is None else [bias.unsqueeze(1)])
    pad = aligning_channels(weight.size(1) + len(parts) - 1)
    if pad:
        parts.append(weight.new_zeros(weight.size(0), pad))
    return weight if len(parts) == 1 else torch.cat(parts, 1)


class JoinedWeightCache:
    """[W | b_ih] of each layer (`join_input_weight`), formed once per weight change while no
    gradient is recorded (evaluation, `torch.no_grad`, `torch.inference_mode`).

    An entry is reused only for the same parameter objects with the same storage, dtype,
    device and version counters (`Tensor._version`, bumped by every in-place change made
    through the tensor, optimiser steps and `load_state_dict` included). Under autograd the
    weight is formed on every call and the cache is emptied: training optimisers that write
    through `.data` (fairseq's Adam does) bump no version counter, so a cache kept across
    training steps could hand out stale weights, and the saved weight's graph would tie
    successive forward passes together. The next evaluation after a training step therefore
    re-forms it. An in-place change through `.data` between two no-grad calls (PEFT's
    `merge_adapter` / `merge_and_unload` write so) is seen after the next `train()` / `eval()`
    of the layer, which empties the cache, or after `clear()`.
    """

    def __init__(self):
        self.entries = {}

    def clear(self):
        self.entries.clear()

    def get(self, k, weight, bias):
        if torch.is_grad_enabled():
            self.entries.clear()
            return join_input_weight(weight, bias)
        if torch.compiler.is_compiling():
            # a traced graph forms the join itself: the key's data pointers and version counters are
            # not traceable, and dynamo's rebuilding of the generator below at its graph break once
            # recursed without end (a process whose builtins' dict held itself: tests/conftest.py)
            return join_input_weight(weight, bias)
        tensors = (weight, bias)
        if any(t is not None and t.is_inference() for t in tensors):
            return join_input_weight(weight, bias)  # inference tensors have no version counter
        # INPUT_ALIGN too: the join's zero columns follow it
        key = (INPUT_ALIGN, *(None if t is None else (t.data_ptr(), t._version, t.dtype, t.device)
                              for t in tensors))
        entry = self.entries.get(k)
        if entry is None or entry[0] is not weight or entry[1] is not bias or entry[2] != key:
            entry = (weight, bias, key, join_input_weight(weight, bias))
            self.entries[k] = entry
        return entry[3]


def fused_weights(w, w_hh, b, b_hh, has_biases):
    """Weight list of one layer of torch's fused kernel (input bias zero when folded in w).

    On CUDA the list is views into one buffer, each weight after the one before, the layout of a
    layer's weights in cuDNN's buffer that nn.LSTM.flatten_parameters leaves its parameters in.
    cuDNN then reads that buffer; given separate tensors it zeroes a buffer of its own and copies
    the weights into it, gate by gate, on every call, with a warning ("RNN module weights are not
    part of single contiguous chunk of memory"). One concatenation forms it, and its backward is
    one concatenation of the weights' gradients (a split's). Under CUDA autocast torch's cuDNN
    wrapper casts the weights into a buffer of its own anyway, and they are handed over as they are."""
    weights = [w, w_hh] if not has_biases else [w, w_hh, torch.zeros_like(b_hh) if b is None else b, b_hh]
    return one_buffer(weights) if w.is_cuda and not torch.is_autocast_enabled("cuda") else weights


def one_buffer(tensors):
    """Views of `tensors`' values, one after the other in one new contiguous buffer (its storage
    starting with the first), differentiable: a concatenation, split again."""
    pieces = torch.cat([t.reshape(-1) for t in tensors]).split([t.numel() for t in tensors])
    return [piece.view(t.shape) for piece, t in zip(pieces, tensors)]


def recurrence_loop(step, pre, lengths, state):
    """Run `state = step(pre_t, state)` over t; state[0] is the output. Past a sequence's
    length its state is held, so the final state is the one at its last valid step."""
    steps, batch = pre.shape[:2]
    masks = None if lengths is None else valid_mask(lengths, steps, batch, pre.device)
    outs = []
    for t, p in enumerate(pre.unbind(0)):
        new = step(p, state)
        if masks is not None:
            new = tuple(torch.where(masks[t], n, s) for n, s in zip(new, state))
        state = new
        outs.append(state[0])
    out = torch.stack(outs)
    return (out if masks is None else out * masks), state


def segment_rows(state, full, index):
    """The initial state of the segments `index` (the non-empty ones): rows of `full` (the
    validated state of all segments), with v and the step counter left None where the caller
    gave none (no carried momentum channels, one NAG/SR decay group)."""
    given = state if isinstance(state, RecurrentState) else None
    rows = lambda t, dim=1: None if t is None else t.index_select(dim, index)
    return RecurrentState(rows(full.h), rows(full.c),
                          rows(full.v) if given is not None and given.v is not None else None,
                          rows(full.m),
                          rows(full.step, 0) if given is not None and given.step is not None else None)


def reverse_within_lengths(x, lengths):
    """x (T, B, C) with each column's first lengths[b] steps reversed, its padding left in place:
    the input of a backward direction (lengths None: the whole time axis; lengths on the host)."""
    if lengths is None:
        return x.flip(0)
    steps = torch.arange(x.size(0))[:, None]
    index = torch.where(steps < lengths[None, :], lengths[None, :] - 1 - steps, steps).to(x.device)
    return x.gather(0, index[:, :, None].expand_as(x))


def tanh_step(weight_hh):
    """One tanh-RNN step h_t = tanh(p_t + U h_{t-1}) on a precomputed p (eq. 9, eq. 15)."""
    def step(p, state):
        return (torch.tanh(torch.addmm(p, state[0], weight_hh.t())),)
    return step


class _MomentumLayers(nn.Module):
    plain = "lstm"
    gate_count = 4
    locked_dropout = False          # modules pickled before the option existed
    dropout_after_last_layer = False  # a subclass that also drops out the last layer's output

    def __init__(self, input_size, hidden_size, num_layers=1, *, cell=DEFAULT_CELL, momentum=None,
                 step_size=None, beta=None, eps=None, restart=None, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, locked_dropout=False):
        super().__init__()
        check_sizes(input_size, hidden_size)
        self.variant, hyper = layer_hyper(cell, self.plain, momentum, step_size, beta, eps, restart)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.num_layers = check_int(num_layers, "num_layers", low=1)
        self.cell = self.variant.name
        self.momentum, self.step_size, self.beta, self.eps, self.restart = hyper
        self.bias = check_bool(bias, "bias")
        self.batch_first = check_bool(batch_first, "batch_first")
        self.dropout = check_probability(dropout, "dropout")
        if self.dropout > 0 and self.num_layers == 1 and not self.dropout_after_last_layer:
            warnings.warn(f"dropout={dropout} with num_layers=1 has no effect: as in nn.LSTM, dropout is "
                          "applied between layers, after all but the last", UserWarning, stacklevel=2)
        self.locked_dropout = check_bool(locked_dropout, "locked_dropout")
        self.bidirectional = check_bool(bidirectional, "bidirectional")
        self.directions = 2 if self.bidirectional else 1
        self.joined_weights = JoinedWeightCache()
        for i in range(self.num_layers * self.directions):
            self._register_layer(self.layer_name(i),
                                 input_size if i < self.directions else hidden_size * self.directions)
        self.reset_parameters()
        self.flatten_parameters()

    @property
    def hyper(self) -> Hyper:
        """The cell's hyperparameters as its equations use them (rmsprop: μ = 0)."""
        return self.variant.hyper(self.momentum, self.step_size, self.beta, self.eps, self.restart)

    def _register_layer(self, k, d):
        width = self.gate_count * self.hidden_size
        self.register_parameter(f"weight_ih_l{k}", nn.Parameter(torch.empty(width, d)))
        self.register_parameter(f"weight_hh_l{k}",
                                nn.Parameter(torch.empty(width, self.hidden_size)))
        if self.bias:
            self.register_parameter(f"bias_ih_l{k}", nn.Parameter(torch.empty(width)))
            self.register_parameter(f"bias_hh_l{k}", nn.Parameter(torch.empty(width)))

    def extra_repr(self):
        read = "".join(f", {name}={getattr(self, name)}" for name in Hyper._fields
                       if getattr(self, name) is not None)
        both = ", bidirectional=True" if self.bidirectional else ""
        locked = ", locked_dropout=True" if self.locked_dropout else ""
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                f"cell={self.cell!r}{read}, batch_first={self.batch_first}{both}{locked}")

    def layer_name(self, i):
        """Suffix of the parameters of layer i, counted as nn.LSTM's state rows: layer i // 2
        (direction i % 2, "_reverse" for the backward one) when bidirectional, layer i otherwise."""
        if not self.bidirectional:
            return i
        return f"{i // 2}_reverse" if i % 2 else f"{i // 2}"

    def layer_parameters(self, k):
        get = lambda name: getattr(self, f"{name}_l{self.layer_name(k)}", None)
        substitutes = self.__dict__.get("_recurrent_substitutes")
        weight_hh = substitutes[k] if substitutes is not None else get("weight_hh")
        return get("weight_ih"), weight_hh, get("bias_ih"), get("bias_hh")

    @contextlib.contextmanager
    def trusted_states(self):
        """Within the block, a carried state's step counter is not checked against its range, a
        read from the device per call: for a caller whose states are this layer's own outputs (a
        model's cache, a carried training state), checked where they came in."""
        outer = self.__dict__.get("_trusted_states", False)
        self.__dict__["_trusted_states"] = True
        try:
            yield
        finally:
            self.__dict__["_trusted_states"] = outer

    @contextlib.contextmanager
    def substituted_recurrent_weights(self, recurrent_weight):
        """Within the block, layer k reads recurrent_weight(k, weight_hh_lk) (formed once, on entry) as
        its recurrent weight: AWD-LSTM's weight drop. Every read goes through `layer_parameters`, so a
        parametrized weight (a LoRA adapter, an orthogonal parametrization) is formed first and the
        gradients reach it through the substitute. None: nothing is substituted. A block inside
        another keeps the outer substitutes."""
        if recurrent_weight is None or self.__dict__.get("_recurrent_substitutes") is not None:
            yield
            return
        if not callable(recurrent_weight):
            raise ValueError(f"recurrent_weight must be a callable (k, weight_hh) -> weight, got "
                             f"{type(recurrent_weight).__name__}")
        self.__dict__["_recurrent_substitutes"] = [recurrent_weight(k, self.layer_parameters(k)[1])
                                                   for k in range(self.num_layers * self.directions)]
        try:
            yield
        finally:
            del self.__dict__["_recurrent_substitutes"]

    def _decay(self, steps, start_step):
        """Momentum filter of this cell for the whole-sequence form (filters.py); None when
        μ ≡ 0 or when the layer forms v inside its own recurrence."""
        if self.variant.has_m and self._recurrence_forms_v():
            return None
        return self.variant.decay(self.hyper, steps, start_step)

    def _recurrence_forms_v(self):
        """Whether this layer's eq.-15 recurrence forms v itself (then its input is not filtered)."""
        return False

    def _joined_input_weight(self, k, decay, weight, bias):
        """[W | b_ih] of layer k for input_map (None where it takes the plain weight: μ ≡ 0)."""
        return None if decay is None else self.joined_weights.get(k, weight, bias)

    def _input_map(self, k, x, decay, v0):
        """`input_map` of layer k's own weights (v0: the carried-in momentum, or None). Eq. 9's
        filter sums the inputs into the momentum state v, so it runs in the weights' dtype with
        autocast off, as the other states do: in bf16 its blocks and the carries between chunks
        rounded v, which NAG's μ → 1 lets grow with the length (12 % off float32's outputs at
        T = 2000 under CPU autocast, where the rest of the layer runs in float32). Under CUDA
        autocast the fused kernel still takes the result in half precision."""
        w_ih, _, b_ih, _ = self.layer_parameters(k)
        if decay is None:
            return input_map(x, decay, self.variant.input_scale(self.hyper), w_ih, b_ih, v0)
        (x, v0), precision = in_weight_dtype(w_ih, x, v0)
        with precision:
            return input_map(x, decay, self.variant.input_scale(self.hyper), w_ih, b_ih, v0,
                             self._joined_input_weight(k, decay, w_ih, b_ih))

    def _adaptive_drive(self, x, decay, mapped, weight_ih, bias_ih, m0, lengths, chunked=False):
        """Normalised pre-activation of eq. 15 for all steps, with its last v and m (chunked: m in
        a fixed number of kernels, `second_moment`); mapped() gives `input_map`'s (inp, w, b),
        asked for only where μ > 0. Its callers run it in the weights' dtype with autocast off, g
        included (see MomentumLSTM._adaptive_layer)."""
        g = F.linear(x, weight_ih, bias_ih)
        # μ ≡ 0 (RMSProp): eq. 9's v_t = s g_t, g scaled rather than input_map's W(s x) + s b again
        scale = self.variant.input_scale(self.hyper)
        v = F.linear(*mapped()) if decay is not None else g if scale == 1 else scale * g
        dtype, wide = second_moment_dtypes(v, m0, g)
        g, v = g.to(wide), v.to(wide)
        m = second_moment(g * g, m0.to(wide), self.beta, chunked)
        return tuple(t.to(dtype) for t in (v / torch.sqrt(plus_eps(m, self.eps)), last_step(v, lengths),
                                           last_step(m, lengths)))

    def _fused_on_drive(self, drive, lengths, hx, w_hh, b_hh):
        """torch's fused kernel of this layer (`fused_kind`: cuDNN on CUDA, one call, no step loop
        on the host) fed eq. 15's drive of every step through an identity input weight:
        pre_t = I·d_t + U h_{t-1} + b_hh (recurrence backend "cudnn"). The identity costs
        2·T·B·width² flops forward (4 times U h_{t-1}'s for the LSTM, as many for the tanh RNN),
        and cuDNN forms its gradient too. Like the plain and eq.-9 cells' cuDNN calls it follows
        torch.backends.cudnn's float32 precision (TF32 by default)."""
        eye = torch.eye(drive.size(-1), dtype=drive.dtype, device=drive.device)
        return fused_recurrence(self.fused_kind, drive, lengths, hx,
                                fused_weights(eye, w_hh, None, b_hh, self.bias), self.bias, self.training)

    def _state(self, state, batch, ref, steps):
        return initial_state(state, num_layers=self.num_layers * self.directions, batch=batch,
                             hidden=self.hidden_size, width=self.gate_count * self.hidden_size,
                             has_c=self.gate_count == 4,
                             has_v=self.variant.has_v, has_m=self.variant.has_m, ref=ref, steps=steps,
                             check_step=not self.__dict__.get("_trusted_states", False))

    def forward(self, input, state=None, *, cu_seqlens=None, cu_seqlens_cpu=None, segment_starts=None,
                padding_mask=None, all_layers=False, recurrent_weight=None):
        """input (T, B, input_size) (batch_first: (B, T, input_size)) or a PackedSequence;
        state None, a RecurrentState, (h, c) or h. Returns (output, RecurrentState).

        all_layers: output is then a tuple of every layer's output, first to last, each laid
        out as the input (for `output_hidden_states`). recurrent_weight: a callable
        (k, weight_hh_lk) -> the recurrent weight layer k uses in this call (AWD-LSTM's weight
        drop; `substituted_recurrent_weights`), so the parameters stay the module's.

        Packed rows (segments.py): `cu_seqlens` (n+1 offsets over a batch of one row) or
        `segment_starts` ((batch, time) bool, True where a sequence begins, (batch, time)
        whatever batch_first) split the input into n sequences that each run exactly as if
        alone: h, c, the momentum v, the second moment m and the step counter all start
        afresh (from `state`'s row of that segment) at every segment's first step. The state
        then has batch n, one row per segment (row by row, left to right): the initial state
        of each segment, and each segment's state after its last step. `cu_seqlens_cpu`, a host
        copy of cu_seqlens (as fla's), is checked on the host instead of cu_seqlens, so the
        call reads nothing back from the device; it must equal cu_seqlens.

        Padded rows: `padding_mask` ((batch, time) bool, True at real steps, whatever
        batch_first) runs each row as its real steps alone, padding on any side: a padded step
        keeps the row's state and outputs zeros (each direction of a bidirectional layer too).
        It reads no length back to the host, so torch.export traces it; it runs the cells'
        step equations as a scan over time (export_scan.py), slower in eager than a
        PackedSequence of the same rows."""
        check_bool(all_layers, "all_layers")
        if recurrent_weight is not None:
            with self.substituted_recurrent_weights(recurrent_weight):
                return _MomentumLayers.forward(self, input, state, cu_seqlens=cu_seqlens,
                                               cu_seqlens_cpu=cu_seqlens_cpu, segment_starts=segment_starts,
                                               padding_mask=padding_mask, all_layers=all_layers)
        if cu_seqlens_cpu is not None and cu_seqlens is None:
            raise ValueError("cu_seqlens_cpu is the host copy of cu_seqlens: pass cu_seqlens too")
        if padding_mask is not None:
            packed_rows = cu_seqlens is not None or segment_starts is not None
            self._check_padding_mask(input, padding_mask, packed_rows)
            return scanned_forward(self, input, state, all_layers, padding_mask)
        if cu_seqlens is None and segment_starts is None and exports_a_length(input, self.batch_first):
            return scanned_forward(self, input, state, all_layers)
        if cu_seqlens is None and segment_starts is None:
            outputs, new_state = self._forward_sequence(input, state, all_layers)
        elif self.bidirectional:
            raise ValueError("cu_seqlens / segment_starts need a unidirectional layer (bidirectional=False); "
                             "pass a bidirectional layer its sequences as a PackedSequence")
        else:
            outputs, new_state = self._forward_segments(input, state, cu_seqlens, segment_starts, all_layers,
                                                        cu_seqlens_cpu)
        return (outputs if all_layers else outputs[-1]), new_state

    def _check_input_dtype(self, x):
        check_input_dtype(x, self.weight_ih_l0)

    def _check_padding_mask(self, input, padding_mask, packed_rows: bool):
        """ValueError naming `padding_mask` unless it is a (batch, time) bool tensor on the device
        of a padded tensor input, the only thing that separates the rows."""
        if packed_rows or isinstance(input, PackedSequence):
            raise ValueError("padding_mask cannot be combined with cu_seqlens / segment_starts or a "
                             "PackedSequence, which already separate the sequences: pass padded rows")
        steps, batch = as_sequence(input, self.input_size, self.batch_first).x.shape[:2]
        self._check_input_dtype(input)
        if not isinstance(padding_mask, Tensor) or padding_mask.dtype != torch.bool:
            got = padding_mask.dtype if isinstance(padding_mask, Tensor) else type(padding_mask).__name__
            raise ValueError(f"padding_mask must be a bool tensor (True at real steps), got {got}")
        if padding_mask.shape != (batch, steps):
            raise ValueError(f"padding_mask must have shape (batch, time) = {(batch, steps)}, got "
                             f"{tuple(padding_mask.shape)}")
        if padding_mask.device != input.device:
            raise ValueError(f"padding_mask must be on the input's device {input.device}, got "
                             f"{padding_mask.device}")

    def _each_layer(self, x, layer, sequence_ids=None, sequences=None):
        """x through every layer, nn.LSTM's dropout between layers (in training): layer(k, x)
        -> (output, final state of layer k). Returns (every layer's output, their finals).
        x is (T, B, ·), or one step (B, ·), each batch row a sequence, or a packed row (N, ·) whose
        positions belong to `sequences` sequences as sequence_ids says (for locked dropout)."""
        outputs, finals = [], []
        for k in range(self.num_layers):
            if k > 0:
                x = sequence_dropout(x, self.dropout, self.training, self.locked_dropout,
                                     time_dim=0 if x.dim() == 3 else None, sequence_ids=sequence_ids,
                                     sequences=sequences)
            x, final = layer(k, x)
            outputs.append(x)
            finals.append(final)
        return outputs, finals

    def _drops_locked(self):
        """Whether this call drops locked masks between layers (torch's fused multi-layer kernel
        drops per element, so the layers then run one by one)."""
        return self.locked_dropout and self.dropout > 0 and self.training and self.num_layers > 1

    def _forward_segments(self, input, state, cu_seqlens, segment_starts, all_layers, cu_seqlens_cpu=None):
        """The segments of a packed row as a batch of n sequences in torch's packed layout
        (segments.py); empty segments keep their initial state."""
        if cu_seqlens is not None and segment_starts is not None:
            raise ValueError("pass cu_seqlens or segment_starts, not both (they say the same thing)")
        name = "cu_seqlens" if cu_seqlens is not None else "segment_starts"
        if isinstance(input, PackedSequence):
            raise ValueError(f"{name} cannot be combined with a PackedSequence input, whose lengths "
                             f"already separate its sequences: pass a tensor")
        x = as_sequence(input, self.input_size, self.batch_first).x
        self._check_input_dtype(x)
        steps, batch = x.shape[:2]
        if cu_seqlens_cpu is not None:
            check_offsets_metadata(cu_seqlens, x.device, batch, cu_seqlens_cpu.numel())
            offsets = check_host_offsets(cu_seqlens_cpu, steps)
        elif cu_seqlens is not None:
            offsets = check_offsets(cu_seqlens, steps, device=x.device, batch=batch).cpu()
        else:
            offsets = offsets_from_starts(segment_starts, batch, steps, x.device)
        layout = segment_layout(offsets, x.device)
        if self.fused_kind is not None and not self.variant.has_m:
            return self._row_segments(x, state, offsets, layout, all_layers)
        first = state
        if layout.nonempty is not None:
            full = self._state(state, layout.count, x, steps)
            first = segment_rows(state, full, layout.nonempty)
        outputs, final = self._forward_sequence(layout.pack(x.transpose(0, 1).reshape(batch * steps, -1)),
                                                first, all_layers)
        if layout.nonempty is not None:
            final = RecurrentState(*(None if f is None else a.index_copy(dim, layout.nonempty, f)
                                     for a, f, dim in zip(full, final, (1, 1, 1, 1, 0))))
        return tuple(self._row_output(layout.unpack(out.data), batch, steps) for out in outputs), final

    def _row_output(self, row, batch, steps):
        """A packed row's output (batch * steps, H) in the input's layout."""
        out = row.view(batch, steps, -1)
        return out if self.batch_first else out.transpose(0, 1)

    def _row_segments(self, x, state, offsets, layout, all_layers):
        """Packed row of a cell on torch's fused kernels (plain, eq. 9 and its NAG/SR
        schedules), without padding: each layer's momentum filter runs over the whole row with
        a SegmentDecay (filters.py: no momentum crosses a segment start, schedules count from
        each segment's start step), then the row's steps are gathered into the segments'
        packed layout for the fused kernel (cuDNN / oneDNN, one call per layer; the plain cell
        one call for all layers, as nn.LSTM) and scattered back."""
        steps, batch = x.shape[:2]
        st = self._state(state, layout.count, x, steps)
        keep = layout.nonempty
        first = lambda t: t if keep is None else t.index_select(1, keep)
        hx = lambda k: ((first(st.h[k]), first(st.c[k])) if self.gate_count == 4 else first(st.h[k]))
        lengths = offsets.diff()
        row = x.transpose(0, 1).reshape(batch * steps, -1)
        if self._all_layers_fused() and not all_layers and not self._drops_locked():
            data, (h, *c) = fused_packed(self.fused_kind, layout.pack(row), hx(slice(None)),
                                         self._stack_weights(), self.bias, self.training,
                                         self.num_layers, self.dropout)
            finals = (h, c[0] if c else None, None)
            rows = [layout.unpack(data)]
        else:
            carries_v = isinstance(state, RecurrentState) and state.v is not None
            base = self.variant.decay(self.hyper, steps * batch, st.step.new_zeros(1))
            decay = None if base is None else SegmentDecay(base, offsets, st.step)
            last = (offsets[1:] - 1)[lengths > 0].to(x.device)

            def layer(k, row):
                _, w_hh, _, b_hh = self.layer_parameters(k)
                inp, w, b = self._input_map(k, row[:, None], decay, st.v[k] if carries_v else None)
                data, (h, *c) = fused_packed(self.fused_kind, layout.pack(inp[:, 0]), hx(slice(k, k + 1)),
                                             fused_weights(w, w_hh, b, b_hh, self.bias), self.bias,
                                             self.training)
                v = F.linear(inp[:, 0].index_select(0, last), w, b) if self.variant.has_v else None
                return layout.unpack(data), (h[0], c[0][0] if c else None, v)

            ids = segment_ids(offsets, x.device) if self._drops_locked() else None
            rows, layers = self._each_layer(row, layer, ids, layout.count)
            finals = tuple(None if layers[0][i] is None else torch.stack([f[i] for f in layers])
                           for i in range(3))
        merged = tuple(None if f is None else (f if keep is None else a.index_copy(1, keep, f))
                       for a, f in zip(st[:3], finals))
        new_state = RecurrentState(*merged, None, st.step + lengths.to(st.step.device))
        return tuple(self._row_output(r, batch, steps) for r in rows), new_state

    def _forward_sequence(self, input, state, all_layers=False):
        """(every layer's output, or a one-tuple of the last's, in the input's layout; final state)."""
        seq = as_sequence(input, self.input_size, self.batch_first)
        x, lengths = seq.x, seq.lengths
        self._check_input_dtype(x)
        steps, batch = x.shape[:2]
        carries_v = isinstance(state, RecurrentState) and state.v is not None
        st = self._state(state, batch, x, steps)
        advanced = steps if lengths is None else lengths.to(st.step.device)
        if self._all_layers_fused() and not all_layers and not self._drops_locked():
            out, (h, *c) = self._fused_stack(x, lengths, st)
            new_state = RecurrentState(h, c[0] if c else None, None, None, st.step + advanced)
            return (as_output(seq, out, self.batch_first),), new_state
        # A fresh counter is all zeros: one start step, known without reading the device.
        fresh = not isinstance(state, RecurrentState) or state.step is None
        decay = self._decay(steps, st.step[:1] if fresh else st.step)

        def one(i, x):
            c0, v0, m0 = (None if t is None else t[i] for t in (st.c, st.v, st.m))
            return self._layer(i, x, lengths, decay, st.h[i], c0, v0, m0, carries_v)

        def layer(k, x):
            if not self.bidirectional:
                return one(k, x)
            out, final = one(2 * k, x)
            back, back_final = one(2 * k + 1, reverse_within_lengths(x, lengths))
            return torch.cat([out, reverse_within_lengths(back, lengths)], -1), (final, back_final)

        outputs, finals = self._each_layer(x, layer)
        if self.bidirectional:
            finals = [f for pair in finals for f in pair]
        if not all_layers:
            outputs = outputs[-1:]
        stack = lambda i: None if finals[0][i] is None else torch.stack([f[i] for f in finals])
        new_state = RecurrentState(stack(0), stack(1), stack(2), stack(3), st.step + advanced)
        return tuple(as_output(seq, out, self.batch_first) for out in outputs), new_state

    def _all_layers_fused(self):
        """The plain cell is one call of torch's fused multi-layer kernel on the module's own
        parameters, dropout between layers included: exactly nn.LSTM / nn.RNN's call."""
        return self.variant.plain and self.fused_kind is not None and not self.bidirectional

    def _stack_weights(self):
        return [p for k in range(self.num_layers) for p in self.layer_parameters(k) if p is not None]

    def _fused_stack(self, x, lengths, st):
        hx = (st.h, st.c) if self.gate_count == 4 else st.h
        return fused_recurrence(self.fused_kind, x, lengths, hx, self._stack_weights(), self.bias,
                                self.training, num_layers=self.num_layers, dropout=self.dropout)

    def flatten_parameters(self):
        """nn.LSTM.flatten_parameters for the plain cell: on CUDA, move every layer's weights
        into one buffer in cuDNN's layout (the parameters become views of it; names, shapes
        and values unchanged), so the fused call does not re-pack them on every forward.
        Called after `.to()` / `.cuda()` like nn.LSTM's; a no-op elsewhere and for the
        momentum cells, whose fused call takes a derived input weight (input_map)."""
        if not self._all_layers_fused():
            return
        weights = self._stack_weights()
        first = weights[0]
        if any(not isinstance(w, Tensor) or w.dtype != first.dtype or not w.is_cuda
               or not torch.backends.cudnn.is_acceptable(w) for w in weights):
            return
        if len({w.data_ptr() for w in weights}) != len(weights):
            return
        from torch.backends.cudnn import rnn as cudnn_rnn

        mode = cudnn_rnn.get_cudnn_mode("LSTM" if self.fused_kind == "lstm" else "RNN_TANH")
        with torch.cuda.device_of(first), torch.no_grad():
            if torch._use_cudnn_rnn_flatten_weight():
                torch._cudnn_rnn_flatten_weight(weights, 4 if self.bias else 2, self.input_size,
                                                mode, self.hidden_size, 0, self.num_layers,
                                                False, False)

    def train(self, mode=True):
        # weights written through `.data` bump no version counter (JoinedWeightCache)
        self.joined_weights.clear()
        return super().train(mode)

    def _apply(self, fn, recurse=True):
        result = super()._apply(fn, recurse)
        self.joined_weights.clear()
        self.flatten_parameters()
        return result

    def __getstate__(self):
        # pickles and deep copies carry the parameters, not tensors derived from them
        state = self.__dict__.copy()
        state["joined_weights"] = JoinedWeightCache()
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.flatten_parameters()

    def step(self, input, state=None, *, all_layers=False):
        """One time step of every layer: input (batch, input_size) -> (output (batch,
        hidden_size), RecurrentState). Equal to `forward` on a length-1 sequence with the same
        state, at the cost of a cell step: the drive of each cell comes from the table of
        variants.py, the recurrence from the layer family. For decoding. all_layers: output is
        a tuple of every layer's output, as in `forward`."""
        if not isinstance(input, Tensor) or input.dim() != 2 or input.size(1) != self.input_size:
            shape = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
            raise ValueError(f"input must have shape (batch, {self.input_size}), got {shape}")
        if self.bidirectional:
            raise ValueError("step needs a unidirectional layer (bidirectional=False): the backward "
                             "direction reads the sequence from its end")
        self._check_input_dtype(input)
        st = self._state(state, input.size(0), input, 1)
        step, hyper = st.step + 1, self.hyper

        def layer(k, x):
            c0, v0, m0 = (None if t is None else t[k] for t in (st.c, st.v, st.m))
            h, c, v, m = self._layer_step(k, self._input_projection(k, x), st.h[k], c0, v0, m0, step, hyper)
            return h, (h, c, v, m)

        outputs, finals = self._each_layer(input, layer)
        stack = lambda i: None if finals[0][i] is None else torch.stack([f[i] for f in finals])
        state = RecurrentState(stack(0), stack(1), stack(2), stack(3), step)
        return (tuple(outputs) if all_layers else outputs[-1]), state

    def _layer_step(self, k, g, h, c, v, m, step, hyper):
        """One time step of layer k from its input pre-activation g = W x_t + b (batch, width):
        the cell's drive (variants.py), then the family's recurrence. Returns (h, c, v, m), None
        where the cell has no such part; step (batch,) counts the steps including this one."""
        pre, v, m = self.variant.drive(g, v, m, step, hyper)
        h, c = self._recurrent_update(k, pre, h, c)
        return h, c, v, m

    def _input_projection(self, k, x):
        w_ih, _, b_ih, _ = self.layer_parameters(k)
        return F.linear(x, w_ih, b_ih)


def carried_v(x_last, w, b):
    """The momentum v = W x + b (eq. 9) returned in the state, in the weights' dtype with autocast
    off: the state carried into the next call keeps float32 (autocast would round it to bf16)."""
    (x_last,), precision = in_weight_dtype(w, x_last)
    with precision:
        return F.linear(x_last, w, b)


class MomentumLSTM(_MomentumLayers):
    """Stack of MomentumLSTM-family layers (MomentumRNN, Sections 2.2–2.4), nn.LSTM-like.

    cell: "lstm" (plain LSTM) or any momentum cell of the table in variants.py (docs/cells.md;
    restart F for the cells that take one). momentum μ, step_size s, beta β, eps ε: None is the
    cell's default (variants.DEFAULTS); a value for one the cell never reads (e.g. momentum with
    cell="lstm" or "rmsprop") is refused, and the attribute of an unread one is None.
    Parameters are named and ordered as nn.LSTM's (gates i, f, g, o), initialised as in
    Appendix F. forward(input, state=None) -> (output, RecurrentState); input is
    (T, B, input_size) (batch_first: (B, T, input_size)) or a PackedSequence; state may also
    be an (h, c) tuple. The returned state carries h, c, the momentum v (and m for
    adam/rmsprop) of every layer and the per-sequence time-step counter.
    forward(input, state, cu_seqlens=...) or (..., segment_starts=...): many sequences packed
    in one row, each run exactly as if alone, with one state row per sequence (`forward`).
    """

    plain = "lstm"
    gate_count = 4
    fused_kind = "lstm"

    def reset_parameters(self):
        for k in range(self.num_layers * self.directions):
            w_ih, w_hh, b_ih, b_hh = self.layer_parameters(k)
            with torch.no_grad():
                nn.init.orthogonal_(w_ih)
                nn.init.eye_(w_hh)
                for b in (b_ih, b_hh):
                    if b is not None:
                        b.zero_()
                        b[self.hidden_size:2 * self.hidden_size].fill_(1.0)

    def _recurrence_forms_v(self):
        return not drive_first()

    def _layer(self, k, x, lengths, decay, h0, c0, v0, m0, carries_v):
        w_ih, w_hh, b_ih, b_hh = self.layer_parameters(k)
        if self.variant.has_m and drive_first():
            return self._drive_first_layer(k, x, lengths, decay, h0, c0, v0, m0, carries_v)
        if self.variant.has_m:
            return self._adaptive_layer(x, lengths, w_ih, w_hh, b_ih, b_hh, h0, c0, v0, m0)
        inp, w, b = self._input_map(k, x, decay, v0 if carries_v else None)
        out, (h, c) = fused_recurrence("lstm", inp, lengths, (h0[None], c0[None]),
                                       fused_weights(w, w_hh, b, b_hh, self.bias), self.bias,
                                       self.training)
        v = carried_v(last_step(inp, lengths), w, b) if self.variant.has_v else None
        return out, (h[0], c[0], v, None)

    def _recurrent_update(self, k, pre, h, c):
        _, w_hh, _, b_hh = self.layer_parameters(k)
        return lstm_update(pre + F.linear(h, w_hh, b_hh), c)

    def _drive_first_layer(self, k, x, lengths, decay, h0, c0, v0, m0, carries_v):
        """Adam/RMSProp layer on torch's fused LSTM kernel (recurrence backend "cudnn").

        Eq. 15's drive d_t = v_t/√(m_t + ε) depends on the input only, so it is formed for all
        steps first, as MomentumRNN forms it (v by eq. 9's filter in input space, m by the chunked
        `second_moment`), and the whole recurrence is one fused call (`_fused_on_drive`, a 4H × 4H
        identity)."""
        w_ih, w_hh, b_ih, b_hh = self.layer_parameters(k)
        (x, h0, c0, v0, m0), precision = in_weight_dtype(w_hh, x, h0, c0, v0, m0)
        with precision:
            mapped = functools.partial(self._input_map, k, x, decay, v0 if carries_v else None)
            drive, v, m = self._adaptive_drive(x, decay, mapped, w_ih, b_ih, m0, lengths, chunked=True)
            out, (h, c) = self._fused_on_drive(drive, lengths, (h0[None], c0[None]), w_hh, b_hh)
        return out, (h[0], c[0], v, m)

    def _adaptive_layer(self, x, lengths, w_ih, w_hh, b_ih, b_hh, h0, c0, v0, m0):
        """Adam/RMSProp layer: eq. 15 on the fused recurrence of adam_recurrence.py."""
        momentum = self.hyper.momentum
        v_last = None
        if not momentum:
            v_last = self.step_size * carried_v(last_step(x, lengths), w_ih, b_ih)
        sizes = inverse = None
        if lengths is not None:
            lengths, order = torch.sort(lengths, descending=True)
            inverse = torch.argsort(order).to(x.device)
            # lengths is on the host (pad_packed_sequence's): a list without a device wait
            sizes = (lengths[None, :] > torch.arange(x.size(0))[:, None]).sum(1).tolist()
            order = order.to(x.device)
            x = x.index_select(1, order)
            h0, c0, v0, m0 = (t.index_select(0, order) for t in (h0, c0, v0, m0))
        forward, backward = gate_order(self.hidden_size, x.device)
        rows = lambda t: None if t is None else t.index_select(0, forward)
        # with autocast off, g included: the normaliser (m + ε)^(−1/2) divides by |g|, so bf16's
        # rounding of g reaches the gradients amplified (13 % relative in tests/test_rnn_layers.py's
        # autocast case), and the in-place steps need one dtype: the weights', float32 for float16
        # (filters.second_moment_dtypes: float16 loses ε and small g⊙g); output and states come back
        # in the weights' dtype
        dtype, wide = second_moment_dtypes(w_hh)
        (x, h0, c0, v0, m0, w_ih, w_hh, b_ih, b_hh), precision = in_dtype(
            wide, x, h0, c0, v0, m0, w_ih, w_hh, b_ih, b_hh)
        with precision:
            g = F.linear(x, rows(w_ih), rows(b_ih))
            hs, c, v, m = adam_lstm_recurrence(
                g, v0.index_select(1, forward), h0, c0, m0.index_select(1, forward), rows(w_hh),
                rows(b_hh), momentum, self.step_size, self.beta, self.eps, sizes)
        hs, c, v, m = (None if t is None else t.to(dtype) for t in (hs, c, v, m))
        m = m.index_select(1, backward)
        v = v_last if v is None else v.index_select(1, backward)
        out = hs[1:]
        if lengths is None:
            return out, (hs[-1], c, v, m)
        h = hs[lengths.to(x.device), torch.arange(x.size(1), device=x.device)]
        back = lambda t: t.index_select(0, inverse)
        v = v if v_last is not None else back(v)
        return out.index_select(1, inverse), (back(h), back(c), v, back(m))


class MomentumRNN(_MomentumLayers):
    """Stack of tanh MomentumRNN-family layers (eq. 9, eq. 15, Section 2.4), nn.RNN-like.

    Same cells and calling convention as MomentumLSTM, with cell="rnn" the plain tanh RNN;
    parameters named as nn.RNN's and initialised like it (uniform ±1/√hidden_size). The
    state's c is None.
    """

    plain = "rnn"
    gate_count = 1
    fused_kind = "rnn_tanh"

    def reset_parameters(self):
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def _layer(self, k, x, lengths, decay, h0, c0, v0, m0, carries_v):
        w_ih, w_hh, b_ih, b_hh = self.layer_parameters(k)
        if self.variant.has_m:
            # a Python loop (under "cudnn" the fused kernel) whose carried h and v, m stay in the
            # weights' dtype under autocast (and g, as in MomentumLSTM._adaptive_layer)
            (x, h0, v0, m0), precision = in_weight_dtype(w_hh, x, h0, v0, m0)
            with precision:
                mapped = functools.partial(self._input_map, k, x, decay, v0 if carries_v else None)
                fused = drive_first()
                pre, v, m = self._adaptive_drive(x, decay, mapped, w_ih, b_ih, m0, lengths, chunked=fused)
                if fused:
                    out, (h,) = self._fused_on_drive(pre, lengths, h0[None], w_hh, b_hh)
                    return out, (h[0], None, v, m)
                if b_hh is not None:
                    pre = pre + b_hh
                out, (h,) = recurrence_loop(tanh_step(w_hh), pre, lengths, (h0,))
            return out, (h, None, v, m)
        inp, w, b = self._input_map(k, x, decay, v0 if carries_v else None)
        out, (h,) = fused_recurrence("rnn_tanh", inp, lengths, h0[None],
                                     fused_weights(w, w_hh, b, b_hh, self.bias), self.bias,
                                     self.training)
        v = carried_v(last_step(inp, lengths), w, b) if self.variant.has_v else None
        return out, (h[0], None, v, None)

    def _recurrent_update(self, k, pre, h, c):
        _, w_hh, _, b_hh = self.layer_parameters(k)
        return torch.tanh(pre + F.linear(h, w_hh, b_hh)), None
