"""Vanishing-gradient diagnostics of MomentumRNN, Section 2.3 (eq. 11–13, Fig. 2).

`hidden_gradient_norms` measures ‖∂L/∂h_t‖₂ for every time step t of a batch: the total
derivative of the loss with respect to the (top-layer) hidden state, through all later
steps, as in Fig. 2. `save_gradient_heatmap` draws those norms over training iterations.
matplotlib is imported only by the plotting helper, which draws on the Agg canvas
directly (no pyplot, no change of the global backend).
"""
import torch


def hidden_gradient_norms(rnn, inputs, loss_fn, state=None):
    """‖∂L/∂h_t‖₂ for t = 1..T, a (T,) tensor (Fig. 2).

    rnn: a layer with the calling convention (input, state) -> (output, RecurrentState),
    e.g. MomentumLSTM, MomentumRNN or OrthogonalMomentumRNN (its batch_first respected).
    inputs: a padded input tensor in rnn's layout. loss_fn(outputs) -> scalar loss, given
    the outputs in the same layout. The norm is taken over batch and hidden units.

    The sequence is run one step at a time with the state carried (exact, see the layer
    tests), and a zero perturbation δ_t is added to the top layer's h_t, where it feeds
    both the output and the next step; ∂L/∂δ_t is then the total derivative ∂L/∂h_t.
    """
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 3:
        raise ValueError("inputs must be a 3-D tensor in the rnn's layout, got "
                         f"{getattr(inputs, 'shape', type(inputs).__name__)}")
    time_dim = 1 if getattr(rnn, "batch_first", False) else 0
    outputs, perturbations = [], []
    for x_t in inputs.split(1, dim=time_dim):
        out_t, state = rnn(x_t, state)
        delta = torch.zeros_like(state.h[-1], requires_grad=True)
        perturbations.append(delta)
        h = torch.cat([state.h[:-1], (state.h[-1] + delta).unsqueeze(0)])
        state = state._replace(h=h)
        outputs.append(out_t + delta.unsqueeze(time_dim))
    loss = loss_fn(torch.cat(outputs, dim=time_dim))
    grads = torch.autograd.grad(loss, perturbations)
    return torch.stack([g.norm() for g in grads]).detach()


def save_gradient_heatmap(norms, path, *, iterations=None, title=None, log_scale=True, dpi=100):
    """Save a PNG heat map of ‖∂L/∂h_t‖₂: rows are training iterations, columns time steps.

    norms: (iterations, T) array-like of non-negative values (e.g. stacked outputs of
    hidden_gradient_norms). iterations: the training iteration of each row, used as the row
    labels (default 0, 1, …). log_scale plots log10 of the norms (zeros as the minimum).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    values = torch.as_tensor(norms, dtype=torch.float64)
    if values.dim() != 2 or values.numel() == 0:
        raise ValueError(f"norms must be a non-empty (iterations, T) array, got shape "
                         f"{tuple(values.shape)}")
    if bool((values < 0).any()) or not bool(torch.isfinite(values).all()):
        raise ValueError("norms must be finite and non-negative")
    if iterations is not None and len(iterations) != values.size(0):
        raise ValueError(f"iterations must give one number per row of norms ({values.size(0)}), "
                         f"got {len(iterations)}")
    label = "‖∂L/∂h_t‖₂"
    if log_scale:
        positive = values[values > 0]
        floor = positive.min() if positive.numel() else torch.tensor(1.0, dtype=torch.float64)
        values = torch.log10(values.clamp(min=floor))
        label = "log10 " + label
    fig = Figure(figsize=(8, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(values.numpy(), aspect="auto", origin="lower", interpolation="nearest",
                      extent=(0.5, values.size(1) + 0.5, -0.5, values.size(0) - 0.5))
    ax.set_xlabel("time step t")
    ax.set_ylabel("training iteration")
    if iterations is not None:
        rows = range(0, values.size(0), max(1, values.size(0) // 8))
        ax.set_yticks(list(rows), [str(iterations[r]) for r in rows])
    if title:
        ax.set_title(title)
    fig.colorbar(image, ax=ax, label=label)
    fig.savefig(path, dpi=dpi, format="png")
    return path
