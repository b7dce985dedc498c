"""Waits for the device in one HF training step and one decoding step on a CUDA GPU (marker `gpu`):
torch's sync debug mode warns at every operation that makes the host wait for the device (a read
back, a copy from pageable host memory, a synchronising call). A model may wait at its edge, where
it reads the batch's description once, but no layer may: the count is the same at 2 and 4 layers.
The CPU tests (test_host_reads.py) count reads and tensors built from host data, but a copy to a
device cannot show on a CPU-only run; this one sees every kind. Both rows run the Triton kernels,
as a CUDA model does by default. Waits are told apart by the Python line that caused them: a wait
in a layer comes from the same line once per layer, so no line may wait more often at 4 layers
than at 2. Only the debug mode's own report counts: on an H200 (2026-11-28) the note that the mode
is a prototype ("does not yet detect all synchronizing operations"), given once per process,
made the first count of a process one more."""
import collections
import importlib.util
import warnings

import pytest
import torch
from test_host_reads import BATCH, LLAMA, batch, llama, native, with_rotary_positions

from hf_momentum.modeling_common import CACHE_NAME

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")]

# test_host_reads' models with heads of 64 (hidden 128, 2 heads): the head size the attention GPU
# tests compile the kernels for, so that these tests add autotuning but little compilation
ROWS = {"native momentum_transformer": lambda layers: native(layers, hidden=128),
        LLAMA: lambda layers: llama(layers, "momentum", hidden=128)}


# what torch's sync debug mode says at each synchronising operation (c10/cuda/CUDAFunctions.cpp)
SYNC_REPORT = "called a synchronizing CUDA operation"


def waits(step) -> collections.Counter:
    """The synchronisations that torch's debug mode reports while `step` runs, per Python line."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return collections.Counter(f"{warning.filename}:{warning.lineno}" for warning in caught
                               if SYNC_REPORT in str(warning.message))


def more_at_four_layers(counts: list) -> dict:
    """The lines that waited more often at 4 layers than at 2: {line: (at 2, at 4)}."""
    return {line: (counts[0][line], n) for line, n in counts[1].items() if n > counts[0][line]}


def training_waits(row: str, form: str, layers: int) -> collections.Counter:
    model = ROWS[row](layers).cuda().train()
    inputs = {name: value.cuda() for name, value in with_rotary_positions(model, batch(form)).items()}

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**inputs, labels=inputs["input_ids"], use_cache=False).loss
        loss.backward()

    step()                      # compiles and autotunes the kernels, which waits for the device
    return waits(step)


def decoding_waits(row: str, layers: int) -> collections.Counter:
    model = ROWS[row](layers).cuda().eval()
    inputs = {name: value.cuda() for name, value in with_rotary_positions(model, batch("padded")).items()}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(**inputs, use_cache=True)
        cache, mask = getattr(out, CACHE_NAME), inputs["attention_mask"]
        token = out.logits[:, -1:].argmax(-1)

        def step():
            nonlocal mask, token
            mask = torch.cat([mask, torch.ones(BATCH, 1, dtype=mask.dtype, device="cuda")], dim=1)
            token = model(input_ids=token, attention_mask=mask, **{CACHE_NAME: cache},
                          use_cache=True).logits[:, -1:].argmax(-1)

        step()
        return waits(step)


@pytest.mark.parametrize("form", ["padded", "packed"])
@pytest.mark.parametrize("row", list(ROWS))
def test_no_layer_waits_for_the_device_in_training(row, form):
    counts = [training_waits(row, form, layers) for layers in (2, 4)]
    assert not more_at_four_layers(counts), f"{row}, {form}: waits per line at 2 and 4 layers {counts}"


@pytest.mark.parametrize("row", list(ROWS))
def test_no_layer_waits_for_the_device_in_decoding(row):
    counts = [decoding_waits(row, layers) for layers in (2, 4)]
    assert not more_at_four_layers(counts), f"{row}: waits per line at 2 and 4 layers {counts}"


def test_the_debug_mode_is_seen():
    """The count itself: a read back is reported."""
    x = torch.ones(3, device="cuda")
    assert sum(waits(lambda: x.sum().item()).values()) >= 1


def test_a_wait_per_layer_is_caught():
    """The comparison itself, on counts a layer's wait would give: one line twice as often."""
    edge, layer = "modeling.py:10", "attend.py:20"
    assert more_at_four_layers([collections.Counter({edge: 1, layer: 2}),
                                collections.Counter({edge: 1, layer: 4})]) == {layer: (2, 4)}
    assert not more_at_four_layers([collections.Counter({edge: 2}), collections.Counter({edge: 1})])
