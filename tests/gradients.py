"""Gradient comparison of a fast path with its float64 reference, shared by the tests."""
import torch


def assert_same_gradients(out, ref, params, generator, *, atol, rtol=0.0, ref_params=None):
    """The gradients of ⟨w, out⟩ w.r.t. params equal those of ⟨w, ref⟩ w.r.t. ref_params (None:
    params) for one random upstream w drawn from `generator`: every parameter and input is checked
    through one backward pass per side."""
    upstream = torch.randn(out.shape, generator=generator, dtype=out.dtype)
    got = torch.autograd.grad(out, list(params), upstream)
    want = torch.autograd.grad(ref, list(params if ref_params is None else ref_params), upstream)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
