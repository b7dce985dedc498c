"""torch.compile of a float32 MomentumLSTM in training on the CPU whose input needs no gradient (raw
features, or a frozen embedding as under LoRA): torch's fused LSTM there is oneDNN's, which
AOTAutograd cannot differentiate without an input gradient (pytorch#158007). That call runs eagerly
under compile, as nn.LSTM does, and the compiled layer gives eager's outputs, states and gradients;
where the input needs a gradient the layer still compiles as one graph. aot_eager traces forward and
backward as inductor does, without its code generation."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from plugins.rnn import MomentumLSTM

CELLS = ["lstm", "momentum"]


def outputs_and_grads(layer, run, x, state):
    layer.zero_grad(set_to_none=True)
    out, new = run(x, state)
    tensors = [out, new.h, new.c]
    loss = sum((t * torch.linspace(-1, 1, t.numel()).view_as(t)).sum() for t in tensors)
    loss.backward()
    return [t.detach() for t in tensors] + [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("cell", CELLS)
def test_compiled_layer_on_an_input_without_gradient_equals_eager(cell):
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = MomentumLSTM(3, 5, 2, cell=cell).train()
    x = torch.randn(6, 3, 3)
    state = (torch.randn(2, 3, 5), torch.randn(2, 3, 5))
    eager = outputs_and_grads(layer, layer, x, state)
    compiled = outputs_and_grads(layer, torch.compile(layer, backend="aot_eager"), x, state)
    assert len(compiled) == 3 + len(list(layer.parameters()))
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell", CELLS)
def test_an_input_that_needs_a_gradient_still_compiles_as_one_graph(cell):
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = MomentumLSTM(3, 5, 2, cell=cell).train()
    x = torch.randn(6, 3, 3, requires_grad=True)
    out, _ = torch.compile(layer, backend="aot_eager", fullgraph=True)(x)
    (grad,) = torch.autograd.grad(out.sum(), x)
    (want,) = torch.autograd.grad(layer(x)[0].sum(), x)
    torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-6)


def test_causal_lm_with_a_frozen_embedding_trains_compiled():
    from transformers import AutoConfig, AutoModelForCausalLM

    import hf_momentum  # noqa: F401

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "momentum_lstm", vocab_size=40, hidden_size=8, num_hidden_layers=2, cell="lstm",
        tie_word_embeddings=False)).train()
    model.get_input_embeddings().weight.requires_grad_(False)
    ids = torch.randint(3, 40, (2, 7))
    results = []
    for run in (model, torch.compile(model, backend="aot_eager")):
        model.zero_grad(set_to_none=True)
        loss = run(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        results.append([loss.detach()] + [p.grad.clone() for p in model.parameters() if p.requires_grad])
    assert len(results[1]) == len(results[0]) > 4
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
