"""A fix for a torch bug that silently corrupts a later compile's LSTM gradients.

torch.onnx.export(dynamo=True) with dynamic shapes exports aten.lstm / aten.gru through a while_loop
decomposition (torch.export._patches): for the export it swaps the op's CompositeImplicitAutograd
kernel, and afterwards puts the old one back, but leaves the op's dispatch cache as the export
filled it (torch 2.13 and 2.15; on 2.15 the export fills it). Every later trace in the process
(torch.compile, torch.export) then runs the export-only decomposition, whose backward is wrong
("not trainable", its docstring says): a compiled MomentumLSTM's gradients were off by up to 470
after an ONNX export of the LSTM model. Clearing the op's dispatch cache on the way out of the swap,
as torch's own py_impl does when it registers a kernel, makes later traces resolve the restored
kernel."""
import contextlib


def _clearing_on_exit(swap):
    @contextlib.contextmanager
    def swap_then_clear(rnn_op, rnn_impl):
        try:
            with swap(rnn_op, rnn_impl):
                yield
        finally:
            rnn_op._dispatch_cache.clear()

    swap_then_clear.clears_dispatch_cache = True
    return swap_then_clear


def clear_dispatch_after_export_swaps():
    """Wraps torch.export._patches' swap (where the torch has it), once per process."""
    try:
        from torch.export import _patches
    except ImportError:
        return
    swap = getattr(_patches, "_register_rnn_while_loop_decomposition", None)
    if swap is not None and not getattr(swap, "clears_dispatch_cache", False):
        _patches._register_rnn_while_loop_decomposition = _clearing_on_exit(swap)
