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
