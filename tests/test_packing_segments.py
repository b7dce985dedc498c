"""plugins.packing.Segments: each constructor against a plain loop or what it replaced
(plugins.validation.check_offsets, the padding shortcuts of momentum_attention), and its errors."""
import pytest
import torch

from plugins.attention import AttentionSpec, attend, momentum_attention
from plugins.packing import Segments


def random_starts(g, batch, length, mask=None):
    starts = torch.rand(batch, length, generator=g) < 0.2
    real = torch.ones(batch, length, dtype=torch.bool) if mask is None else mask
    count = real.long().cumsum(-1)
    starts = (starts | (count == 1)) & real          # each row's first real token starts a document
    return starts


@pytest.mark.parametrize("padded", [False, True])
def test_from_document_starts_lays_out_the_real_tokens_row_by_row(padded, make_generator):
    """Against a plain loop over the tokens: the real tokens in row-major order are one row, a
    document starts at each start, and unpacking puts every token back (zeros at padding)."""
    g = make_generator()
    batch, length = 3, 11
    mask = None
    if padded:
        mask = torch.rand(batch, length, generator=g) < 0.7
        mask[:, 0] = False
        mask[1, :] = False
        mask[2, 3] = True
    starts = random_starts(g, batch, length, mask)
    real = [(b, t) for b in range(batch) for t in range(length) if mask is None or mask[b, t]]
    offsets = [i for i, (b, t) in enumerate(real) if starts[b, t]] + [len(real)]
    segments = Segments.from_document_starts(starts, mask)
    assert segments.packed and (segments.batch, segments.length) == (batch, length)
    assert segments.cu_seqlens.tolist() == offsets and segments.cu_seqlens_cpu.tolist() == offsets
    assert segments.cu_seqlens_cpu.device.type == "cpu"
    assert (segments.index is None) == (not padded)
    x = torch.randn(batch, 2, length, 4, generator=g)
    tokens = torch.randn(batch, length, 5, generator=g)
    assert torch.equal(segments.pack(x), torch.stack([x[b, :, t] for b, t in real], 1)[None])
    assert torch.equal(segments.pack_tokens(tokens), torch.stack([tokens[b, t] for b, t in real])[None])
    keep = torch.ones(batch, length, dtype=torch.bool) if mask is None else mask
    assert torch.equal(segments.unpack(segments.pack(x)), x * keep[:, None, :, None])
    assert torch.equal(segments.unpack_tokens(segments.pack_tokens(tokens)), tokens * keep[..., None])


def test_from_cu_seqlens_keeps_one_host_copy():
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    segments = Segments.from_cu_seqlens(cu, 7)
    assert segments.cu_seqlens.dtype == torch.int64 and segments.cu_seqlens.tolist() == [0, 3, 3, 7]
    assert segments.cu_seqlens_cpu.tolist() == [0, 3, 3, 7] and segments.count == 3 and segments.batch == 1
    host = torch.tensor([0, 3, 3, 7])
    assert Segments.from_cu_seqlens(cu, 7, cu_seqlens_cpu=host).cu_seqlens_cpu is host


@pytest.mark.parametrize("cu, length, kwargs, message", [
    ([0, 3, 2, 7], 7, {}, "non-decreasing"),
    ([1, 3, 7], 7, {}, "start at 0"),
    ([0, 3, 6], 7, {}, "end at the sequence length 7"),
    ([0, 3, 7], 7, dict(batch=2), "batch of one row"),
    ([0, 3, 7], 7, dict(cu_seqlens_cpu=torch.tensor([0, 7])), "cu_seqlens_cpu must hold the same 3"),
    ([0, 3, 7], 7, dict(cu_seqlens_cpu=torch.tensor([0, 4, 3])), "cu_seqlens must be non-decreasing"),
    ([0, 3, 7], 7, dict(cu_seqlens_cpu=torch.tensor([0, 3, 7], device="meta")), "must be on the CPU"),
])
def test_from_cu_seqlens_errors(cu, length, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Segments.from_cu_seqlens(torch.tensor(cu), length, **kwargs)


def test_from_cu_seqlens_refuses_floats_and_lists():
    with pytest.raises(ValueError, match="int32 or int64"):
        Segments.from_cu_seqlens(torch.tensor([0.0, 7.0]), 7)
    with pytest.raises(ValueError, match="1-D int32/int64 tensor"):
        Segments.from_cu_seqlens([0, 7], 7)


def test_from_padding_mask_shortcuts():
    assert Segments.from_padding_mask(None, 2, 4).padding_mask is None
    assert Segments.from_padding_mask(torch.ones(2, 4, dtype=torch.bool), 2, 4).padding_mask is None
    right = torch.tensor([[True, True, False, False], [True, True, True, True]])
    segments = Segments.from_padding_mask(right, 2, 4)
    assert segments.order is None and segments.lengths.tolist() == [2, 4]
    left = torch.tensor([[False, True, False, True], [True, True, True, True]])
    segments = Segments.from_padding_mask(left, 2, 4)
    assert segments.order[0].tolist() == [1, 3, 0, 2] and segments.order[1].tolist() == [0, 1, 2, 3]
    assert segments.lengths.tolist() == [2, 4] and not segments.packed


@pytest.mark.parametrize("mask, message", [
    (torch.ones(2, 4), "bool tensor"),
    (torch.ones(2, 3, dtype=torch.bool), r"shape \(batch, length\) = \(2, 4\)"),
])
def test_from_padding_mask_errors(mask, message):
    with pytest.raises(ValueError, match=message):
        Segments.from_padding_mask(mask, 2, 4)


def test_from_document_starts_errors():
    with pytest.raises(ValueError, match="bool tensor"):
        Segments.from_document_starts(torch.zeros(2, 4))
    starts = torch.tensor([[False, True, False, False]])
    with pytest.raises(ValueError, match="first real token"):
        Segments.from_document_starts(starts)


@pytest.mark.parametrize("field, value, message", [
    ("momentum", 1.0, r"momentum must be in \[0, 1\)"), ("step_size", 0.0, "step_size must be > 0"),
    ("causal", "yes", "causal must be True or False"), ("feature_map", "tanh", "feature_map must be one of"),
    ("eps", -1.0, "eps must be > 0"), ("chunk_size", 0, "chunk_size must be an integer >= 1"),
    ("backend", "cuda", "backend must be one of"),
])
def test_attention_spec_validates_once(field, value, message):
    with pytest.raises(ValueError, match=message):
        AttentionSpec(**{"momentum": 0.5, field: value})


def test_attention_spec_normalises_numbers():
    spec = AttentionSpec(momentum=torch.tensor(0.25), chunk_size=torch.tensor(8))
    assert type(spec.momentum) is float and type(spec.chunk_size) is int
    with pytest.raises(AttributeError):
        spec.momentum = 0.1


@pytest.mark.parametrize("causal", [True, False])
def test_attend_with_segments_equals_each_document_alone(causal, make_generator):
    """The trusted entry point on a padded, multi-document batch: each document equals the
    public function on that document alone (float64)."""
    g = make_generator()
    batch, length, H, D = 2, 13, 2, 3
    mask = torch.rand(batch, length, generator=g) < 0.75
    mask[:, 0] = True
    starts = random_starts(g, batch, length, mask)
    q, k, v = (torch.randn(batch, H, length, D, generator=g, dtype=torch.float64) for _ in range(3))
    spec = AttentionSpec(momentum=0.6, step_size=0.7, causal=causal, chunk_size=4)
    out = attend(q, k, v, spec, segments=Segments.from_document_starts(starts, mask))
    assert (out[~mask[:, None, :, None].expand_as(out)] == 0).all()
    for b in range(batch):
        real = mask[b].nonzero().squeeze(1)
        begin = starts[b, real].nonzero().squeeze(1).tolist() + [real.numel()]
        for s, e in zip(begin[:-1], begin[1:]):
            at = real[s:e]
            alone = momentum_attention(q[b:b + 1, :, at], k[b:b + 1, :, at], v[b:b + 1, :, at], momentum=0.6,
                                       step_size=0.7, causal=causal, chunk_size=4)
            torch.testing.assert_close(out[b:b + 1, :, at], alone, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_static_documents_under_compile_equal_the_host_sized_layout(causal, padded, make_generator,
                                                                    monkeypatch):
    """What torch.compile builds (is_compiling() True: no host copy, offsets sized by (batch,
    length) alone, the padding as a last document) gives the host-sized layout's outputs and
    gradients (float64), with NaN in the padding reaching neither; documents of 1 to 9 tokens
    against chunk 4."""
    g = make_generator()
    batch, length, H, D = 3, 17, 2, 3
    mask = None
    if padded:
        mask = torch.rand(batch, length, generator=g) < 0.8
        mask[1, :4] = False
        mask[2, -3:] = False
    starts = random_starts(g, batch, length, mask)
    keep = torch.ones(batch, length, dtype=torch.bool) if mask is None else mask
    inputs = [torch.randn(batch, H, length, D, generator=g, dtype=torch.float64) for _ in range(3)]
    inputs = [torch.where(keep[:, None, :, None], t, float("nan")).requires_grad_() for t in inputs]
    spec = AttentionSpec(momentum=0.6, step_size=0.7, causal=causal, chunk_size=4)
    weight = torch.randn(batch, H, length, D, generator=g, dtype=torch.float64)

    def run(segments):
        out = attend(*inputs, spec, segments=segments)
        return (out, *torch.autograd.grad((out * weight).sum(), inputs))

    eager = run(Segments.from_document_starts(starts, mask))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    static = Segments.from_starts_or_padding(starts, mask)
    assert static.packed and static.cu_seqlens_cpu is None and static.count == batch * length
    assert (static.index is None) == (not padded)
    compiled = run(static)
    for got, want in zip(compiled, eager):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_static_documents_lay_out_offsets_and_padding(monkeypatch):
    """The static layout against values written by hand: two rows of 4, padding at (0, 3) and
    (1, 0), documents [a b][c] and [d e f]."""
    mask = torch.tensor([[True, True, True, False], [False, True, True, True]])
    starts = torch.tensor([[True, False, True, False], [False, True, False, False]])
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    segments = Segments.from_document_starts(starts, mask)
    assert segments.cu_seqlens.tolist() == [0, 2, 3, 6, 6, 6, 6, 6, 8]
    assert segments.index.tolist() == [0, 1, 2, 5, 6, 7, 3, 4]
    tokens = torch.arange(1.0, 9.0).reshape(2, 4, 1)
    assert segments.pack_tokens(tokens)[0, :, 0].tolist() == [1, 2, 3, 6, 7, 8, 0, 0]
    back = segments.unpack_tokens(segments.pack_tokens(tokens))
    assert back[..., 0].tolist() == [[1, 2, 3, 0], [0, 6, 7, 8]]
    plain = Segments.from_document_starts(starts[:1, :3])
    assert plain.cu_seqlens.tolist() == [0, 2, 3, 3] and plain.index is None


@pytest.mark.parametrize("offsets, padded", [
    ([0, 3, 7, 10], [0, 3, 7, 10]),
    ([0, 3, 7, 9, 10], [0, 3, 7, 9, 10, 10, 10, 10]),
    ([0, 10], [0, 10]),
])
def test_collator_offsets_under_compile_pad_to_a_power_of_two(offsets, padded, make_generator, monkeypatch):
    """Under torch.compile a collator's offsets are the layout, padded with empty documents to a
    power of two of entries; attention over them equals the host-sized layout of the same starts."""
    g = make_generator()
    starts = torch.zeros(1, 10, dtype=torch.bool)
    starts[0, offsets[:-1]] = True
    q, k, v = (torch.randn(1, 2, 10, 3, generator=g, dtype=torch.float64) for _ in range(3))
    spec = AttentionSpec(momentum=0.6, step_size=0.7, chunk_size=4)
    eager = attend(q, k, v, spec, segments=Segments.from_starts_or_padding(starts))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    segments = Segments.from_starts_or_padding(starts, offsets=torch.tensor(offsets, dtype=torch.int32))
    assert segments.cu_seqlens.tolist() == padded and segments.cu_seqlens_cpu is None
    torch.testing.assert_close(attend(q, k, v, spec, segments=segments), eager, rtol=1e-10, atol=1e-12)


def test_front_order_is_the_stable_partition_and_restore_its_inverse():
    """front_order (cumulative sums, no sort: ONNX and torch.export take it) against the stable
    argsort it replaces, on random masks with empty and full rows."""
    from plugins.packing import front_order

    g = torch.Generator().manual_seed(5)
    mask = torch.rand(6, 11, generator=g) > 0.4
    mask[0], mask[1] = False, True
    order, restore = front_order(mask)
    assert torch.equal(order, torch.argsort((~mask).to(torch.int8), dim=-1, stable=True))
    positions = torch.arange(11).expand(6, 11)
    assert torch.equal(order.gather(1, restore), positions)
    assert torch.equal(restore.gather(1, order), positions)
