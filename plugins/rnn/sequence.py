"""Input/state plumbing shared by the sequence layers: shapes, packing, the carried state."""
import contextlib
from typing import NamedTuple, Optional

import torch
from torch import _VF, Tensor
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ..autocast import autocast_off
from ..exporting import is_exporting
from ..graph_breaks import eager_under_compile
from ..validation import MAX_INT


class RecurrentState(NamedTuple):
    """State carried between calls (truncated BPTT).

    h, c: (num_layers, batch, hidden) as in nn.LSTM (c is None for tanh/orthogonal RNNs);
    v, m: (num_layers, batch, N) momentum and second moment (None where the cell has none);
    step: (batch,) int64, time steps processed so far (drives the NAG/SR schedule).
    """
    h: Tensor
    c: Optional[Tensor]
    v: Optional[Tensor]
    m: Optional[Tensor]
    step: Tensor


class Sequence(NamedTuple):
    x: Tensor                         # (T, B, D), time-major, batch in caller's order
    lengths: Optional[Tensor]         # (B,) int64 on CPU, None when all have length T
    packed: Optional[PackedSequence]  # the caller's packed input, for its metadata


def as_sequence(input, input_size, batch_first):
    if isinstance(input, PackedSequence):
        if input.data.dim() != 2 or input.data.size(1) != input_size:
            raise ValueError(f"packed input data must have shape (N, {input_size}), "
                             f"got {tuple(input.data.shape)}")
        x, lengths = pad_packed(input)
        return Sequence(x, lengths, input)
    if not isinstance(input, Tensor) or input.dim() != 3 or input.size(-1) != input_size:
        shape = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
        order = "(batch, seq, input_size)" if batch_first else "(seq, batch, input_size)"
        raise ValueError(f"input must be a 3-D tensor {order} with input_size={input_size} "
                         f"or a PackedSequence, got {shape}")
    if input.size(0) == 0 or input.size(1) == 0:
        raise ValueError(f"input must have non-empty sequence and batch dims, got {tuple(input.shape)}")
    return Sequence(input.transpose(0, 1) if batch_first else input, None, None)


@eager_under_compile
def pad_packed(packed: PackedSequence, **kwargs):
    """pad_packed_sequence(packed, **kwargs); under torch.compile outside the graph: it reads
    batch_sizes' values, which torch 2.13's dynamo breaks the graph at and 2.11's fails on (its
    fake-tensor call finds no data)."""
    return pad_packed_sequence(packed, **kwargs)


def as_output(seq, out, batch_first):
    """Return `out` (T, B, H) in the caller's layout: packed like the input, or padded."""
    if seq.packed is None:
        return out.transpose(0, 1) if batch_first else out
    order = seq.packed.sorted_indices
    # the lengths in the packed order are the host lengths sorted in decreasing order: no device read
    lengths = seq.lengths if order is None else torch.sort(seq.lengths, descending=True).values
    out = out if order is None else out.index_select(1, order)
    repacked = pack_padded_sequence(out, lengths, enforce_sorted=True)
    return PackedSequence(repacked.data, repacked.batch_sizes, order, seq.packed.unsorted_indices)


def last_step(seq_values, lengths):
    """Values at each sequence's last valid step: (T, B, N) -> (B, N)."""
    if lengths is None:
        return seq_values[-1]
    index = (lengths - 1).to(seq_values.device)
    return seq_values[index, torch.arange(seq_values.size(1), device=seq_values.device)]


def valid_mask(lengths, steps, batch, device):
    """(T, B, 1) bool: step t lies inside sequence b."""
    t = torch.arange(steps)
    return (t[:, None] < lengths[None, :]).to(device).view(steps, batch, 1)


def in_weight_dtype(weight, *tensors):
    """(tensors cast to `weight`'s dtype, None kept; a region without autocast on their device):
    for the steps that must not run in autocast's half precision (a state carried to the next
    call, a loop's carried h, eq. 15's normaliser)."""
    return in_dtype(weight.dtype, *tensors)


def in_dtype(dtype, *tensors):
    """`in_weight_dtype` for a dtype other than the weights' (eq. 15's float32 for float16 layers)."""
    device_type = next(t for t in tensors if t is not None).device.type
    return tuple(None if t is None else t.to(dtype) for t in tensors), autocast_off(device_type)


def cpu_autocast_off(x, hx, weights):
    """(x, hx, context) for torch's fused LSTM / tanh-RNN kernel. CPU autocast hands it bf16
    (or fp16) operands, for which oneDNN has no LSTM primitive on CPUs without those
    instructions ("could not create a primitive descriptor", nn.LSTM included): on the CPU under
    autocast the kernel runs in the weights' dtype with autocast off, the input and carried state
    cast to it. CUDA autocast is left to cuDNN, which runs half precision."""
    if x.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return x, hx, contextlib.nullcontext()
    pair = isinstance(hx, tuple)
    (x, *hx), precision = in_weight_dtype(weights[0], x, *(hx if pair else (hx,)))
    return x, tuple(hx) if pair else hx[0], precision


def fused_recurrence(kind, x, lengths, hx, weights, has_biases, training, num_layers=1,
                     dropout=0.0):
    """`num_layers` layers of torch's fused LSTM / tanh-RNN kernel (oneDNN/aten on CPU, cuDNN
    on GPU), with nn.LSTM's dropout between them (in training).

    x (T, B, D) padded in caller order; hx a (h, c) pair (lstm) or h (tanh), each (L, B, H).
    Returns (output (T, B, H) with zeros past each length, final states in caller order).
    """
    if lengths is None:
        fn = fused_kernel(kind, x, weights)
        x, hx, precision = cpu_autocast_off(x, hx, weights)
        with precision:
            out = fn(x, hx, weights, has_biases, num_layers, dropout, training, False, False)
        return out[0], shaped_as(out[1:], hx)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    data, finals = fused_packed(kind, packed, hx, weights, has_biases, training, num_layers, dropout)
    # a new PackedSequence, not packed._replace(data=...): after the graph break at packing, dynamo
    # rebuilt _replace's result with a 0-d batch_sizes (torch.compile of an eval forward failed)
    out, _ = pad_packed(PackedSequence(data, packed.batch_sizes, packed.sorted_indices,
                                       packed.unsorted_indices), total_length=x.size(0))
    return out, finals


def fused_packed(kind, packed, hx, weights, has_biases, training, num_layers=1, dropout=0.0):
    """`fused_recurrence` on a PackedSequence: hx (L, B, H) in caller order. Returns the packed
    output data (same layout as packed.data) and the final states in caller order."""
    fn = fused_kernel(kind, packed.data, weights)
    order = packed.sorted_indices
    hx = tuple(t.index_select(1, order) for t in hx) if kind == "lstm" else hx.index_select(1, order)
    data, hx, precision = cpu_autocast_off(packed.data, hx, weights)
    with precision:
        res = fn(data, packed.batch_sizes, hx, weights, has_biases, num_layers, dropout, training, False)
    return res[0], tuple(t.index_select(1, packed.unsorted_indices) for t in shaped_as(res[1:], hx))


def fused_kernel(kind, x, weights):
    """torch's fused LSTM / tanh-RNN function for input `x`; under torch.compile outside the graph
    where AOTAutograd cannot differentiate it: oneDNN's LSTM on the CPU (every float dtype but
    float64) with weights that need gradients and an input that does not, whose saved tensors hold
    a None that the compiled forward refuses ("expected all tensors_saved_with_vc_check to be
    Tensors"; inductor: "expected Tensor() for op: torch.ops.aten.mkldnn_rnn_layer", pytorch#158007).
    nn.LSTM runs eagerly under torch.compile too (dynamo's allow_rnn=False)."""
    if kind != "lstm":
        return _VF.rnn_tanh
    if torch.compiler.is_compiling() and not is_exporting() and x.device.type == "cpu" \
            and x.dtype != torch.float64 and torch.is_grad_enabled() and not x.requires_grad \
            and any(w.requires_grad for w in weights):
        return _eager_lstm
    return _VF.lstm


@eager_under_compile
def _eager_lstm(*args):
    return _VF.lstm(*args)


def shaped_as(finals, hx):
    """The fused kernel's final states in the shape of the initial ones: torch 2.11's AOTAutograd
    (torch.compile) traces aten::lstm's final h and c as (1, L, B, H), the values right."""
    return tuple(f.view(h.shape) for f, h in zip(finals, hx if isinstance(hx, tuple) else (hx,)))


def check_state_tensor(value, name, shape, ref):
    """One tensor of a carried state: its shape for this input (batch included), the input's
    device and, outside autocast, its dtype."""
    if not isinstance(value, Tensor):
        raise ValueError(f"{name} must be a tensor of shape {shape}, got {type(value).__name__}")
    if tuple(value.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (num_layers, batch, size) for this input, "
                         f"got {tuple(value.shape)}")
    if value.device != ref.device:
        raise ValueError(f"{name} is on {value.device} but the input is on {ref.device}")
    if value.dtype != ref.dtype and not torch.is_autocast_enabled(ref.device.type):
        raise ValueError(f"{name} has dtype {value.dtype} but the input has {ref.dtype}: carry the state "
                         "the layer returned, or convert it with .to(input.dtype)")


STATE_PARTS = {"c": "cell state c (an LSTM's)", "v": "momentum v (eq. 9, 15)",
               "m": "second moment m (eq. 15)"}


def initial_state(state, *, num_layers, batch, hidden, width, has_c, has_v, has_m, ref, steps=1,
                  check_step=True):
    """Fill a missing or partial carried state with zeros and check its shapes; the step
    counter must stay below 2^62 after `steps` more steps (int64 never wraps), which check_step
    False leaves unread (a state the caller's layer made)."""
    zeros = lambda n: ref.new_zeros(num_layers, batch, n)
    if state is None:
        state = RecurrentState(zeros(hidden), None, None, None, None)
    elif isinstance(state, Tensor):
        state = RecurrentState(state, None, None, None, None)
    elif not isinstance(state, RecurrentState):
        if has_c and len(state) == 2:
            state = RecurrentState(state[0], state[1], None, None, None)
        else:
            raise ValueError("state must be None, a RecurrentState"
                             + (" or an (h, c) tuple" if has_c else " or a tensor h"))
    h, c, v, m, step = state
    if h is None:
        raise ValueError(f"state.h must be a tensor of shape {(num_layers, batch, hidden)} (num_layers, "
                         "batch, size), got None; pass state=None for a fresh state")
    for name, value, carried in (("c", c, has_c), ("v", v, has_v), ("m", m, has_m)):
        if value is not None and not carried:
            raise ValueError(f"state.{name} is given, but this layer's cell carries no {STATE_PARTS[name]}: "
                             f"it would be ignored; pass {name}=None (a state of another cell does not carry "
                             "over)")
    c = zeros(hidden) if has_c and c is None else c
    v = zeros(width) if has_v and v is None else v
    m = zeros(width) if has_m and m is None else m
    fresh = step is None
    step = torch.zeros(batch, dtype=torch.long, device=ref.device) if fresh else step
    for name, value, n in (("h", h, hidden), ("c", c, hidden), ("v", v, width), ("m", m, width)):
        if value is not None:
            check_state_tensor(value, f"state.{name}", (num_layers, batch, n), ref)
    step = torch.as_tensor(step, device=ref.device)
    if step.is_floating_point() or step.dtype == torch.bool:
        raise ValueError(f"state.step must be an integer tensor, got {step.dtype}")
    # two comparisons, not `in (1, batch)`: torch 2.13's compile with dynamic shapes judged that False
    # where numel() == batch (2.15's does not)
    if step.dim() > 1 or (step.numel() != 1 and step.numel() != batch):
        raise ValueError(f"state.step must have shape (batch,) = ({batch},) (or be one count for every "
                         f"row), got {tuple(step.shape)}")
    step = step.long().expand(batch).contiguous()
    # A carried counter is checked (one wait for an accelerator per call); a fresh one is 0. A
    # graph being traced (torch.compile, torch.export) cannot read values: its caller checks.
    if check_step and not fresh and not torch.compiler.is_compiling() and (
            bool((step < 0).any()) or bool((step > MAX_INT - steps).any())):
        raise ValueError(f"state.step must be in [0, {MAX_INT - steps}] for {steps} more steps, "
                         f"got min {int(step.min())}, max {int(step.max())}")
    return RecurrentState(h, c, v, m, step)
