"""A function that torch.compile runs outside its graph, and eager mode calls directly."""
import functools

import torch


def eager_under_compile(fn):
    """`fn`, behind an explicit graph break under torch.compile: dynamo then calls a
    `torch._disable_dynamo` copy of it. Eager calls go straight to `fn`: no dynamo import (that copy
    loads dynamo on its first call, not at import: test_architecture) and no disable context per
    call."""
    outside = torch._disable_dynamo(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling():
            return outside(*args, **kwargs)
        return fn(*args, **kwargs)

    return call
