"""Whether torch.export is tracing the call.

`torch.compiler.is_exporting()` is True under every torch.compile before torch 2.13: dynamo folds
it to the constant True (torch 2.11, `_dynamo/variables/torch.py`), where 2.13 reads the flag that
torch.export sets. On 2.11 a compiled Adam/RMSProp LSTM then took the exported program's path
(drive first, on torch's fused kernel) and the attention its export-only forms."""
import torch


def is_exporting() -> bool:
    """The flag torch.export sets around its tracing, strict and non-strict
    (`torch.compiler._is_exporting_flag`): dynamo reads it as the module global it is, so a
    compiled call sees False and an exported one True, on every torch this package supports."""
    return torch.compiler._is_exporting_flag


def exports_a_symbolic(size) -> bool:
    """Whether torch.export may trace `size` (a tensor dimension) as a symbol, so that a form which
    fixes it (a reshape into chunks, a loop over it) must not be taken: a SymInt under the default
    non-strict export; under strict export every size, since dynamo shows a symbolic size to the
    code as an int (the symbolic forms are exact at any size)."""
    if not is_exporting():
        return False
    return not isinstance(size, int) or torch.compiler.is_dynamo_compiling()


def onnx_exporting() -> bool:
    """torch.onnx.export is tracing the call (its torch.export stage included). Its own flag too:
    dynamo folds torch.onnx.is_in_onnx_export() to False, so in the exporter's strict capture
    (its fallback) only the flag that function reads says so (torch 2.11–2.15)."""
    if not is_exporting():
        return False
    return torch.onnx.is_in_onnx_export() or getattr(_exporter_flags(), "_is_onnx_exporting", False)


def _exporter_flags():
    """torch.onnx's private flags module (tests/test_attention_export.py checks it), or None."""
    try:
        from torch.onnx._internal.exporter import _flags
    except ImportError:
        return None
    return _flags


def exported_scan(step, init, xs):
    """torch's `scan(step, init, xs)` (`torch._higher_order_ops.scan`) in a traced graph. Before a
    non-strict export traces it, torch's compiled entry of every scan (`run_flattened_scan`, one code
    object) is dropped: torch keeps it from the last scan it traced, guarded on that trace's sizes,
    and an export of a symbolic length after one of a fixed length reused the fixed one (torch.export
    refused the length, "Constraints violated"; torch.onnx.export gave a fixed-length model; torch
    2.11-2.15, a module of plain torch does it too)."""
    import types

    from torch._higher_order_ops.scan import scan

    if is_exporting() and not torch.compiler.is_dynamo_compiling():
        from torch._dynamo.eval_frame import reset_code

        for code in scan.__code__.co_consts:
            if isinstance(code, types.CodeType) and code.co_name == "run_flattened_scan":
                reset_code(code)
    return scan(step, init, xs)
