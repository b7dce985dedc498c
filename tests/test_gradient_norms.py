"""‖∂L/∂h_t‖₂ (Fig. 2) vs autograd through a step-wise cell loop; heat-map output."""
import pytest
import torch

from plugins.gradient_norms import hidden_gradient_norms
from plugins.rnn import AdamLSTMCell, MomentumLSTM, MomentumRNN, MomentumRNNCell
from recipes.mnist.gradients import save_gradient_heatmap

T, B, D, H = 7, 3, 2, 4


def randomise(module, gen):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


def test_norms_match_cell_loop_tanh(make_generator):
    gen = make_generator()
    layer = randomise(MomentumRNN(D, H, cell="momentum", momentum=0.7, step_size=0.6).double(), gen)
    cell = MomentumRNNCell(D, H, 0.7, 0.6).double()
    cell.x2h.weight, cell.x2h.bias = layer.weight_ih_l0, layer.bias_ih_l0
    cell.h2h.weight, cell.h2h.bias = layer.weight_hh_l0, layer.bias_hh_l0
    x = torch.randn(T, B, D, generator=gen, dtype=torch.float64)
    target = torch.randn(T, B, H, generator=gen, dtype=torch.float64)
    loss_fn = lambda out: ((out - target) ** 2).mean() + out[-1].sum()
    norms = hidden_gradient_norms(layer, x, loss_fn)
    h = v = torch.zeros(B, H, dtype=torch.float64)
    hs = []
    for xt in x:
        h, v = cell(xt, h, v)
        hs.append(h)
    grads = torch.autograd.grad(loss_fn(torch.stack(hs)), hs)
    expected = torch.stack([g.norm() for g in grads])
    assert norms.shape == (T,)
    assert torch.allclose(norms, expected, rtol=1e-10, atol=1e-12)


def test_norms_top_layer_of_stack_batch_first(make_generator):
    gen = make_generator()
    kw = dict(momentum=0.5, step_size=0.8, beta=0.9, eps=1e-8)
    layer = randomise(MomentumLSTM(D, H, 2, cell="adam", batch_first=True, **kw).double(), gen)
    cells = []
    for k in range(2):
        cell = AdamLSTMCell(D if k == 0 else H, H, kw["momentum"], kw["step_size"], kw["beta"],
                            kw["eps"]).double()
        cell.x2h.weight, cell.x2h.bias = getattr(layer, f"weight_ih_l{k}"), getattr(layer, f"bias_ih_l{k}")
        cell.h2h.weight, cell.h2h.bias = getattr(layer, f"weight_hh_l{k}"), getattr(layer, f"bias_hh_l{k}")
        cells.append(cell)
    x = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    loss_fn = lambda out: out[:, -1].pow(2).sum() + 0.1 * out.sum()
    norms = hidden_gradient_norms(layer, x, loss_fn)
    zero_h = torch.zeros(B, H, dtype=torch.float64)
    zero_g = torch.zeros(B, 4 * H, dtype=torch.float64)
    states = [[zero_h, zero_h, zero_g, zero_g] for _ in cells]
    tops = []
    for t in range(T):
        inp = x[:, t]
        for cell, st in zip(cells, states):
            inp, (st[0], st[1]), st[2], st[3] = cell(inp, (st[0], st[1]), st[2], st[3])
        tops.append(inp)
    grads = torch.autograd.grad(loss_fn(torch.stack(tops, dim=1)), tops)
    expected = torch.stack([g.norm() for g in grads])
    assert torch.allclose(norms, expected, rtol=1e-10, atol=1e-12)


def test_norms_reject_bad_input():
    with pytest.raises(ValueError, match="inputs"):
        hidden_gradient_norms(MomentumRNN(D, H), torch.zeros(T, D), lambda o: o.sum())


def test_heatmap_png(tmp_path, make_generator):
    norms = torch.rand(5, T, generator=make_generator()) * 10.0 ** -torch.arange(T)
    norms[0, 0] = 0.0
    path = save_gradient_heatmap(norms, tmp_path / "grads.png", title="MomentumRNN")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_heatmap_labels_rows_with_iterations(tmp_path):
    path = save_gradient_heatmap(torch.rand(3, T), tmp_path / "g.png", iterations=[0, 25, 50])
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="iterations must give one number per row"):
        save_gradient_heatmap(torch.rand(3, T), tmp_path / "g.png", iterations=[0, 25])


@pytest.mark.parametrize("bad", [torch.ones(T), torch.ones(0, T), -torch.ones(2, T),
                                 torch.full((2, T), float("nan"))])
def test_heatmap_rejects_bad_norms(bad, tmp_path):
    with pytest.raises(ValueError, match="norms"):
        save_gradient_heatmap(bad, tmp_path / "x.png")
