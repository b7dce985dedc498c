"""plugins/rnn/stale_rnn_dispatch.py: after torch.export._patches' while_loop decomposition of
aten.lstm / aten.gru (what torch.onnx.export uses with dynamic shapes) is put back, the op resolves
its restored kernel again, not the export-only one the dispatch cache kept."""
import pytest
import torch
from torch._C import DispatchKey

import plugins.rnn  # noqa: F401  (installs the fix)

patches = pytest.importorskip("torch.export._patches")
if not hasattr(patches, "_register_rnn_while_loop_decomposition"):
    pytest.skip("this torch has no while_loop RNN decompositions to swap in", allow_module_level=True)


def resolved(op, key):
    return op._dispatch_cache[key] if key in op._dispatch_cache else op._get_dispatch(key)


@pytest.mark.parametrize("op,swap", [
    (torch.ops.aten.lstm.input, patches.register_lstm_while_loop_decomposition),
    (torch.ops.aten.gru.input, patches.register_gru_while_loop_decomposition),
], ids=["lstm", "gru"])
def test_the_restored_kernel_is_resolved_after_the_swap(op, swap):
    key = DispatchKey.AutogradCPU
    op._dispatch_cache.clear()
    before = resolved(op, key)
    op._dispatch_cache.clear()
    with swap():
        during = resolved(op, key)
    assert during is not before                      # the swap took effect, and was cached
    assert resolved(op, key) is before
