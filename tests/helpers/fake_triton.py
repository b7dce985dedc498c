"""A stand-in for plugins.attention.triton, to test which kernels run and what they are
handed without Triton."""
import sys
import types

import plugins.attention
from plugins.attention.chunk import chunk_causal_momentum_attention
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

    module.is_available = lambda: available
    module.chunk_momentum_attention = chunk
    module.fused_recurrent_step = step
    return module


def install(monkeypatch, module):
    """Make `from plugins.attention import triton` give `module` (None: an ImportError)."""
    monkeypatch.setitem(sys.modules, KERNELS, module)
    if module is None:
        monkeypatch.delattr(plugins.attention, "triton", raising=False)
    else:
        monkeypatch.setattr(plugins.attention, "triton", module, raising=False)
