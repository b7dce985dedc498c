"""Device→host reads over one training forward + backward and one decoding step (issue 26):
each read (`bool()`/`int()`/`.item()` of a tensor, `nonzero`, a copy to the CPU) drains the
accelerator's queue, so a model may read the batch's description once at its edge but never
inside a layer. The count must not grow with the number of layers and must stay within
Llama-SDPA's + 2.

Rows: the native momentum transformer and stock Llama with attn_implementation="momentum";
the LSTM rows are in test_host_reads_lstm.py."""
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, LlamaConfig

import hf_momentum  # noqa: F401  (registers attn_implementation="momentum")
from hf_momentum import MomentumTransformerConfig, MomentumTransformerForCausalLM
from hf_momentum.modeling_common import CACHE_NAME
from plugins.packing import Segments

BATCH, LENGTH, HIDDEN, VOCAB = 2, 96, 32, 50
SYNCING_OPS = {"_local_scalar_dense", "nonzero"}
LLAMA = "Llama, attn_implementation='momentum'"


class HostReads(TorchDispatchMode):
    """Counts the ops that make the host wait for the device, and (`HostCopies`) each `.cpu()`
    of a CPU tensor: on a CPU-only run it returns the tensor itself, unseen by the dispatcher,
    where an accelerator's tensor would be copied and waited for."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.copies = HostCopies(self)

    def __enter__(self):
        self.copies.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        return self.copies.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in SYNCING_OPS or (name in ("_to_copy", "copy_") and _to_host(func, args, kwargs)):
            self.count += 1
        return func(*args, **kwargs)


class HostCopies(TorchFunctionMode):
    def __init__(self, reads: HostReads):
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.cpu and args[0].device.type == "cpu":
            self.reads.count += 1
        return func(*args, **(kwargs or {}))


def _to_host(func, args, kwargs) -> bool:
    """A copy from an accelerator tensor to the CPU (on a CPU-only run there is none)."""
    source = args[0] if func.overloadpacket.__name__ == "_to_copy" else args[1]
    target = kwargs.get("device", args[0].device if func.overloadpacket.__name__ == "copy_" else None)
    return source.device.type != "cpu" and target is not None and torch.device(target).type == "cpu"


def native(layers: int, hidden: int = HIDDEN):
    config = MomentumTransformerConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                                       num_attention_heads=2, max_position_embeddings=LENGTH + 8,
                                       hidden_dropout=0.0)
    return MomentumTransformerForCausalLM(config)


def llama(layers: int, implementation: str, hidden: int = HIDDEN):
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=LENGTH + 8)
    return AutoModelForCausalLM.from_config(config, attn_implementation=implementation)


def batch(form: str):
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, LENGTH))
    if form == "padded":
        mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
        mask[0, :10] = 0
        return dict(input_ids=ids, attention_mask=mask)
    positions = torch.cat([torch.arange(40), torch.arange(LENGTH - 40)])[None].expand(BATCH, -1)
    return dict(input_ids=ids, position_ids=positions)


class HostBuiltTensors(TorchDispatchMode):
    """Counts the tensors built from host data (`torch.tensor(x, device=...)`, `as_tensor` of a
    number): on an accelerator each is a copy from pageable host memory, which waits for the
    device's queue to drain; on CPU the dispatcher shows it as `lift_fresh`."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ("lift_fresh", "lift_fresh_copy"):
            self.count += 1
        return func(*args, **(kwargs or {}))


def with_rotary_positions(model, inputs):
    """A left-padded batch of a stock (rotary) model numbered from its real tokens, as generate()
    numbers it: at the default positions momentum attention refuses it."""
    if model.config.model_type == "momentum_transformer" or "attention_mask" not in inputs:
        return inputs
    return inputs | dict(position_ids=(inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0))


def training_reads(model, inputs, counter=HostReads) -> int:
    model.train()
    inputs = with_rotary_positions(model, inputs)
    reads = counter()
    with reads:
        model(**inputs, labels=inputs["input_ids"], use_cache=False).loss.backward()
    return reads.count


def decoding_reads(model, counter=HostReads) -> int:
    """Reads of one decoding step after a left-padded prompt."""
    model.eval()
    inputs = batch("padded")
    with torch.no_grad():
        out = model(**with_rotary_positions(model, inputs), use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        mask = torch.cat([inputs["attention_mask"], torch.ones(BATCH, 1, dtype=torch.long)], dim=1)
        reads = counter()
        with reads:
            model(input_ids=token, attention_mask=mask, **{CACHE_NAME: getattr(out, CACHE_NAME)},
                  use_cache=True)
    return reads.count


def generation_reads(model, tokens: int) -> int:
    """Reads while generate() decodes `tokens` tokens greedily after a left-padded prompt."""
    model.eval()
    reads = HostReads()
    with reads, torch.no_grad():
        model.generate(**batch("padded"), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                       pad_token_id=0)
    return reads.count


def sdpa_training_reads(form: str) -> int:
    return training_reads(llama(2, "sdpa"), batch(form))


ROWS = {"native momentum_transformer": native, LLAMA: lambda layers: llama(layers, "momentum")}


@pytest.mark.parametrize("form", ["padded", "packed"])
@pytest.mark.parametrize("row", list(ROWS))
def test_training_reads_do_not_grow_with_layers(row, form):
    counts = [training_reads(ROWS[row](layers), batch(form)) for layers in (2, 4)]
    assert counts[0] == counts[1], f"{row}, {form}: {counts[0]} reads at 2 layers, {counts[1]} at 4"


@pytest.mark.parametrize("form", ["padded", "packed"])
@pytest.mark.parametrize("row", list(ROWS))
def test_training_reads_stay_within_llama_sdpa_plus_two(row, form):
    count = training_reads(ROWS[row](4), batch(form))
    assert count <= sdpa_training_reads(form) + 2, f"{row}, {form}: {count} reads"


@pytest.mark.parametrize("row", list(ROWS))
def test_decoding_reads_do_not_grow_with_layers(row):
    counts = [decoding_reads(ROWS[row](layers)) for layers in (2, 4)]
    assert counts[0] == counts[1], f"{row}: {counts[0]} reads at 2 layers, {counts[1]} at 4"


@pytest.mark.parametrize("row", list(ROWS))
def test_decoding_reads_stay_within_llama_sdpa_plus_two(row):
    count = decoding_reads(ROWS[row](4))
    assert count <= decoding_reads(llama(4, "sdpa")) + 2, f"{row}: {count} reads in one decoding step"


def test_generate_reads_per_token_what_llama_sdpa_reads():
    """generate() reads its stop check once per token; the native model's decoding steps add no read:
    generate() leaves the positions to the model, which counts them within a bound it knows (given
    position_ids are read back to check them against the position table)."""
    per_token = [generation_reads(model, 7) - generation_reads(model, 3)
                 for model in (native(2), llama(2, "sdpa"))]
    assert per_token[0] == per_token[1], f"reads per 4 tokens: momentum {per_token[0]}, Llama {per_token[1]}"


@pytest.mark.parametrize("row", list(ROWS))
def test_no_layer_builds_a_tensor_from_host_data(row):
    """No layer builds a tensor from host numbers (eq. 13's decay powers did, once per layer: a
    wait for the queue per layer on a GPU): the count is the same at 2 and 4 layers, training
    (padded, packed) and decoding."""
    for form in ("padded", "packed"):
        counts = [training_reads(ROWS[row](layers), batch(form), HostBuiltTensors) for layers in (2, 4)]
        assert counts[0] == counts[1], f"{row}, {form}: {counts[0]} at 2 layers, {counts[1]} at 4"
    counts = [decoding_reads(ROWS[row](layers), HostBuiltTensors) for layers in (2, 4)]
    assert counts[0] == counts[1], f"{row}, decoding: {counts[0]} at 2 layers, {counts[1]} at 4"
    built = HostBuiltTensors()
    with built:
        torch.tensor(0.5) ** torch.arange(3.0)
    assert built.count == 1


def test_the_counter_sees_a_host_read_and_llama_sdpa_does_not_grow():
    """The counter itself: an .item() is seen, and Llama-SDPA (the baseline) reads a fixed
    number of times whatever its depth."""
    reads = HostReads()
    with reads:
        torch.ones(3).sum().item()
        torch.ones(3).nonzero()
        torch.ones(3).cpu()
    assert reads.count == 3
    for form in ("padded", "packed"):
        assert training_reads(llama(2, "sdpa"), batch(form)) == training_reads(llama(4, "sdpa"), batch(form))


def test_document_segments_read_the_device_once_and_describe_the_batch():
    """Segments.from_document_starts brings the offsets, the most documents in a row and the
    largest position to the host in one copy, and they match what a direct count gives."""
    torch.manual_seed(1)
    mask = torch.rand(3, 13) < 0.8
    mask[1] = False
    positions = torch.randint(0, 5, (3, 13))
    count = mask.long().cumsum(-1)
    starts = ((positions == 0) | (count == 1)) & mask
    reads = HostReads()
    with reads:
        segments = Segments.from_document_starts(starts, mask, positions=positions)
    assert reads.count == 1
    real_starts = starts.reshape(-1)[mask.reshape(-1)]
    expected = real_starts.nonzero().squeeze(1).tolist() + [int(mask.sum())]
    assert segments.cu_seqlens.tolist() == expected and segments.cu_seqlens_cpu.tolist() == expected
    assert segments.index.tolist() == mask.reshape(-1).nonzero().squeeze(1).tolist()
    assert segments.most_documents == int(starts.sum(-1).max())
    assert segments.max_position == int(positions.max())
    assert Segments.from_document_starts(starts, mask).max_position is None


@pytest.mark.parametrize("form", ["padded", "packed"])
def test_positions_beyond_the_embedding_are_refused(form):
    """The position-range check read with the batch's description, or skipped for positions the
    model counts itself within the range, still refuses a position beyond it."""
    model = native(2)
    limit = model.config.max_position_embeddings
    inputs = batch(form)
    if form == "packed":
        positions = inputs["position_ids"].clone()
        positions[1, 40:] += limit - (LENGTH - 41)      # the second document ends at the limit
    else:
        positions = torch.arange(limit - LENGTH + 1, limit + 1)[None].expand(BATCH, -1)
    with pytest.raises(ValueError, match=f"position {limit} is beyond max_position_embeddings"):
        model(**inputs | dict(position_ids=positions), use_cache=False)
    too_long = torch.randint(0, VOCAB, (1, limit + 1))
    with pytest.raises(ValueError, match=f"position {limit} is beyond max_position_embeddings"):
        model(input_ids=too_long, use_cache=False)


@pytest.mark.parametrize("padding", ["none", "all real", "right", "left and middle"])
def test_starts_or_padding_equals_the_padding_form_for_one_document_per_row(padding):
    """With one document per row, the one-copy description is the one from_padding_mask gives
    (reads aside); with several in a row it is from_document_starts'."""
    gaps = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 1, 1, 1, 0]]).bool()
    mask = {"none": None, "all real": torch.ones(2, 9, dtype=torch.bool),
            "right": torch.arange(9) < torch.tensor([[6], [9]]), "left and middle": gaps}[padding]
    real = torch.ones(2, 9, dtype=torch.bool) if mask is None else mask
    starts = real & (real.long().cumsum(-1) == 1)
    reads = HostReads()
    with reads:
        rows = Segments.from_starts_or_padding(starts, mask)
    assert reads.count == 1
    expected = Segments.from_padding_mask(mask, 2, 9)
    assert not rows.packed and rows.most_documents == 1
    for field in ("padding_mask", "lengths", "order"):
        got, want = getattr(rows, field), getattr(expected, field)
        assert (got is None) == (want is None), field
        assert got is None or torch.equal(got, want), field
    several = starts.clone()
    several[1, 7] = True
    packed = Segments.from_starts_or_padding(several, mask)
    documents = Segments.from_document_starts(several, mask)
    assert packed.packed and torch.equal(packed.cu_seqlens, documents.cu_seqlens)
