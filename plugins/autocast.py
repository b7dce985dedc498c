"""Autocast as the layers meet it: where it exists, a region without it, and one cast of an input
that several projections read."""
import contextlib

import torch

# Device types with an autocast, found once: torch.compile of torch 2.11 (the GPU machine's) cannot
# trace torch.amp.is_autocast_available, and a compiled drive-first layer asks at each call.
AUTOCAST_DEVICES = frozenset(
    device for device in ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "mtia", "maia", "ipu",
                          torch._C._get_privateuse1_backend_name())
    if torch.amp.is_autocast_available(device))


def autocast_off(device_type: str):
    """A region without autocast on `device_type` (nothing to turn off where autocast does not
    exist, as on meta tensors, or is not enabled)."""
    if device_type not in AUTOCAST_DEVICES or not torch.is_autocast_enabled(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


def shared_input(x: torch.Tensor) -> torch.Tensor:
    """`x` cast once to autocast's dtype where no gradient reaches it (generation, evaluation) and
    autocast would cast it again for each projection reading it: q, k and v each copied a
    decoding step's float32 LayerNorm output, two copy kernels per layer more than needed. Where x
    takes a gradient it is left to autocast, so that its gradient sums the projections' in x's
    own dtype rather than in the cast's. Autocast leaves float64 and non-float inputs alone; so
    does this."""
    device = x.device.type
    if (device not in AUTOCAST_DEVICES or not torch.is_autocast_enabled(device)
            or (x.requires_grad and torch.is_grad_enabled())
            or not x.is_floating_point() or x.dtype == torch.float64):
        return x
    return x.to(torch.get_autocast_dtype(device))
