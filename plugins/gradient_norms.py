"""Vanishing-gradient diagnostics of MomentumRNN, Section 2.3 (eq. 11–13, Fig. 2).

`hidden_gradient_norms` measures ‖∂L/∂h_t‖₂ for every time step t of a batch: the total
derivative of the loss with respect to the (top-layer) hidden state, through all later
steps, as in Fig. 2. Drawing them is a recipe's job (recipes/mnist/gradients.py).
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
