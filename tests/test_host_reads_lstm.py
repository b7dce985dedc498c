"""Reads of device values by the host over one training forward + backward of the HF MomentumLSTM
model (padded rows, packed documents) and over one decoding step: the count does not grow with the
number of layers and is at most a stock transformers model's (Llama, SDPA) + 2 in training, at most
Llama's in decoding. Counted: scalar reads (`bool()` / `int()` / `.item()`:
aten._local_scalar_dense), aten.nonzero (its output size waits for the device) and copies from a
device to the CPU. On a CPU-only machine the copies are host-to-host and not counted; the scalar
reads and nonzero calls are counted wherever they run."""
import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from hf_momentum import MomentumLSTMConfig
from hf_momentum.modeling_common import CACHE_NAME
from hf_momentum.modeling_momentum_lstm import MomentumLSTMCache, MomentumLSTMForCausalLM

BATCH, LENGTH, HIDDEN, VOCAB = 2, 96, 32, 50
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class HostReads(TorchDispatchMode):
    """Counts the operations that make the host wait for a device value."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in ("_local_scalar_dense", "nonzero"):
            self.counts[name] += 1
        elif name in ("_to_copy", "copy_") and isinstance(out, torch.Tensor) and out.device.type == "cpu":
            source = args[1] if name == "copy_" else args[0]
            if isinstance(source, torch.Tensor) and source.device.type != "cpu":
                self.counts["device_to_host"] += 1
        return out

    @property
    def total(self):
        return sum(self.counts.values())


def batch(mode):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (BATCH, LENGTH), generator=gen)
    if mode == "padded":
        mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
        mask[1, :10] = 0
        return {"input_ids": ids, "attention_mask": mask}
    position_ids = torch.cat([torch.arange(40), torch.arange(LENGTH - 40)])[None].expand(BATCH, -1)
    return {"input_ids": ids, "position_ids": position_ids}


def to_device(inputs):
    return {name: t.to(DEVICE) for name, t in inputs.items()}


def training_reads(model, inputs):
    inputs = to_device(inputs)
    model.train()
    with HostReads() as reads:
        model(**inputs, labels=inputs["input_ids"], use_cache=False).loss.backward()
    return reads.total


def decoding_reads(model, inputs):
    """One generated token after a prefill of the padded batch, through the cache."""
    inputs = to_device(inputs)
    model.eval()
    with torch.no_grad():
        cache = MomentumLSTMCache(model.config) if isinstance(model, MomentumLSTMForCausalLM) else None
        out = model(**inputs, **{CACHE_NAME: cache}, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        mask = torch.cat([inputs["attention_mask"], inputs["attention_mask"][:, -1:]], 1)
        with HostReads() as reads:
            model(input_ids=token, attention_mask=mask, **{CACHE_NAME: getattr(out, CACHE_NAME)},
                  use_cache=True)
    return reads.total


def lstm(layers, cell):
    torch.manual_seed(0)
    config = MomentumLSTMConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=layers, cell=cell,
                                restart=3 if cell == "sr" else None)
    return MomentumLSTMForCausalLM(config).to(DEVICE)


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=2 * LENGTH)
    return LlamaForCausalLM._from_config(config, attn_implementation="sdpa").to(DEVICE)


@pytest.mark.parametrize("mode", ["padded", "packed"])
@pytest.mark.parametrize("cell", ["lstm", "momentum", "nag", "adam"])
def test_training_reads_do_not_grow_with_layers_and_stay_near_sdpa(cell, mode, llama):
    counts = {layers: training_reads(lstm(layers, cell), batch(mode)) for layers in (2, 4)}
    assert counts[2] == counts[4], counts
    assert counts[4] <= training_reads(llama, batch(mode)) + 2, counts


@pytest.mark.parametrize("cell", ["lstm", "momentum", "nag", "adam"])
def test_decoding_step_reads_do_not_grow_with_layers_and_stay_within_sdpa(cell, llama):
    """A decoding step reads no more than Llama's: the cache's states are the stack's own outputs,
    whose step counters it does not read back to check their range."""
    counts = {layers: decoding_reads(lstm(layers, cell), batch("padded")) for layers in (2, 4)}
    assert counts[2] == counts[4], counts
    assert counts[4] <= decoding_reads(llama, batch("padded")), counts
