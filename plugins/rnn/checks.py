"""Argument checks shared by the step-wise cells and the layers of plugins.rnn."""
import torch

from ..validation import MAX_INT, check_int


def check_sizes(input_size, hidden_size):
    for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
        check_int(value, name, low=1)


def check_step_counter(step, name="step"):
    """Time steps processed so far: integers in [0, 2^62 − 1] (an int64 counter never wraps)."""
    if isinstance(step, torch.Tensor):
        if step.is_floating_point() or step.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {step.dtype}")
        if step.numel() and (bool((step < 0).any()) or bool((step >= MAX_INT).any())):
            raise ValueError(f"{name} must be in [0, {MAX_INT - 1}], got min {int(step.min())}, "
                             f"max {int(step.max())}")
        return step
    return check_int(step, name, low=0, high=MAX_INT - 1)


def check_step_input(x, input_size):
    if x.dim() != 2 or x.size(1) != input_size:
        raise ValueError(f"input must have shape (batch, {input_size}), got {tuple(x.shape)}")


def check_input_dtype(x, weight):
    """nn.LSTM's rule: outside autocast the input has the weights' dtype (the fused kernels and
    matrix products would otherwise fail deep inside with a message naming neither)."""
    if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise ValueError(f"input dtype {x.dtype} does not match the weights' dtype {weight.dtype}: convert "
                         f"the input (input.to({weight.dtype})) or the model (model.to({x.dtype})), "
                         "or run under torch.autocast")
