"""benchmarks/host_trace.py: the host's self time per step by kind, on every thread, from
torch.profiler's events with Python stacks; an idle thread's wait counts in no step's total."""
import sys
import threading
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import host_trace  # noqa: E402

TORCH = tuple(int(part) for part in torch.__version__.split(".")[:2])

from plugins.attention.feature_maps import elu_plus_one  # noqa: E402


def test_kinds_follow_the_event_names():
    kind = host_trace.kind
    assert kind("plugins/attention/attend.py(37): attend_step") == "momentum-plugins (Python)"
    assert kind("../hf_momentum/recurrent_cache.py(94): set_states") == "momentum-plugins (Python)"
    assert kind("triton/runtime/jit.py(600): run") == "Triton (Python)"
    assert kind("torch/nn/modules/module.py(1782): _call_impl") == "torch (Python)"
    assert kind("transformers/models/llama/modeling_llama.py(232): forward") == "other Python"
    assert kind("<string>(2): __init__") == "other Python"
    assert kind("<built-in method empty_like of type object at 0x7f>") == "Python built-ins"
    assert kind("aten::addmm") == "aten ops"
    assert kind("cudaLaunchKernel") == kind("cuLaunchKernelEx") == "CUDA runtime and driver"
    assert kind("autograd::engine::evaluate_function: EluBackward0") == "autograd nodes"
    assert kind("threading.py(331): wait") == "waiting"


def test_a_step_is_split_by_kind_and_an_idle_thread_is_left_out():
    x = torch.randn(64, 64)

    def step():                      # this file's Python ("other"), the library's, aten ops
        return elu_plus_one(x @ x).sum()
    stop = threading.Event()
    idle = threading.Thread(target=stop.wait, args=(30,))
    idle.start()
    try:
        result = host_trace.trace(step, steps=5)
    finally:
        stop.set()
        idle.join()
    kinds = result["kinds"]
    assert kinds["aten ops"] > 0
    if not result["python_frames"]:             # torch 2.11 under Python 3.12 records none
        assert TORCH < (2, 13), "torch.profiler recorded no Python frames"
        assert "recorded no Python frames here" in host_trace.markdown(result)
        return
    assert kinds["momentum-plugins (Python)"] > 0 and kinds["other Python"] > 0
    assert result["waiting_us"] > 0                                    # the idle thread: seen, not counted
    assert not any(name.startswith("threading.py(") for name, _ in result["python"])
    counted = sum(kinds.values())
    assert abs(result["total_us"] - counted) < 1e-6 * max(counted, 1)
    assert abs(sum(result["threads"].values()) - result["total_us"]) < 1e-6 * max(counted, 1)
    assert any(name.startswith("aten::mm") for name, _ in result["native"])
    assert any(name.startswith("plugins/attention/feature_maps.py(") for name, _ in result["python"])
    text = host_trace.markdown(result, "a step")
    assert text.startswith("a step") and "| aten ops |" in text
