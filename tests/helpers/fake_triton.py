"""A stand-in for plugins.attention.triton, to test which kernels run and what they are
handed without Triton."""
import sys
import types

import torch

import plugins.attention
from plugins.attention.attend import mask_keys
from plugins.attention.chunk import chunk_causal_momentum_attention
from plugins.attention.nonfinite import FINITE_MAPS, NonFiniteMarks
from plugins.attention.recurrent import fused_recurrent_step
from plugins.attention.rule import momentum_rule

KERNELS = "plugins.attention.triton"


def fake_kernels(calls, available=True):
    """Stands in for plugins.attention.triton: records what it is handed, computes with the
    PyTorch kernels in float32 and answers in the input dtype, as the contract says."""
    module = types.ModuleType(KERNELS)

    def chunk(fq, fk, v, **kw):
        calls.append(dict(form="chunk", dtypes=(fq.dtype, fk.dtype, v.dtype), **kw))
        rule = momentum_rule(kw.pop("momentum"), kw.pop("step_size"))
        out, state = chunk_causal_momentum_attention(fq.float(), fk.float(), v.float(), rule=rule, **kw)
        return out.to(fq.dtype), state

    def step(fq, fk, v, state, **kw):
        calls.append(dict(form="step", dtypes=(fq.dtype, fk.dtype, v.dtype), state=state.s.dtype, **kw))
        hyper = dict(kw)
        rule = momentum_rule(hyper.pop("momentum"), hyper.pop("step_size"))
        return fused_recurrent_step(fq, fk, v, state, rule=rule, **hyper)

    def marked_step(q, k, v, state, *, feature_map, momentum, step_size, eps, real, out_dtype):
        """The raw inputs' step (feature map and marks included), as the PyTorch path computes it."""
        calls.append(dict(form="marked_step", dtypes=(q.dtype, k.dtype, v.dtype), state=state.s.dtype,
                          momentum=momentum, real=real))
        mask = None if real is None else real[:, None]
        q, k, v = (mask_keys(t[:, :, None].to(state.s.dtype), mask) for t in (q, k, v))
        fq, fk, v, marks = NonFiniteMarks.feature_map(feature_map, q, k, v)
        out, state = fused_recurrent_step(fq[:, :, 0], fk[:, :, 0], v[:, :, 0], state,
                                          rule=momentum_rule(momentum, step_size), eps=eps, real=real)
        return marks.step(out).to(out_dtype), marks.state(state)

    def finite_features(phi, q, k, v, lengths=None, segments=None, count=0):
        """φ and the marks of raw q, k, v of a built-in map, padding from `lengths` on zeroed, as
        the PyTorch path computes them; None for any other map or float64 (the contract of
        entry_points.finite_features)."""
        if phi not in FINITE_MAPS or torch.float64 in (q.dtype, k.dtype, v.dtype):
            return None
        calls.append(dict(form="finite_features", dtypes=(q.dtype, k.dtype, v.dtype), lengths=lengths))
        mask = None if lengths is None else torch.arange(q.shape[2]) < lengths[:, None]
        fq, fk, v, marks = NonFiniteMarks.feature_map(phi, *(mask_keys(t, mask) for t in (q, k, v)))
        return fq.contiguous(), mask_keys(fk, mask).contiguous(), v.contiguous(), marks

    def marked_chunk_attention(phi, q, k, v, **kw):
        """Declines the one-node call (None, as the real one does for a map without a kernel): the
        calls recorded are the chain's, finite_features then chunk."""
        return None

    module.is_available = lambda: available
    module.chunk_momentum_attention = chunk
    module.fused_recurrent_step = step
    module.marked_recurrent_step = marked_step
    module.finite_features = finite_features
    module.marked_chunk_attention = marked_chunk_attention
    return module


def install(monkeypatch, module):
    """Make `from plugins.attention import triton` give `module` (None: an ImportError)."""
    monkeypatch.setitem(sys.modules, KERNELS, module)
    if module is None:
        monkeypatch.delattr(plugins.attention, "triton", raising=False)
    else:
        monkeypatch.setattr(plugins.attention, "triton", module, raising=False)
