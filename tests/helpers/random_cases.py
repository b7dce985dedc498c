"""Random configurations for tests/test_random_configurations.py: each `check_*` draws one case from
`rng` (shapes, hyperparameters, padding side, packing, hybrids, cells) and asserts what must hold for
any of them: every sequence of a padded or packed batch equals that sequence run alone, and the
recurrent (cached, step-by-step) form equals the whole. Float64 throughout, against float64
references (the Triton sweep: fp32 kernels under the interpreter, at the exactness tests' tolerance).
A failure names the drawn case."""
import contextlib
import math
import tempfile
from pathlib import Path

import pytest
import torch

F64_TOL = 1e-9


def case_error(case: dict, what: str) -> str:
    return f"{what}; case {case}"


def assert_close(got, expected, case, what, tol=F64_TOL):
    """|got − expected| ≤ tol · max(1, max |expected|), elementwise."""
    scale = max(1.0, expected.detach().abs().max().item()) if expected.numel() else 1.0
    error = (got.detach() - expected.detach()).abs().max().item() if expected.numel() else 0.0
    assert error <= tol * scale, case_error(case, f"{what}: max error {error:.2e}")


def padding_mask(rng, batch: int, length: int, pattern: str, *, allow_empty: bool) -> torch.Tensor:
    """(batch, length) bool, True = real: right or left padding, random holes, or none."""
    mask = torch.ones(batch, length, dtype=torch.bool)
    for b in range(batch):
        real = rng.randint(0 if allow_empty else 1, length)
        if pattern == "right":
            mask[b, real:] = False
        elif pattern == "left":
            mask[b, :length - real] = False
        elif pattern == "holes":
            mask[b] = torch.tensor([rng.random() < 0.7 for _ in range(length)])
            if not allow_empty and not mask[b].any():
                mask[b, rng.randrange(length)] = True
    return mask


def check_attention(rng, backend: str = "torch"):
    """`momentum_attention` on a padded batch of any pattern, causal (from an initial state or not)
    or eq. 14: each row's outputs and the gradients of q, k, v at its real positions equal the
    float64 token loop (eq. 12) or eq. 14 on that row's real tokens alone, padded causal outputs are
    0, and a prefill followed by single-token steps gives the outputs and final state of the whole
    call. backend "torch" in float64; "triton" (causal, elu + 1) in float32 against the same float64
    references, at exact fp32's tolerance."""
    from plugins.attention import (
        MomentumAttentionState,
        momentum_attention,
        momentum_attention_step,
        naive_noncausal_momentum_attention,
        naive_recurrent_momentum_attention,
    )
    B, H, N = rng.randint(1, 3), rng.randint(1, 3), rng.choice([1, 2, 5, 16, 31, 64, 65, 97])
    Dk, Dv = rng.choice([4, 8, 16, 20]), rng.choice([3, 8, 16])
    causal = backend == "triton" or rng.random() < 0.75
    dtype, tol = (torch.float64, F64_TOL) if backend == "torch" else (torch.float32, 1e-4)
    case = dict(B=B, H=H, N=N, Dk=Dk, Dv=Dv, causal=causal, momentum=rng.choice([0.0, 0.5, 0.9, 0.999]),
                step_size=rng.choice([1.0, 0.5, 3.0]), chunk=rng.choice([1, 4, 16, 64, 100]),
                feature_map=rng.choice(["elu", "relu"] if backend == "torch" else ["elu"]),
                pattern=rng.choice(["right", "left", "holes", "none"]),
                initial_state=causal and rng.random() < 0.4, backend=backend)
    mask = padding_mask(rng, B, N, case["pattern"], allow_empty=causal)
    case["real"] = mask.sum(1).tolist()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    q, k = (torch.randn(B, H, N, Dk, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, N, Dv, generator=gen, dtype=torch.float64)
    state0 = None
    if case["initial_state"]:
        state0 = MomentumAttentionState(s=torch.rand(B, H, Dk, Dv, generator=gen, dtype=torch.float64),
                                        z=torch.rand(B, H, Dk, generator=gen, dtype=torch.float64),
                                        m=torch.randn(B, H, Dk, Dv, generator=gen, dtype=torch.float64))
    hyper = dict(momentum=case["momentum"], step_size=case["step_size"], feature_map=case["feature_map"])
    call = dict(hyper, chunk_size=case["chunk"], backend=backend)
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    start = None if state0 is None else MomentumAttentionState(*(getattr(state0, n).to(dtype) for n in "szm"))
    if causal:
        out, final = momentum_attention(*leaves, causal=True, padding_mask=mask, initial_state=start,
                                        return_state=True, **call)
    else:
        out = momentum_attention(*leaves, causal=False, padding_mask=mask, **call)
    upstream = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((out * upstream.to(dtype)).sum(), leaves)
    for b in range(B):
        real = mask[b].nonzero().flatten()
        if len(real) == 0:
            continue
        keys = [t[b:b + 1, :, real].clone().requires_grad_() for t in (k, v)]
        if causal:
            query = q[b:b + 1, :, real].clone().requires_grad_()
            row_state = None if state0 is None else MomentumAttentionState(
                *(getattr(state0, n)[b:b + 1] for n in "szm"))
            ref, _ = naive_recurrent_momentum_attention(query, *keys, row_state, **hyper)
            got, up = out[b:b + 1, :, real], upstream[b:b + 1, :, real]
            assert not out[b, :, ~mask[b]].any(), case_error(case, f"row {b}: padded outputs not 0")
        else:
            query = q[b:b + 1].clone().requires_grad_()
            ref = naive_noncausal_momentum_attention(query, *keys, **hyper)
            got, up = out[b:b + 1], upstream[b:b + 1]
        assert_close(got, ref, case, f"row {b}: outputs", tol)
        expected = torch.autograd.grad((ref * up).sum(), [query, *keys])
        dq = grads[0][b:b + 1, :, real] if causal else grads[0][b:b + 1]
        for name, g, r in zip("qkv", (dq, grads[1][b:b + 1, :, real], grads[2][b:b + 1, :, real]), expected):
            assert_close(g, r, case, f"row {b}: d{name}", tol)
    if causal and N > 1:
        cut = rng.randint(1, N - 1)
        case["decode_from"] = cut
        qd, kd, vd = (t.to(dtype) for t in (q, k, v))
        with torch.no_grad():
            part, state = momentum_attention(qd[:, :, :cut], kd[:, :, :cut], vd[:, :, :cut], causal=True,
                                             padding_mask=mask[:, :cut], initial_state=start,
                                             return_state=True, **call)
            outs = [part]
            for t in range(cut, N):
                step, state = momentum_attention_step(qd[:, :, t:t + 1], kd[:, :, t:t + 1], vd[:, :, t:t + 1],
                                                      state, padding_mask=mask[:, t:t + 1], **call)
                outs.append(step)
        assert_close(torch.cat(outs, 2), out, case, "prefill + steps: outputs", tol)
        for name in ("s", "z", "m"):
            assert_close(getattr(state, name), getattr(final, name), case, f"prefill + steps: state {name}",
                         tol)


def check_attention_nonfinite(rng):
    """NaN and ±inf entries of q, k, v in a padded (causal or eq. 14) or packed batch: the outputs are
    NaN exactly where eq. 12 / 14 carries one (output i from q_i, and from k_j and each v_j entry's own
    column for the real j ≤ i of i's sequence, any real j for eq. 14), and the other outputs and the
    gradients at the finite inputs (from a loss on the finite outputs) equal those with the non-finite
    entries replaced by 0."""
    from plugins.attention import momentum_attention
    B, H, N = rng.randint(1, 3), rng.randint(1, 2), rng.choice([1, 3, 17, 40, 70])
    Dk, Dv = rng.choice([4, 8, 16]), rng.choice([3, 8])
    causal = rng.random() < 0.7
    packed = causal and rng.random() < 0.4
    case = dict(B=1 if packed else B, H=H, N=N, Dk=Dk, Dv=Dv, causal=causal,
                momentum=rng.choice([0.0, 0.6, 0.95]), chunk=rng.choice([4, 16, 64]))
    B = case["B"]
    segment = torch.zeros(B, N, dtype=torch.long)
    call = dict(momentum=case["momentum"], chunk_size=case["chunk"], causal=causal, backend="torch")
    if packed:
        cuts = sorted(rng.sample(range(1, N), min(rng.randint(0, 3), N - 1)))
        cu = torch.tensor([0, *cuts, N])
        for s in range(len(cu) - 1):
            segment[0, cu[s]:cu[s + 1]] = s
        real = torch.ones(B, N, dtype=torch.bool)
        call["cu_seqlens"] = cu
        case["cu_seqlens"] = cu.tolist()
    else:
        real = padding_mask(rng, B, N, "right", allow_empty=False)
        call["padding_mask"] = real
        case["real"] = real.sum(1).tolist()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    q, k = (torch.randn(B, H, N, Dk, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, N, Dv, generator=gen, dtype=torch.float64)
    case["non-finite"] = []
    for name, t in (("q", q), ("k", k), ("v", v)):
        for _ in range(rng.randint(0, 3)):
            at = (rng.randrange(B), rng.randrange(H), rng.randrange(N), rng.randrange(t.shape[-1]))
            t[at] = rng.choice([math.nan, math.inf, -math.inf])
            case["non-finite"].append((name, at))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    finite = [torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0).requires_grad_() for t in (q, k, v)]
    out, ref = momentum_attention(*leaves, **call), momentum_attention(*finite, **call)
    expected = torch.zeros(B, H, N, Dv, dtype=torch.bool)
    q_bad, k_bad, v_bad = ~torch.isfinite(q).all(-1), ~torch.isfinite(k).all(-1), ~torch.isfinite(v)
    for b in range(B):
        for i in range(N):
            if causal and not real[b, i]:
                continue
            keys = (real[b] & (segment[b] == segment[b, i])).nonzero().flatten()
            keys = keys[keys <= i] if causal else keys
            reached = q_bad[b, :, i] | k_bad[b][:, keys].any(-1)
            expected[b, :, i] = reached[:, None] | v_bad[b][:, keys].any(1)
    assert torch.equal(torch.isnan(out.detach()), expected), case_error(case, "where the outputs are NaN")
    kept = ~expected
    assert_close(out[kept], ref[kept], case, "finite outputs")
    upstream = torch.randn(out.shape, generator=gen, dtype=torch.float64) * kept
    got = torch.autograd.grad(torch.where(kept, out, 0).mul(upstream).sum(), leaves)
    want = torch.autograd.grad(torch.where(kept, ref, 0).mul(upstream).sum(), finite)
    for name, g, r, source in zip("qkv", got, want, (q, k, v)):
        at = torch.isfinite(source)
        assert_close(g[at], r[at], case, f"d{name} at the finite inputs")


def check_triton_attention(rng):
    """The Triton kernels (chunked or fused scans, split or not, chunk sizes that do not divide the
    length) on a padded batch from an initial state, or on packed segments (some empty), against the
    float64 references: tests/helpers/triton_attention.py's checks, at their tolerance."""
    from .triton_attention import check_padded_batch, force_splits, triton_ops, use_scan
    from .triton_varlen import check_packed_segments
    tri = triton_ops()
    case = dict(scan=rng.choice(["chunked", "chunked", "fused"]), splits=rng.choice([None, "auto", 1, 2, 3]),
                chunk=rng.choice([16, 20, 32, 64]), Dk=rng.choice([8, 12, 16, 32]),
                Dv=rng.choice([4, 12, 16, 40]),
                momentum=rng.choice([0.0, 0.3, 0.9, 0.99]), step_size=rng.choice([1.0, 0.7, 2.0]),
                H=rng.choice([1, 2]))
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    hyper = dict(H=case["H"], Dk=case["Dk"], Dv=case["Dv"], chunk=case["chunk"], beta=case["momentum"],
                 gamma=case["step_size"])
    with pytest.MonkeyPatch.context() as patch:
        use_scan(patch, case["scan"])
        if case["splits"] != "auto":
            force_splits(patch, case["splits"])
        try:
            if rng.random() < 0.5:
                # more than one token in all: a lone token's dq is eps-sized, all rounding
                case["lengths"] = [rng.choice([0, 1, rng.randint(2, 40), rng.randint(40, 130)])
                                   for _ in range(rng.randint(1, 4))]
                case["lengths"][0] += 2
                check_packed_segments(tri, gen, lengths=case["lengths"], init=rng.random() < 0.5, **hyper)
            else:
                N = rng.choice([2, 7, 33, 64, 65, 150])
                lengths = torch.tensor([N] + [rng.randint(0, N) for _ in range(rng.randint(0, 2))])
                case.update(N=N, lengths=lengths.tolist())
                check_padded_batch(tri, gen, B=len(lengths), N=N, lengths=lengths, **hyper)
        except AssertionError as error:
            raise AssertionError(case_error(case, str(error))) from None


def check_rnn_layers(rng):
    """MomentumLSTM / MomentumRNN of any cell, 1–3 layers, bidirectional or not, batch_first or not,
    biases or not, the filtered input aligned or not, from a random initial state or none: a padded
    batch (PackedSequence), a packed row (cu_seqlens) or an unpadded one gives each sequence its
    output, final state (h, c, v, m, step) and input gradient alone; `step` token by token gives the
    forward's outputs."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    import plugins.rnn.layers as layers
    from plugins.rnn import MomentumLSTM, MomentumRNN, RecurrentState
    family = rng.choice([MomentumLSTM, MomentumRNN])
    plain = "lstm" if family is MomentumLSTM else "rnn"
    cell = rng.choice(["momentum", "adam", "rmsprop", "nag", "sr", plain])
    options = {"restart": rng.randint(1, 6)} if cell == "sr" or (cell == "nag" and rng.random() < 0.3) else {}
    if cell == "momentum":
        options.update(momentum=rng.choice([0.0, 0.5, 0.9]), step_size=rng.choice([1.0, 0.3]))
    case = dict(family=family.__name__, cell=cell, options=options, input=rng.randint(1, 7),
                hidden=rng.randint(1, 6), layers=rng.randint(1, 3), bidirectional=rng.random() < 0.3,
                bias=rng.random() < 0.8, batch_first=rng.random() < 0.5, align=rng.choice([1, 8]),
                initial_state=rng.random() < 0.5,
                lengths=[rng.randint(1, 9) for _ in range(rng.randint(1, 4))])
    layouts = ["PackedSequence", "plain"] + ([] if case["bidirectional"] else ["cu_seqlens"])
    case["layout"] = rng.choice(layouts)
    if case["layout"] == "plain":
        case["lengths"] = [max(case["lengths"])] * len(case["lengths"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layers, "INPUT_ALIGN", case["align"])
        torch.manual_seed(rng.randrange(1 << 30))
        model = family(case["input"], case["hidden"], case["layers"], cell=cell, bias=case["bias"],
                       batch_first=case["batch_first"], bidirectional=case["bidirectional"],
                       **options).double()
        lengths, bf = case["lengths"], case["batch_first"]
        B, T = len(lengths), max(lengths)

        def laid_out(x):                     # (B, T, ·) as the module takes it, and back
            return x if bf else x.transpose(0, 1)
        x = torch.randn(B, T, case["input"], dtype=torch.float64)
        for b in range(B):
            x[b, lengths[b]:] = 0
        x.requires_grad_()
        state = None
        if case["initial_state"]:
            fresh = model(laid_out(torch.zeros(B, 1, case["input"], dtype=torch.float64)))[1]
            state = RecurrentState(*(None if t is None else torch.randn_like(t) if t.is_floating_point()
                                     else t + rng.randint(0, 5) for t in fresh))
            if state.m is not None:                    # a second moment is non-negative
                state = state._replace(m=torch.rand_like(state.m))
        if case["layout"] == "PackedSequence":
            packed = pack_padded_sequence(laid_out(x), torch.tensor(lengths), batch_first=bf,
                                          enforce_sorted=False)
            out, final = model(packed, state)
            out = pad_packed_sequence(out, batch_first=True)[0]
        elif case["layout"] == "cu_seqlens":
            row = torch.cat([x[b, :lengths[b]] for b in range(B)])[None]
            cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
            flat, final = model(laid_out(row), state, cu_seqlens=cu)
            flat = laid_out(flat)[0]
            out = torch.stack([torch.cat([flat[cu[b]:cu[b + 1]],
                                          flat.new_zeros(T - lengths[b], flat.shape[-1])]) for b in range(B)])
        else:
            out, final = model(laid_out(x), state)
            out = laid_out(out)
        upstream = torch.randn_like(out)
        for b in range(B):
            upstream[b, lengths[b]:] = 0
        dx = torch.autograd.grad((out * upstream).sum(), x)[0]
        for b in range(B):
            alone_x = x[b:b + 1, :lengths[b]].detach().requires_grad_()
            row_state = None if state is None else RecurrentState(
                *(None if t is None else t[:, [b]] if t.dim() > 1 else t[[b]] for t in state))
            alone, alone_final = model(laid_out(alone_x), row_state)
            alone = laid_out(alone)
            assert_close(out[b, :lengths[b]], alone[0], case, f"sequence {b}: output")
            for name in ("h", "c", "v", "m"):
                if getattr(final, name) is not None:
                    assert_close(getattr(final, name)[:, b], getattr(alone_final, name)[:, 0], case,
                                 f"sequence {b}: final {name}")
            assert int(final.step[b]) == int(alone_final.step[0]), case_error(case, f"sequence {b}: step")
            expected = torch.autograd.grad((alone * upstream[b:b + 1, :lengths[b]]).sum(), alone_x)[0]
            assert_close(dx[b, :lengths[b]], expected[0], case, f"sequence {b}: input gradient")
            if not case["bidirectional"]:
                steps, step_state = [], row_state
                with torch.no_grad():
                    for t in range(lengths[b]):
                        y, step_state = model.step(alone_x[:, t], step_state)
                        steps.append(y)
                assert_close(torch.stack(steps, 1)[0], alone[0], case, f"sequence {b}: step by step")


def padded_ids(sequences, side: str):
    """(ids, attention mask) of a batch padded with 0, the models' pad id, on `side`."""
    from .hf_heads import padded
    return padded(sequences, side, pad=0)


def check_cached_steps(rng, model, tokens, whole, case, tol):
    """A prefill of a random cut of `tokens` into the model's cache, then one token a step: the
    logits equal `whole`, the sequence's logits in one call."""
    cut = rng.randint(1, len(tokens) - 1)
    out = model(input_ids=tokens[None, :cut], use_cache=True)
    steps, cache = [out.logits[0]], out.past_key_values
    for t in range(cut, len(tokens)):
        out = model(input_ids=tokens[None, t:t + 1], past_key_values=cache, use_cache=True)
        steps.append(out.logits[0])
        cache = out.past_key_values
    assert_close(torch.cat(steps), whole, case, f"prefill of {cut} + cached steps", tol)


def check_causal_lm(rng, model, case, vocab: int, tol=F64_TOL, *, packed=True, left_position_ids=False):
    """A causal LM (float64, eval): padded rows (left or right) equal each row alone, packed documents
    (position_ids restarting) equal each alone, a cached prefill plus single-token steps equals the
    whole, and greedy generate() on a left-padded batch equals each prompt's alone (the rest of a row
    that stopped early is padding). `left_position_ids`: pass position_ids from the mask (RoPE and
    learned positions of stock models), as generate() does."""
    sequences = [torch.randint(3, vocab, (rng.randint(1, 10),)) for _ in range(rng.randint(1, 3))]
    side = rng.choice(["left", "right"])
    case.update(lengths=[len(s) for s in sequences], side=side)
    ids, mask = padded_ids(sequences, side)
    extra = {"position_ids": (mask.cumsum(1) - 1).clamp(min=0)} if left_position_ids else {}
    with torch.no_grad():
        alone = [model(input_ids=s[None], use_cache=False).logits[0] for s in sequences]
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False, **extra).logits
        for b, want in enumerate(alone):
            assert_close(logits[b][mask[b].bool()], want, case, f"padded row {b}", tol)
        if packed:
            positions = torch.cat([torch.arange(len(s)) for s in sequences])[None]
            flat = model(input_ids=torch.cat(sequences)[None], position_ids=positions,
                         use_cache=False).logits[0]
            for b, doc in enumerate(flat.split([len(s) for s in sequences])):
                assert_close(doc, alone[b], case, f"packed document {b}", tol)
        if len(sequences[0]) > 1:
            check_cached_steps(rng, model, sequences[0], alone[0], case, tol)
        if side == "left":
            batch = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False,
                                   pad_token_id=0)[:, ids.shape[1]:]
            for b, s in enumerate(sequences):
                alone_mask = torch.ones(1, len(s), dtype=torch.long)
                one = model.generate(input_ids=s[None], attention_mask=alone_mask, max_new_tokens=4,
                                     do_sample=False, pad_token_id=0)[0, len(s):].tolist()
                row = batch[b].tolist()
                assert row[:len(one)] == one and not any(row[len(one):]), \
                    case_error(case, f"generate, row {b}: {row} in the batch, {one} alone")


def native_causal_lm(rng, layers=None):
    """(float64 eval MomentumTransformerForCausalLM, its drawn config): hybrid layer_types (momentum,
    full and sliding softmax), each connection, pre or post norm, both feature maps."""
    from hf_momentum import MomentumTransformerConfig, MomentumTransformerForCausalLM
    layers = layers or rng.randint(1, 3)
    kinds = [rng.choice(["linear_attention", "linear_attention", "full_attention", "sliding_attention"])
             for _ in range(layers)]
    case = dict(vocab_size=23, hidden_size=rng.choice([8, 16]), num_hidden_layers=layers,
                num_attention_heads=rng.choice([1, 2]), intermediate_size=rng.choice([8, 32]),
                attention_momentum=rng.choice([0.0, 0.6, 0.95]), attention_step_size=rng.choice([1.0, 0.5]),
                attention_feature_map=rng.choice(["elu", "relu"]),
                connection=rng.choice(["none", "momentum", "adaptive"]),
                layer_norm=rng.choice(["pre", "post"]), hidden_dropout=0.0, max_position_embeddings=64,
                layer_types=kinds, pad_token_id=0, scale_embedding=rng.random() < 0.3,
                embedding_layer_norm=rng.random() < 0.3,
                sliding_window=rng.randint(1, 6) if "sliding_attention" in kinds else None)
    torch.manual_seed(rng.randrange(1 << 30))
    return MomentumTransformerForCausalLM(MomentumTransformerConfig(**case)).double().eval(), case


def check_native_causal_lm(rng):
    """MomentumTransformerForCausalLM (`native_causal_lm`, `check_causal_lm`)."""
    model, case = native_causal_lm(rng)
    check_causal_lm(rng, model, case, 23)


@contextlib.contextmanager
def auto_takes_triton_on_cpu():
    """backend "auto" takes the Triton kernels for CPU tensors (Triton's interpreter) as it does for
    CUDA tensors, so that a model runs the path it runs on a GPU."""
    from plugins.attention import backends
    plain = backends.use_triton

    def use_triton(backend, device, float64):
        if backend == "auto" and device.type == "cpu" and not float64:
            backend = "triton"
        return plain(backend, device, float64)
    backends.use_triton = use_triton
    try:
        yield
    finally:
        backends.use_triton = plain


def check_native_causal_lm_on_triton(rng):
    """MomentumTransformerForCausalLM in float32 on the GPU's path (the Triton kernels, under the
    interpreter): the layer's one-node training call, the prefill and the decoding step, at head
    dimensions of 8 to 24. Padded rows equal each row alone and a prefill plus cached steps the whole
    (exact fp32's tolerance), and the training loss and gradients equal the PyTorch backend's."""
    from hf_momentum import MomentumTransformerConfig, MomentumTransformerForCausalLM
    heads = rng.choice([1, 2, 3])
    case = dict(vocab_size=23, hidden_size=heads * rng.choice([8, 12, 16, 20, 24]),
                num_hidden_layers=rng.randint(1, 2), num_attention_heads=heads, intermediate_size=16,
                attention_momentum=rng.choice([0.0, 0.6, 0.95]),
                connection=rng.choice(["none", "momentum", "adaptive"]), hidden_dropout=0.0,
                max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(rng.randrange(1 << 30))
    model = MomentumTransformerForCausalLM(MomentumTransformerConfig(**case))
    sequences = [torch.randint(1, 23, (rng.randint(3, 12),)) for _ in range(rng.randint(1, 3))]
    side = rng.choice(["left", "right"])
    case.update(lengths=[len(s) for s in sequences], side=side)
    ids, mask = padded_ids(sequences, side)
    labels = ids.masked_fill(mask == 0, -100)
    with auto_takes_triton_on_cpu():
        model.eval()
        with torch.no_grad():
            alone = [model(input_ids=s[None], use_cache=False).logits[0] for s in sequences]
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            for b, want in enumerate(alone):
                assert_close(logits[b][mask[b].bool()], want, case, f"padded row {b}", 1e-4)
            check_cached_steps(rng, model, sequences[0], alone[0], case, 1e-4)
        model.train()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        grads = torch.autograd.grad(loss, list(model.parameters()))
    reference = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    expected = torch.autograd.grad(reference, list(model.parameters()))
    assert_close(loss, reference, case, "training loss", 1e-5)
    for (name, _), got, want in zip(model.named_parameters(), grads, expected):
        error = ((got - want).norm() / want.norm().clamp(min=1e-12)).item()
        assert error <= 1e-3, case_error(case, f"training gradient of {name}: {error:.1e} of its norm")


def lstm_causal_lm(rng, layers=None):
    """(float64 eval MomentumLSTMForCausalLM, its drawn config): any cell, 1–3 layers, with a
    projected embedding or not."""
    from hf_momentum import MomentumLSTMConfig, MomentumLSTMForCausalLM
    cell = rng.choice(["lstm", "momentum", "adam", "rmsprop", "nag", "sr"])
    case = dict(vocab_size=19, hidden_size=rng.choice([4, 8]), num_hidden_layers=layers or rng.randint(1, 3),
                cell=cell, embedding_size=rng.choice([None, 6]), pad_token_id=0, tie_word_embeddings=False,
                **({"restart": rng.randint(1, 5)} if cell == "sr" else {}))
    torch.manual_seed(rng.randrange(1 << 30))
    return MomentumLSTMForCausalLM(MomentumLSTMConfig(**case)).double().eval(), case


def check_lstm_causal_lm(rng):
    """MomentumLSTMForCausalLM (`lstm_causal_lm`, `check_causal_lm`; its rows are padded, not packed)."""
    model, case = lstm_causal_lm(rng)
    check_causal_lm(rng, model, case, 19, packed=False)


def check_stock_causal_lm(rng):
    """A stock transformers causal LM (Llama, Mistral, Qwen2, GPT-2, GPT-NeoX) with
    attn_implementation "momentum" or "linear_attention" (`check_causal_lm`, position_ids from the
    mask for its padded rows)."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    import hf_momentum  # noqa: F401  (registers the implementations)
    family = rng.choice(["llama", "mistral", "qwen2", "gpt2", "gpt_neox"])
    implementation = rng.choice(["momentum", "linear_attention"])
    common = dict(vocab_size=29, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    decoder = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                   max_position_embeddings=64, **common)
    config = {
        "llama": lambda: (LlamaForCausalLM, LlamaConfig(num_key_value_heads=rng.choice([1, 2]), **decoder)),
        "mistral": lambda: (MistralForCausalLM,
                            MistralConfig(num_key_value_heads=1, sliding_window=None, **decoder)),
        "qwen2": lambda: (Qwen2ForCausalLM, Qwen2Config(num_key_value_heads=2, **decoder)),
        "gpt2": lambda: (GPT2LMHeadModel,
                         GPT2Config(n_embd=16, n_layer=2, n_head=2, n_positions=64, **common)),
        "gpt_neox": lambda: (GPTNeoXForCausalLM, GPTNeoXConfig(**decoder)),
    }[family]
    cls, cfg = config()
    if implementation == "momentum":
        cfg.attention_momentum = rng.choice([0.0, 0.6, 0.9])
    case = dict(family=family, attn_implementation=implementation,
                attention_momentum=getattr(cfg, "attention_momentum", None))
    torch.manual_seed(rng.randrange(1 << 30))
    model = cls._from_config(cfg, attn_implementation=implementation).double().eval()
    check_causal_lm(rng, model, case, 29, left_position_ids=True)


def seq2seq_lm(rng, draw_tying=False):
    """(float64 eval encoder-decoder, its drawn config): MomentumSeq2SeqForConditionalGeneration
    (each cross-attention, connection) or MomentumLSTMSeq2SeqForConditionalGeneration (each cell,
    bidirectional encoder or not, with attention or not); with `draw_tying`, the LM head tied to the
    decoder's embedding or not (where their widths allow)."""
    from hf_momentum import (
        MomentumLSTMSeq2SeqConfig,
        MomentumLSTMSeq2SeqForConditionalGeneration,
        MomentumSeq2SeqConfig,
        MomentumSeq2SeqForConditionalGeneration,
    )
    special = dict(vocab_size=19, pad_token_id=0, decoder_start_token_id=1, eos_token_id=2)
    if rng.random() < 0.5:
        case = dict(kind="transformer", hidden_size=8, num_hidden_layers=rng.randint(1, 2),
                    encoder_layers=rng.randint(1, 2), num_attention_heads=rng.choice([1, 2]),
                    intermediate_size=16,
                    hidden_dropout=0.0, cross_attention=rng.choice(["momentum", "linear", "softmax"]),
                    connection=rng.choice(["none", "momentum"]), attention_momentum=rng.choice([0.0, 0.6]),
                    max_position_embeddings=64)
        cls, config = MomentumSeq2SeqForConditionalGeneration, MomentumSeq2SeqConfig
    else:
        cell = rng.choice(["lstm", "momentum", "adam", "rmsprop", "nag", "sr"])
        bidirectional = rng.random() < 0.5
        width = rng.choice([4, 6])
        case = dict(kind="lstm", cell=cell, encoder_embedding_size=6, encoder_hidden_size=width,
                    encoder_bidirectional=bidirectional, decoder_embedding_size=6,
                    hidden_size=rng.choice([4, 6]) if bidirectional else width,
                    num_hidden_layers=rng.randint(1, 2),
                    attention=rng.random() < 0.7, encoder_dropout_in=0.0, encoder_dropout_out=0.0,
                    decoder_dropout_in=0.0, decoder_dropout_out=0.0,
                    **({"restart": rng.randint(1, 5)} if cell == "sr" else {}))
        cls, config = MomentumLSTMSeq2SeqForConditionalGeneration, MomentumLSTMSeq2SeqConfig
    if draw_tying:
        widths_agree = case["kind"] == "transformer" or case["hidden_size"] == case["decoder_embedding_size"]
        case["tie_word_embeddings"] = rng.random() < 0.5 and widths_agree
    torch.manual_seed(rng.randrange(1 << 30))
    model = cls(config(**{k: v for k, v in case.items() if k != "kind"}, **special)).double().eval()
    return model, case


def check_seq2seq(rng):
    """Either encoder-decoder (`seq2seq_lm`): right-padded sources and targets give each pair its
    logits alone, and greedy or beam-3 generate() on the padded sources gives each source's
    hypothesis alone (a row that stopped early is filled with padding, or with EOS where
    transformers' beam search takes a pad id of 0 for none)."""
    model, case = seq2seq_lm(rng)
    sources = [torch.randint(3, 19, (rng.randint(1, 9),)) for _ in range(rng.randint(1, 3))]
    targets = [torch.cat([torch.tensor([1]), torch.randint(3, 19, (rng.randint(0, 6),))]) for _ in sources]
    beams = rng.choice([1, 3])
    case.update(sources=[len(s) for s in sources], targets=[len(t) for t in targets], beams=beams)
    src, src_mask = padded_ids(sources, "right")
    tgt, tgt_mask = padded_ids(targets, "right")
    with torch.no_grad():
        logits = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt,
                       decoder_attention_mask=tgt_mask, use_cache=False).logits
        for b, (s, t) in enumerate(zip(sources, targets)):
            alone = model(input_ids=s[None], decoder_input_ids=t[None], use_cache=False).logits[0]
            assert_close(logits[b, :len(t)], alone, case, f"pair {b}: logits")
        batch = model.generate(input_ids=src, attention_mask=src_mask, max_new_tokens=5, do_sample=False,
                               num_beams=beams)
        for b, s in enumerate(sources):
            one = model.generate(input_ids=s[None], max_new_tokens=5, do_sample=False,
                                 num_beams=beams)[0].tolist()
            row = batch[b].tolist()
            fill = {0, 2} if beams > 1 else {0}
            assert row[:len(one)] == one and set(row[len(one):]) <= fill, \
                case_error(case, f"generate, source {b}: {row} in the batch, {one} alone")


def check_fairseq_translation(rng):
    """fairseq's momentum_transformer under random arguments (each cross-attention, connection,
    feature map, chunk size, norm placement, --layer-types hybrids): encoder outputs of a left- or
    right-padded batch equal each sentence's alone, and incremental decoding with random beam
    reorderings equals the full forward (tests/helpers/fairseq_decoding.py). fairseq's softmax
    attention (full_attention layers) takes its softmax in float32 whatever the model's dtype, so a
    model with one is held to 1e-6."""
    from .fairseq_cli import build_model
    from .fairseq_decoding import check_incremental_decoding, padded_sentences
    layers, width, heads = rng.randint(1, 2), rng.choice([8, 16]), rng.choice([1, 2])
    args = ["--arch", "momentum_transformer", "--encoder-layers", str(layers),
            "--decoder-layers", str(layers), "--encoder-embed-dim", str(width),
            "--decoder-embed-dim", str(width), "--encoder-ffn-embed-dim", "16",
            "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", str(heads),
            "--decoder-attention-heads", str(heads), "--attention-momentum", str(rng.choice([0.0, 0.6, 0.9])),
            "--attention-step-size", str(rng.choice([1.0, 0.7])),
            "--cross-attention", rng.choice(["softmax", "linear", "momentum"]),
            "--connection", rng.choice(["none", "momentum", "adaptive"]),
            "--feature-map", rng.choice(["elu", "relu"]),
            "--attention-chunk-size", str(rng.choice([1, 3, 64]))]
    if rng.random() < 0.5:
        args += ["--encoder-normalize-before", "--decoder-normalize-before"]
    kinds = [rng.choice(["linear_attention", "full_attention"]) for _ in range(layers)]
    if rng.random() < 0.4:
        args += ["--layer-types", ",".join(kinds)]
    tol = 1e-6 if "--layer-types" in args and "full_attention" in kinds else F64_TOL
    case = {"args": " ".join(args)}
    with tempfile.TemporaryDirectory() as tmp:
        model, task, _ = build_model(Path(tmp), ["--task", "translation", "--source-lang", "src",
                                                 "--target-lang", "tgt"], args)
    model = model.double()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    lengths = [rng.randint(1, 9) for _ in range(rng.randint(1, 3))]
    left = rng.random() < 0.5
    batch, sentences = padded_sentences(task.source_dictionary, lengths, gen, left)
    case.update(lengths=lengths, left_pad=left)
    with torch.no_grad():
        out = model.encoder(batch, torch.tensor(lengths))["encoder_out"][0]
        for i, s in enumerate(sentences):
            alone = model.encoder(s[None], torch.tensor([len(s)]))["encoder_out"][0][:, 0]
            got = out[max(lengths) - len(s):, i] if left else out[:len(s), i]
            assert_close(got, alone, case, f"encoder, sentence {i}", tol)
        beams, count = 2, rng.randint(1, 2)
        source_lengths = [rng.randint(2, 8) for _ in range(count)]
        src, _ = padded_sentences(task.source_dictionary, source_lengths, gen, left_pad=True)
        encoded = model.encoder(src.repeat_interleave(beams, 0),
                                torch.tensor(source_lengths).repeat_interleave(beams))
    steps = rng.randint(2, 7)
    tgt, _ = padded_sentences(task.target_dictionary, [steps] * (count * beams), gen, left_pad=False)
    def reorder():                        # each sentence's rows keep to its own beams
        return torch.tensor([s * beams + rng.randrange(beams) for s in range(count) for _ in range(beams)])
    reorders = {t: reorder() for t in range(1, steps) if rng.random() < 0.4}
    case.update(sources=source_lengths, steps=steps, reorders={t: r.tolist() for t, r in reorders.items()})
    try:
        check_incremental_decoding(model, tgt, reorders, encoder_out=encoded, rtol=tol, atol=tol)
    except AssertionError as error:
        raise AssertionError(case_error(case, f"incremental decoding: {error}")) from None
