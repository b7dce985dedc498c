"""transformers' common model tests (tests/test_modeling_common.py, ModelTesterMixin) replicated
for every native model class — that test suite is not installed with transformers:
`test_hidden_states_output` (hidden states asked for by argument and by the config),
`test_retain_grad_hidden_states_attentions` (hidden_states[0] is in the graph of the first
output), plus what linear attention and the LSTM do with `output_attentions` (one warning, no
matrices) and gradient checkpointing of both causal LMs."""
import os
import warnings
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import AutoConfig

import hf_momentum  # noqa: F401  (registers the model types)
from hf_momentum import (
    MomentumLSTMForCausalLM,
    MomentumLSTMModel,
    MomentumTransformerForCausalLM,
    MomentumTransformerForSequenceClassification,
    MomentumTransformerModel,
)


@dataclass
class ModelTester:
    """What transformers' per-model testers provide to ModelTesterMixin."""
    model_type: str
    config_kwargs: dict
    batch_size: int = 3
    seq_length: int = 7
    vocab_size: int = 60
    hidden_size: int = 16
    num_hidden_layers: int = 3
    expected_num_hidden_layers: int = None

    def __post_init__(self):
        if self.expected_num_hidden_layers is None:
            self.expected_num_hidden_layers = self.num_hidden_layers + 1

    def prepare_config_and_inputs_for_common(self):
        config = AutoConfig.for_model(self.model_type, vocab_size=self.vocab_size,
                                      hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
                                      # not 0: the padding row of a tied embedding is zero, and so
                                      # would be logit 0, the output whose gradient is checked
                                      pad_token_id=self.vocab_size - 1,
                                      **self.config_kwargs)
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, self.vocab_size - 1, (self.batch_size, self.seq_length), generator=generator)
        mask = torch.ones_like(ids)
        mask[-1, :2] = 0
        return config, {"input_ids": ids, "attention_mask": mask}


TRANSFORMER = ModelTester("momentum_transformer",
                          dict(num_attention_heads=2, intermediate_size=32, connection="momentum"))
# plugins.rnn.MomentumLSTM runs its layers as one fused stack: the LSTM models return the
# embeddings and the stack's output (a tester sets expected_num_hidden_layers for such models).
LSTM = ModelTester("momentum_lstm", dict(cell="adam"), expected_num_hidden_layers=2)
CASES = [
    (TRANSFORMER, [MomentumTransformerModel, MomentumTransformerForCausalLM,
                   MomentumTransformerForSequenceClassification]),
    (LSTM, [MomentumLSTMModel, MomentumLSTMForCausalLM]),
]
IDS = ["transformer", "lstm"]


@pytest.mark.parametrize("tester, model_classes", CASES, ids=IDS)
def test_hidden_states_output(tester, model_classes):
    def check_hidden_states_output(inputs_dict, config, model_class):
        model = model_class(config).eval()
        with torch.no_grad():
            outputs = model(**inputs_dict)
        hidden_states = outputs.hidden_states
        assert isinstance(hidden_states, (list, tuple)), model_class.__name__
        assert len(hidden_states) == tester.expected_num_hidden_layers
        assert list(hidden_states[0].shape[-2:]) == [tester.seq_length, tester.hidden_size]
        assert list(hidden_states[-1].shape[-2:]) == [tester.seq_length, tester.hidden_size]
        if hasattr(outputs, "last_hidden_state"):
            torch.testing.assert_close(hidden_states[-1], outputs.last_hidden_state, rtol=0, atol=0)

    config, inputs_dict = tester.prepare_config_and_inputs_for_common()
    for model_class in model_classes:
        inputs_dict["output_hidden_states"] = True
        check_hidden_states_output(inputs_dict, config, model_class)
        # also through the config, as transformers' test does
        del inputs_dict["output_hidden_states"]
        config.output_hidden_states = True
        check_hidden_states_output(inputs_dict, config, model_class)
        # and the argument wins over the config, both ways
        with torch.no_grad():
            assert model_class(config).eval()(**inputs_dict, output_hidden_states=False).hidden_states is None
        config.output_hidden_states = False


@pytest.mark.parametrize("tester, model_classes", CASES, ids=IDS)
def test_retain_grad_hidden_states_attentions(tester, model_classes):
    """transformers' test with has_attentions = False (linear attention and LSTMs form no
    attention matrix): hidden_states[0] must get a gradient from the first output."""
    config, inputs_dict = tester.prepare_config_and_inputs_for_common()
    config.output_hidden_states = True
    for model_class in model_classes:
        model = model_class._from_config(config, attn_implementation="eager")
        outputs = model(**inputs_dict)
        output = outputs[0]
        assert outputs.hidden_states is not None, model_class.__name__
        hidden_states = outputs.hidden_states[0]
        hidden_states.retain_grad()
        output.flatten()[0].backward(retain_graph=True)
        assert hidden_states.grad is not None, model_class.__name__
        assert hidden_states.grad.abs().sum() > 0


@pytest.mark.parametrize("tester, model_classes", CASES, ids=IDS)
def test_output_attentions_warns_once_per_model(tester, model_classes):
    config, inputs_dict = tester.prepare_config_and_inputs_for_common()
    for model_class in model_classes:
        model = model_class(config).eval()
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            first = model(**inputs_dict, output_attentions=True)
            model(**inputs_dict, output_attentions=True)
            model(**inputs_dict)
        messages = [str(w.message) for w in caught if "output_attentions" in str(w.message)]
        assert len(messages) == 1, (model_class.__name__, messages)
        assert "no attention matrix" in messages[0]
        assert getattr(first, "attentions", None) is None
    config.output_attentions = True  # through the config (transformers switches it to eager attention)
    model = model_classes[0](config).eval()
    with pytest.warns(UserWarning, match="output_attentions=True is ignored"), torch.no_grad():
        model(**inputs_dict)


def counting(function, calls):
    def counted(*args, **kwargs):
        calls.append(1)
        return function(*args, **kwargs)
    return counted


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("model_class, tester", [(MomentumTransformerForCausalLM, TRANSFORMER),
                                                 (MomentumLSTMForCausalLM, LSTM)], ids=IDS)
def test_training_gradient_checkpointing(model_class, tester, use_reentrant):
    """Same loss and gradients with and without checkpointing, and the checkpoint function is
    really called (a model that ignored the switch would not call it)."""
    config, inputs_dict = tester.prepare_config_and_inputs_for_common()
    config.hidden_dropout = 0.0
    assert model_class.supports_gradient_checkpointing
    torch.manual_seed(0)
    model = model_class(config).train()
    ids = inputs_dict["input_ids"]
    results = []
    for checkpointing in (False, True):
        calls = []
        if checkpointing:
            model.activation_checkpointing_enable({"use_reentrant": use_reentrant})
            for module in model.modules():
                if getattr(module, "gradient_checkpointing", False):
                    module._gradient_checkpointing_func = counting(module._gradient_checkpointing_func, calls)
        model.zero_grad()
        loss = model(**inputs_dict, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                         if p.grad is not None}, len(calls)))
    (loss, grads, _), (loss_ckpt, grads_ckpt, calls) = results
    assert calls > 0
    torch.testing.assert_close(loss_ckpt, loss)
    assert grads.keys() == grads_ckpt.keys() and len(grads) >= 5
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], atol=1e-6, rtol=1e-5)
