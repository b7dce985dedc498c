"""LoRA through PEFT on the attentional MomentumLSTM encoder-decoder: the encoder's and the decoder's
recurrent weights (`target_parameters`, PEFT's ParamWrapper, which puts the adapted weights in place
only while the stack module's forward runs: the decoder's steps are calls of it) and the attention's
projections (`target_modules`). The adapter changes the outputs of both stacks; only the LoRA factors
train, and training lowers the loss; generation through the cache runs the adapted weights at every
step (cached and uncached generate() agree); merge_and_unload computes what the adapted model does;
gradient checkpointing recomputes with the adapted weights."""
import pytest
import torch
from test_hf_model_common import counting_checkpoint
from test_hf_momentum_lstm_seq2seq import model, padded, random_seqs
from transformers.modeling_layers import GradientCheckpointingLayer

peft = pytest.importorskip("peft")
from peft import LoraConfig, get_peft_model  # noqa: E402

LAYERS = 2
RECURRENT = [f"{side}.lstm.{name}_l{k}" for side in ("encoder", "decoder") for k in range(LAYERS)
             for name in ("weight_ih", "weight_hh")]


def adapted(targets=RECURRENT, modules=("input_proj", "output_proj"), seed=0):
    """A PEFT model over a fresh encoder-decoder, its LoRA factors random (not the zero start)."""
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_parameters=list(targets), target_modules=list(modules),
                        init_lora_weights=False)
    return get_peft_model(model(num_hidden_layers=LAYERS), config)


def batch(generator):
    src, mask = padded(random_seqs(generator, [6, 3, 5]), "left")
    labels, tgt_mask = padded(random_seqs(generator, [4, 2, 5]), "right")
    return dict(input_ids=src, attention_mask=mask, labels=labels.masked_fill(tgt_mask == 0, -100),
                decoder_attention_mask=tgt_mask)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_lora_on_either_stack_changes_its_outputs(side, make_generator):
    inputs = batch(make_generator())
    lora = adapted([name for name in RECURRENT if name.startswith(side)], modules=())
    with torch.no_grad():
        out = lora(**inputs)
        with lora.disable_adapter():
            base = lora(**inputs)
    assert (out.logits - base.logits).abs().max() > 1e-3
    if side == "decoder":        # the encoder's outputs are the base model's
        torch.testing.assert_close(out.encoder_last_hidden_state, base.encoder_last_hidden_state,
                                   rtol=0, atol=0)


def test_only_lora_factors_train_and_lower_the_loss(make_generator):
    inputs = batch(make_generator())
    lora = adapted()
    frozen = {name: p.detach().clone() for name, p in lora.named_parameters() if not p.requires_grad}
    trained = [p for p in lora.parameters() if p.requires_grad]
    assert trained and all("lora_" in name for name, p in lora.named_parameters() if p.requires_grad)
    optimizer = torch.optim.Adam(trained, lr=5e-2)
    first = None
    for _ in range(20):
        loss = lora(**inputs).loss
        optimizer.zero_grad()
        loss.backward()
        if first is None:          # every adapter takes part: each factor has a gradient
            first = loss.item()
            idle = [name for name, p in lora.named_parameters() if p.requires_grad and not p.grad.any()]
            assert not idle, idle
        optimizer.step()
    assert lora(**inputs).loss.item() < 0.9 * first
    for name, p in lora.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name


def test_cached_generation_runs_the_adapted_weights_and_merging_keeps_them(make_generator):
    inputs = batch(make_generator())
    lora = adapted().eval()
    kwargs = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=6,
                  min_new_tokens=6, do_sample=False)
    with torch.no_grad():
        cached = lora.generate(**kwargs)
        assert torch.equal(cached, lora.generate(**kwargs, use_cache=False))
        logits = lora(**inputs).logits
        merged = lora.merge_and_unload()
        torch.testing.assert_close(merged(**inputs).logits, logits, rtol=1e-9, atol=1e-9)
        assert torch.equal(merged.generate(**kwargs), cached)


@pytest.mark.parametrize("reentrant", [False, True])
def test_lora_under_gradient_checkpointing_gets_the_gradients_it_gets_without(reentrant, make_generator):
    """PEFT's setup for checkpointing (frozen base, enable_input_require_grads): the recomputed encoder
    and decoder steps run the adapted weights again, so every LoRA factor gets its gradient of the plain
    run."""
    inputs = batch(make_generator())
    grads, calls = [], []
    for checkpointing in (False, True):
        lora = adapted().train()
        if checkpointing:
            lora.base_model.model.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": reentrant})
            lora.enable_input_require_grads()
            for unit in lora.modules():
                if isinstance(unit, GradientCheckpointingLayer):
                    unit._gradient_checkpointing_func = counting_checkpoint(unit._gradient_checkpointing_func,
                                                                            calls)
        lora(**inputs).loss.backward()
        grads.append({name: p.grad for name, p in lora.named_parameters() if p.requires_grad})
    assert len(calls) == 2 * (1 + inputs["labels"].shape[1])       # the encoder, each target token
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == 2 * (len(RECURRENT) + 2)
    for name, grad in grads[0].items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-10, atol=1e-13, msg=name)
