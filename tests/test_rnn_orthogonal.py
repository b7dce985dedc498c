"""Orthogonal (DTRIV) RNN cells and layers vs literal float64 transcriptions."""
import math

import pytest
import torch
from rnn_literal import LITERAL_DRIVES
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from plugins.rnn import VARIANTS, OrthogonalMomentumRNN, OrthogonalRNNCell, RecurrentState, cell_names
from plugins.rnn.orthogonal import cayley_skew, henaff_skew, modrelu
from plugins.rnn.variants import read_hyperparameters

T, B, D, H = 6, 3, 4, 6
MU, S, BETA, EPS, F = 0.6, 0.7, 0.8, 1e-8, 3
KINDS = cell_names("rnn")
TOL = 1e-10


def literal_modrelu(z, b):
    out = torch.zeros_like(z)
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in z.shape]):
        idx = tuple(idx.tolist())
        mag = abs(float(z[idx])) + float(b[idx[-1]])
        out[idx] = math.copysign(mag, float(z[idx])) if mag > 0 and z[idx] != 0 else 0.0
    return out


def test_modrelu_literal(make_generator):
    gen = make_generator()
    z = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    b = 0.5 * torch.randn(5, generator=gen, dtype=torch.float64)
    assert torch.allclose(modrelu(z, b), literal_modrelu(z, b), rtol=0, atol=1e-15)


def hyper_for(kind):
    return read_hyperparameters(kind, momentum=MU, step_size=S, beta=BETA, eps=EPS)


def make_cell(kind, gen, orthogonal_map="matrix_exp", init="cayley"):
    cell = OrthogonalRNNCell(D, H, kind, restart=F if kind == "sr" else None, orthogonal_map=orthogonal_map,
                             init=init, **hyper_for(kind)).double()
    with torch.no_grad():
        cell.input_kernel.weight.normal_(0, 0.5, generator=gen)
        cell.bias.normal_(0, 0.2, generator=gen)
        original = cell.recurrent_kernel.parametrizations.weight.original
        original.copy_(0.3 * torch.randn(original.shape, generator=gen, dtype=torch.float64))
    return cell


def literal_drive(kind, g, v, m, step):
    """The input drive of each variant (DTRIV, eq. 9, eq. 15, Section 2.4), tests/rnn_literal.py."""
    hp = dict(mu=MU, s=S, beta=BETA, eps=EPS, restart=F if kind == "sr" else None)
    return LITERAL_DRIVES[kind](g, v, m, torch.as_tensor(step).reshape(-1), hp)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("orthogonal_map", ["matrix_exp", "cayley"])
def test_cell_literal(kind, orthogonal_map, make_generator):
    gen = make_generator()
    cell = make_cell(kind, gen, orthogonal_map)
    xs = torch.randn(2 * T, B, D, generator=gen, dtype=torch.float64, requires_grad=True)
    W, b = cell.input_kernel.weight, cell.bias
    Bmat = cell.recurrent_kernel.weight
    h = hr = torch.zeros(B, H, dtype=torch.float64)
    v = m = torch.zeros(B, H, dtype=torch.float64)
    state = None
    outs, refs = [], []
    for t, x in enumerate(xs, start=1):
        h, state = cell(x, h, state)
        drive, v, m = literal_drive(kind, x @ W.T, v, m, t)
        hr = modrelu(hr @ Bmat.T + drive, b)
        outs.append(h)
        refs.append(hr)
    out, ref = torch.stack(outs), torch.stack(refs)
    assert torch.allclose(out, ref, rtol=TOL, atol=TOL)
    leaves = [xs] + list(cell.parameters())
    ga = torch.autograd.grad(out.sum(), leaves)
    gb = torch.autograd.grad(ref.sum(), leaves)
    for a, b_ in zip(ga, gb):
        assert torch.allclose(a, b_, rtol=TOL, atol=TOL)


def shared_cells(layer):
    cells = []
    for k in range(layer.num_layers):
        cell = OrthogonalRNNCell(D if k == 0 else H, H, layer.cell, momentum=layer.momentum,
                                 step_size=layer.step_size, beta=layer.beta, eps=layer.eps,
                                 restart=layer.restart).double()
        cell.input_kernel.weight = getattr(layer, f"weight_ih_l{k}")
        cell.bias = getattr(layer, f"bias_l{k}")
        mine = cell.recurrent_kernel.parametrizations.weight
        theirs = layer.parametrizations[f"weight_hh_l{k}"]
        mine.original = theirs.original
        mine[0].base = theirs[0].base
        cells.append(cell)
    return cells


def reference(layer, x, state):
    finals = []
    for k, cell in enumerate(shared_cells(layer)):
        h = state.h[k]
        cs = (None if state.v is None else state.v[k], None if state.m is None else state.m[k],
              state.step)
        outs = []
        for xt in x:
            h, cs = cell(xt, h, cs)
            outs.append(h)
        x = torch.stack(outs)
        finals.append((h, None, cs[0], cs[1]))
    return x, finals


def randomise(layer, gen):
    with torch.no_grad():
        for name, p in layer.named_parameters():
            scale = 0.3 if "original" in name else 0.5
            p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return layer


def random_state(layer, gen, batch):
    shape = (layer.num_layers, batch, H)
    rnd = lambda: torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_()
    variant = VARIANTS[layer.cell]
    return RecurrentState(rnd(), None, rnd() if variant.has_v else None,
                          (torch.rand(shape, generator=gen, dtype=torch.float64).requires_grad_()
                           if variant.has_m else None),
                          torch.randint(0, 8, (batch,), generator=gen))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_layers,packed", [(1, False), (2, False), (2, True)])
def test_layer_matches_cells(kind, num_layers, packed, make_generator):
    gen = make_generator()
    layer = randomise(OrthogonalMomentumRNN(D, H, num_layers, cell=kind, restart=F if kind == "sr" else None,
                                            **hyper_for(kind)).double(), gen)
    lengths = torch.tensor([4, T, 1, 5]) if packed else torch.full((B,), T)
    batch = len(lengths)
    x = torch.randn(T, batch, D, generator=gen, dtype=torch.float64, requires_grad=True)
    state = random_state(layer, gen, batch)
    if packed:
        out, new_state = layer(pack_padded_sequence(x, lengths, enforce_sorted=False), state)
        out = pad_packed_sequence(out)[0]
    else:
        out, new_state = layer(x, state)
    probe = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    loss = (out * probe).sum() + sum(t.sum() for t in new_state[:4] if t is not None)
    ref_loss = 0.0
    for b, n in enumerate(lengths.tolist()):
        sub = RecurrentState(*[None if t is None else t[:, b:b + 1] for t in state[:4]],
                             state.step[b:b + 1])
        ref_out, finals = reference(layer, x[:n, b:b + 1], sub)
        assert torch.allclose(out[:n, b:b + 1], ref_out, rtol=TOL, atol=TOL)
        for i in range(4):
            if new_state[i] is not None:
                ref = torch.stack([f[i] for f in finals])
                assert torch.allclose(new_state[i][:, b:b + 1], ref, rtol=TOL, atol=TOL)
                ref_loss = ref_loss + ref.sum()
        ref_loss = ref_loss + (ref_out * probe[:n, b:b + 1]).sum()
    leaves = [x] + list(layer.parameters()) + [t for t in state[:4] if t is not None]
    ga = torch.autograd.grad(loss, leaves, allow_unused=True)
    gb = torch.autograd.grad(ref_loss, leaves, allow_unused=True)
    for leaf, a, b_ in zip(leaves, ga, gb):
        zero = torch.zeros_like(leaf)
        assert torch.allclose(zero if a is None else a, zero if b_ is None else b_,
                              rtol=TOL, atol=TOL)


@pytest.mark.parametrize("orthogonal_map", ["matrix_exp", "cayley"])
@pytest.mark.parametrize("init", ["henaff", "cayley"])
def test_initial_recurrent_matrix(orthogonal_map, init):
    torch.manual_seed(0)
    layer = OrthogonalMomentumRNN(D, H, cell="rnn", orthogonal_map=orthogonal_map,
                                  init=init).double()
    Bmat = layer.weight_hh_l0
    assert torch.allclose(Bmat.T @ Bmat, torch.eye(H, dtype=torch.float64), atol=1e-12)
    skew = layer.parametrizations.weight_hh_l0.original
    A = skew.tril() - skew.tril().T
    mask = torch.zeros(H, H, dtype=torch.bool)
    for j in range(H // 2):  # block-diagonal 2×2 skew blocks only
        mask[2 * j, 2 * j + 1] = mask[2 * j + 1, 2 * j] = True
    assert torch.all(A[~mask] == 0)
    values = A[torch.arange(0, H, 2), torch.arange(1, H, 2)]
    if init == "henaff":
        assert torch.all(values.abs() <= math.pi)
    else:
        assert torch.all((values <= 0) & (values >= -1.0))
    eye = torch.eye(H, dtype=torch.float64)
    expected = (torch.matrix_exp(A) if orthogonal_map == "matrix_exp"
                else torch.linalg.solve(eye - A / 2, eye + A / 2))
    assert torch.allclose(Bmat, expected, rtol=0, atol=1e-12)


def test_skew_initialisers_are_skew():
    for make in (henaff_skew, cayley_skew):
        A = make(7, torch.Generator().manual_seed(1), torch.float64)
        assert torch.equal(A, -A.T) and A[6].abs().sum() == 0


@pytest.mark.parametrize("steps", [None, 2])
def test_dynamic_trivialization(steps, make_generator):
    gen = make_generator()
    layer = randomise(OrthogonalMomentumRNN(D, H, cell="momentum",
                                            trivialization_steps=steps).double(), gen)
    param = layer.parametrizations.weight_hh_l0
    before = layer.weight_hh_l0.detach().clone()
    skew_before = param.original.detach().clone()
    layer.trivialization_step()
    assert torch.equal(param.original, skew_before)
    layer.trivialization_step()
    after = layer.weight_hh_l0.detach()
    assert torch.allclose(after, before, rtol=0, atol=1e-12)
    if steps is None:
        assert torch.equal(param.original, skew_before)
        assert torch.equal(param[0].base, torch.eye(H, dtype=torch.float64))
    else:
        lower = param.original.tril()  # torch stores −I here; only the skew part counts
        assert torch.all(lower - lower.T == 0)
        assert torch.allclose(param[0].base, before, rtol=0, atol=1e-12)
    x = torch.randn(T, B, D, generator=gen, dtype=torch.float64)
    layer(x)[0].sum().backward()
    with torch.no_grad():
        param.original -= 0.1 * param.original.grad
    moved = layer.weight_hh_l0
    assert not torch.allclose(moved, before)
    assert torch.allclose(moved.T @ moved, torch.eye(H, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("kwargs,match", [
    (dict(orthogonal_map="householder"), "orthogonal_map"), (dict(init="xavier"), "init"),
    (dict(trivialization_steps=0), "trivialization_steps"), (dict(cell="lstm"), "cell"),
    (dict(momentum=1.5), "momentum"), (dict(cell="sr"), "restart"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OrthogonalMomentumRNN(D, H, **kwargs)
    if "trivialization_steps" not in kwargs:
        with pytest.raises(ValueError, match=match):
            OrthogonalRNNCell(D, H, **kwargs)


def test_bad_input():
    layer = OrthogonalMomentumRNN(D, H)
    with pytest.raises(ValueError, match="input"):
        layer(torch.zeros(T, D))


@pytest.mark.parametrize("orthogonal_map", ["matrix_exp", "cayley"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_weights_are_refused_naming_the_dtype(dtype, orthogonal_map):
    """torch's orthogonal parametrization forms B in the parameter's dtype: in 16 bits the CPU's
    matrix_exp gave inf/NaN (|B Bᵀ − I| of 1e60 in bf16), so outputs ran to inf and NaN without an
    error, and the Cayley map failed inside torch's LU solve. Under autocast the float32 layer runs."""
    layer = OrthogonalMomentumRNN(D, H, cell="momentum", orthogonal_map=orthogonal_map)
    x = torch.randn(T, B, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(layer(x)[0]).all()
    layer.to(dtype)
    needle = rf"OrthogonalMomentumRNN holds its weights in {dtype}.*keep the layer in float32"
    for run in (lambda: layer(x.to(dtype)), lambda: layer.step(x[0].to(dtype))):
        with pytest.raises(ValueError, match=needle):
            run()
    cell = OrthogonalRNNCell(D, H, orthogonal_map=orthogonal_map).to(dtype)
    with pytest.raises(ValueError, match=rf"OrthogonalRNNCell holds its weights in {dtype}"):
        cell(x[0].to(dtype), torch.zeros(B, H, dtype=dtype))
