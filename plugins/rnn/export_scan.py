"""The layers' whole-sequence forward under torch.export with a symbolic length: each layer as
torch's scan of its time step (`_layer_step`, the cells' step-wise equations that `step` runs).

The batch form cannot export a length: torch.export decomposes torch's fused aten.lstm /
aten.rnn_tanh into one step per position, and the momentum filters pad and reshape into chunks,
which guards the length modulo the chunk; either fixes the length. A scan keeps it symbolic
and becomes one ONNX Scan. Eager, compiled and exported calls of a fixed length keep the batch
form; the step and batch forms are the same equations (tests/test_rnn_variants.py
`test_step_equals_forward_for_50_steps` compares them).

The scan also runs padded rows without reading their lengths (`padding_mask`): a padded step
leaves the row's state as it was, whatever side the padding is on, where a PackedSequence needs
the lengths on the host, which torch.export cannot trace."""
import torch
from torch import Tensor
from torch.nn.utils import parametrize

from ..exporting import exported_scan, exports_a_symbolic, is_exporting


def exports_a_length(input, batch_first: bool) -> bool:
    """Whether `input` is a padded (not packed) sequence whose length is symbolic under
    torch.export."""
    if not isinstance(input, Tensor) or input.dim() != 3:
        return False
    return exports_a_symbolic(input.shape[1 if batch_first else 0])


def scanned_forward(layers, input: Tensor, state, all_layers: bool, padding_mask=None):
    """`layers.forward(input, state, all_layers=all_layers)` (a MomentumLSTM / MomentumRNN /
    OrthogonalMomentumRNN) with each layer as a scan of its step (`_layer_step`) over the time
    axis: (output, RecurrentState). A bidirectional layer's backward direction scans the flipped
    input and its output is flipped back, as the batch form reverses a tensor input whole; both
    directions count steps from the state's counter, as in the batch form.
    padding_mask (batch, time) bool, True at real steps, or None: a padded step keeps the row's
    state (h, c, v, m and the step counter) and outputs zeros, so each row gets what its real
    steps alone give, as a PackedSequence of them (the backward direction then starts at the
    row's last real step)."""
    x = input.transpose(0, 1) if layers.batch_first else input            # (T, B, D)
    steps = x.shape[0]
    start = layers._state(state, x.shape[1], x, steps)
    hyper = layers.hyper
    real = None if padding_mask is None else padding_mask.transpose(0, 1).to(x.device)    # (T, B)

    def counts(real):
        """The step count including step t, as `step` gives it (an input of each step, not a
        carry): only real steps count."""
        if real is None:
            return start.step[None, :] + torch.arange(1, steps + 1, device=start.step.device)[:, None]
        return start.step[None, :] + real.cumsum(0).to(start.step.device, start.step.dtype)

    def one(i, x, real):
        first = tuple(None if part is None else part[i] for part in start[:4])       # h, c, v, m
        final, out = _scan_layer(layers, i, layers._input_projection(i, x), first, counts(real), real,
                                 hyper)
        return out, final

    def layer(k, x):
        if not layers.bidirectional:
            return one(k, x, real)
        out, final = one(2 * k, x, real)
        back, back_final = one(2 * k + 1, x.flip(0), None if real is None else real.flip(0))
        return torch.cat([out, back.flip(0)], -1), (final, back_final)

    # a parametrized weight (DTRIV's orthogonal one) is formed once, not at every step: read
    # here, it enters parametrize's cache outside the scan, which may not write to it
    with parametrize.cached():
        for i in range(layers.num_layers * layers.directions):
            layers.layer_parameters(i)
        outputs, finals = layers._each_layer(x, layer)
    if layers.bidirectional:
        finals = [f for pair in finals for f in pair]
    stack = lambda i: None if finals[0][i] is None else torch.stack([f[i] for f in finals])
    taken = steps if real is None else real.sum(0).to(start.step.device, start.step.dtype)
    new_state = type(start)(*(stack(i) for i in range(4)), start.step + taken)
    outputs = tuple(o.transpose(0, 1) if layers.batch_first else o for o in outputs)
    return (outputs if all_layers else outputs[-1]), new_state


def _scan_layer(layers, k, g, first, counts, real, hyper):
    """Layer k over the steps of its input pre-activations g (T, B, width) from first = (h, c, v,
    m) of (B, ·) each (None where the cell has none): (final (h, c, v, m), outputs (T, B, H)).
    real (T, B) bool or None: a row's padded step keeps its carry and outputs zeros.
    The scan carries (B, ·) tensors only: ONNX's conversion of a scan whose carry is sliced
    inside the step fails (torch 2.13), and None is not a tensor."""
    present = [i for i, part in enumerate(first) if part is not None]

    def parts(carried):
        fields = [None] * len(first)
        for i, part in zip(present, carried):
            fields[i] = part
        return fields

    def step(carried, inputs):
        g_t, count, *real_t = inputs
        new = layers._layer_step(k, g_t, *parts(carried), count, hyper)
        if not real_t:
            # scan's outputs must not alias its carry (h is both)
            return tuple(new[i] for i in present), new[0].clone()
        kept = tuple(torch.where(real_t[0][:, None], new[i], old) for i, old in zip(present, carried))
        return kept, torch.where(real_t[0][:, None], new[0], 0)

    xs = (g, counts) if real is None else (g, counts, real)
    # in eager torch's scan compiles its step (dynamo); a loop of the same step needs no compiler
    traced = is_exporting() or torch.compiler.is_compiling()
    final, out = (exported_scan if traced else _loop)(step, tuple(first[i] for i in present), xs)
    return tuple(parts(final)), out


def _loop(step, carry, xs):
    """torch's `scan(step, carry, xs)` as a Python loop over the leading axis of xs."""
    outputs = []
    for t in range(xs[0].shape[0]):
        carry, out = step(carry, tuple(x[t] for x in xs))
        outputs.append(out)
    return carry, torch.stack(outputs)
