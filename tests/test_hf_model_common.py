"""transformers' common model tests (tests/test_modeling_common.py: ModelTesterMixin, and
CausalLMModelTest's sequence classification tests) replicated for every native model class —
that test suite is not installed with transformers (and is ~280k characters of mostly
unrelated cases: vision, audio, encoder-decoder, attention matrices, hub, GPU). Replicated,
with the same assertions:
- `test_hidden_states_output` (num_hidden_layers + 1 hidden states, by argument and by config),
- `test_retain_grad_hidden_states_attentions` (hidden_states[0] is in the graph of the output),
- `test_gradient_checkpointing_backward_compatibility`, `test_gradient_checkpointing_enable_disable`
  (a GradientCheckpointingLayer exists; every module's flag follows enable / disable),
- `test_training`, `test_training_gradient_checkpointing` and its `use_reentrant_false` /
  `use_reentrant_true` scenarios (the checkpointed layers really recompute; the same loss and
  gradients, hence the same set of non-zero gradients, as without checkpointing),
- `test_enable_input_require_grads_with_gradient_checkpointing` (frozen embeddings, as with PEFT),
- `test_sequence_classification_model{,_for_single_label,_for_multi_label}` and regression;
- every test on the token classifiers and question-answering heads too (transformers'
  GenericForTokenClassification and GenericForQuestionAnswering), and on a bidirectional encoder
  (eq. 14) with every head, the masked LM included;
- `test_resize_tokens_embeddings`, `test_resize_embeddings_untied` (plus: the kept tokens' outputs
  unchanged, and through save / reload);
plus what linear attention and the LSTM do with `output_attentions` (one warning, no matrices),
gradient checkpointing through `transformers.Trainer`, and the text-classification and
feature-extraction pipelines on padded batches."""
import copy
import math
import os
import warnings
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from torch.utils.data import Dataset
from transformers import AutoConfig, Trainer, TrainerCallback, TrainingArguments
from transformers.modeling_layers import GradientCheckpointingLayer

import hf_momentum  # noqa: F401  (registers the model types)
from hf_momentum import (
    MomentumLSTMForCausalLM,
    MomentumLSTMForQuestionAnswering,
    MomentumLSTMForSequenceClassification,
    MomentumLSTMForTokenClassification,
    MomentumLSTMModel,
    MomentumTransformerForCausalLM,
    MomentumTransformerForMaskedLM,
    MomentumTransformerForQuestionAnswering,
    MomentumTransformerForSequenceClassification,
    MomentumTransformerForTokenClassification,
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
    num_labels: int = 3

    @property
    def expected_num_hidden_layers(self):
        return self.num_hidden_layers + 1

    def prepare_config_and_inputs_for_common(self):
        config = AutoConfig.for_model(self.model_type, vocab_size=self.vocab_size,
                                      hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
                                      # not 0: the padding row of a tied embedding is zero, and so
                                      # would be logit 0, the output whose gradient is checked
                                      pad_token_id=self.vocab_size - 1, num_labels=self.num_labels,
                                      **self.config_kwargs)
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, self.vocab_size - 1, (self.batch_size, self.seq_length), generator=generator)
        mask = torch.ones_like(ids)
        mask[-1, :2] = 0
        return config, {"input_ids": ids, "attention_mask": mask}


TRANSFORMER = ModelTester("momentum_transformer",
                          dict(num_attention_heads=2, intermediate_size=32, connection="momentum"))
LSTM = ModelTester("momentum_lstm", dict(cell="adam"))
AWD_LSTM = ModelTester("momentum_lstm",        # AWD-LSTM's stack: the last layer of the embedding's width
                       dict(cell="nag", embedding_size=8, last_hidden_size=8, lm_head_bias=True))
HYBRID = ModelTester("momentum_transformer",      # softmax layers among momentum layers (issue 29)
                     dict(num_attention_heads=2, intermediate_size=32, connection="momentum",
                          layer_types=["linear_attention", "full_attention", "sliding_attention"],
                          sliding_window=3))
ENCODER = ModelTester("momentum_transformer",     # bidirectional (eq. 14), a softmax layer among them
                      dict(num_attention_heads=2, intermediate_size=32, connection="adaptive",
                           is_causal=False,
                           layer_types=["linear_attention", "full_attention", "linear_attention"]))
TRANSFORMER_CLASSES = [MomentumTransformerModel, MomentumTransformerForCausalLM,
                       MomentumTransformerForSequenceClassification,
                       MomentumTransformerForTokenClassification, MomentumTransformerForQuestionAnswering]
CASES = [
    (TRANSFORMER, TRANSFORMER_CLASSES),
    (LSTM, [MomentumLSTMModel, MomentumLSTMForCausalLM, MomentumLSTMForSequenceClassification,
            MomentumLSTMForTokenClassification, MomentumLSTMForQuestionAnswering]),
    (AWD_LSTM, [MomentumLSTMModel, MomentumLSTMForCausalLM, MomentumLSTMForSequenceClassification,
                MomentumLSTMForTokenClassification, MomentumLSTMForQuestionAnswering]),
    (HYBRID, TRANSFORMER_CLASSES),
    (ENCODER, [MomentumTransformerModel, MomentumTransformerForMaskedLM,
               MomentumTransformerForSequenceClassification, MomentumTransformerForTokenClassification,
               MomentumTransformerForQuestionAnswering]),
]
IDS = ["transformer", "lstm", "awd_lstm", "hybrid", "encoder"]
HEADS = [(model_class, tester) for tester, classes in CASES for model_class in classes[1:]]
SUFFIXES = {id(HYBRID): "-hybrid", id(ENCODER): "-encoder", id(AWD_LSTM): "-awd"}
HEAD_IDS = [model_class.__name__ + SUFFIXES.get(id(tester), "") for model_class, tester in HEADS]


def head_of(model_classes, kind: str):
    """The class among `model_classes` whose name ends with `kind` ("ForSequenceClassification")."""
    return next(model_class for model_class in model_classes if model_class.__name__.endswith(kind))


def prepare_for_class(tester, inputs_dict, model_class, return_labels=False):
    """transformers' `_prepare_for_class`: zero labels of the head's shape (start and end
    positions for question answering)."""
    inputs_dict = copy.deepcopy(inputs_dict)
    if return_labels and model_class.__name__.endswith("ForQuestionAnswering"):
        inputs_dict["start_positions"] = torch.zeros(tester.batch_size, dtype=torch.long)
        inputs_dict["end_positions"] = torch.zeros(tester.batch_size, dtype=torch.long)
    elif return_labels:
        shape = (tester.batch_size,) if model_class.__name__.endswith("ForSequenceClassification") \
            else (tester.batch_size, tester.seq_length)
        inputs_dict["labels"] = torch.zeros(shape, dtype=torch.long)
    return inputs_dict


@pytest.mark.parametrize("tester, model_classes", CASES, ids=IDS)
def test_hidden_states_output(tester, model_classes):
    def check_hidden_states_output(inputs_dict, config, model_class):
        model = model_class(config).eval()
        with torch.no_grad():
            outputs = model(**inputs_dict)
        hidden_states = outputs.hidden_states
        assert isinstance(hidden_states, (list, tuple)), model_class.__name__
        assert len(hidden_states) == tester.expected_num_hidden_layers
        # the embeddings' and the last layer's widths (an AWD-LSTM's differ from hidden_size)
        first, last = (getattr(config, name, tester.hidden_size)
                       for name in ("embedding_size", "last_hidden_size"))
        assert list(hidden_states[0].shape[-2:]) == [tester.seq_length, first]
        assert list(hidden_states[-1].shape[-2:]) == [tester.seq_length, last]
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


@pytest.mark.parametrize("layer_types, says", [
    (["linear_attention"] * 2, ["linear (momentum) attention has none"]),
    (["full_attention"] * 2, ["scaled_dot_product_attention"]),
    (["linear_attention", "full_attention"],
     ["linear (momentum) attention has none", "scaled_dot_product_attention"]),
])
def test_output_attentions_warning_names_each_kind_of_layer(layer_types, says):
    """The warning says why for the layers the model has: a hybrid's softmax layers run SDPA, which
    returns no weights, rather than being called linear attention."""
    config = AutoConfig.for_model("momentum_transformer", vocab_size=20, hidden_size=8, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=16, layer_types=layer_types)
    model = MomentumTransformerForCausalLM(config).eval()
    with pytest.warns(UserWarning, match="output_attentions=True is ignored") as caught, torch.no_grad():
        model(torch.tensor([[3, 4, 5]]), output_attentions=True)
    message = " ".join(str(w.message) for w in caught)
    assert all(part in message for part in says), message
    assert ("linear (momentum)" in message) == ("linear_attention" in layer_types), message


def counting_checkpoint(checkpoint, calls):
    """A checkpoint function that counts the calls of what it checkpoints (forward, recompute)."""
    def counted_checkpoint(function, *args, **kwargs):
        def counted(*inner, **inner_kwargs):
            calls.append(1)
            return function(*inner, **inner_kwargs)
        return checkpoint(counted, *args, **kwargs)
    return counted_checkpoint


@pytest.mark.parametrize("tester, model_classes", CASES, ids=IDS)
def test_gradient_checkpointing_backward_compatibility(tester, model_classes):
    config, _ = tester.prepare_config_and_inputs_for_common()
    for model_class in model_classes:
        assert model_class.supports_gradient_checkpointing, model_class.__name__
        config.gradient_checkpointing = True
        assert model_class(copy.deepcopy(config)).is_activation_checkpointing, model_class.__name__


@pytest.mark.parametrize("tester, model_classes", CASES, ids=IDS)
def test_gradient_checkpointing_enable_disable(tester, model_classes):
    config, _ = tester.prepare_config_and_inputs_for_common()
    for model_class in model_classes:
        model = model_class(copy.deepcopy(config))
        assert not model.is_activation_checkpointing
        assert [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)], model_class.__name__
        with pytest.warns(FutureWarning, match="deprecated"):
            model.gradient_checkpointing_enable()
        assert model.is_activation_checkpointing
        for name, module in model.named_modules():
            if hasattr(module, "gradient_checkpointing"):
                assert module.gradient_checkpointing, f"{model_class.__name__}.{name}"
        with pytest.warns(FutureWarning, match="deprecated"):
            model.gradient_checkpointing_disable()
        assert not model.is_activation_checkpointing
        for name, module in model.named_modules():
            if hasattr(module, "gradient_checkpointing"):
                assert not module.gradient_checkpointing, f"{model_class.__name__}.{name}"


@pytest.mark.parametrize("model_class, tester", HEADS, ids=HEAD_IDS)
def test_training(model_class, tester):
    config, inputs_dict = tester.prepare_config_and_inputs_for_common()
    model = model_class(config).train()
    loss = model(**prepare_for_class(tester, inputs_dict, model_class, return_labels=True)).loss
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("kwargs", [None, {"use_reentrant": False}, {"use_reentrant": True}],
                         ids=["default", "use_reentrant_false", "use_reentrant_true"])
@pytest.mark.parametrize("model_class, tester", HEADS, ids=HEAD_IDS)
def test_training_gradient_checkpointing(model_class, tester, kwargs):
    """transformers' check_training_gradient_checkpointing, and beyond it the same loss and
    gradients as without checkpointing; every GradientCheckpointingLayer's forward runs twice
    (forward, recompute), so a model that ignored the switch would fail."""
    config, inputs_dict = tester.prepare_config_and_inputs_for_common()
    config.use_cache = False
    inputs = prepare_for_class(tester, inputs_dict, model_class, return_labels=True)
    torch.manual_seed(42)
    model = model_class(config).train()
    results = []
    for checkpointing in (False, True):
        calls = []
        if checkpointing:
            model.activation_checkpointing_enable(kwargs)
            layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
            for layer in layers:
                layer._gradient_checkpointing_func = counting_checkpoint(layer._gradient_checkpointing_func,
                                                                         calls)
        model.zero_grad()
        torch.manual_seed(42)
        loss = model(**inputs).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                         if p.grad is not None}))
    assert len(calls) == 2 * len(layers) > 0
    (loss, grads), (loss_ckpt, grads_ckpt) = results
    torch.testing.assert_close(loss_ckpt, loss)
    assert grads.keys() == grads_ckpt.keys() and len(grads) >= 5
    assert {n for n, g in grads.items() if g.abs().sum() > 0} == {n for n, g in grads_ckpt.items()
                                                                if g.abs().sum() > 0}
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("model_class, tester", HEADS, ids=HEAD_IDS)
def test_enable_input_require_grads_with_gradient_checkpointing(model_class, tester):
    """transformers' test of the same name, in the case it exists for (PEFT: frozen embeddings,
    reentrant checkpointing, which only back-propagates into inputs that require grad): the
    trainable parameters get the gradients they get without checkpointing."""
    config, inputs_dict = tester.prepare_config_and_inputs_for_common()
    config.use_cache = False
    inputs = prepare_for_class(tester, inputs_dict, model_class, return_labels=True)
    torch.manual_seed(0)
    model = model_class(config).train()
    model.get_input_embeddings().weight.requires_grad_(False)
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            model.activation_checkpointing_enable({"use_reentrant": True})
        model.zero_grad()
        torch.manual_seed(42)  # the same dropout masks
        model(**inputs).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert all(g is not None for g in grads[1].values()), [n for n, g in grads[1].items() if g is None]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5, msg=name)


def logits_of(model, inputs_dict):
    with torch.no_grad():
        return model(**inputs_dict)[0]


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("tester, model_classes", CASES, ids=IDS)
def test_resize_tokens_embeddings(tester, model_classes, tied, tmp_path):
    """ModelTesterMixin.test_resize_tokens_embeddings and test_resize_embeddings_untied: the
    vocabulary grows (new rows at the old rows' mean) and shrinks in the config and in every
    embedding, the kept rows stay, a tied head stays tied and an untied one is resized too. Beyond
    transformers' test: the outputs on the kept tokens do not move, and the resized model saves and
    reloads them."""
    config, inputs_dict = tester.prepare_config_and_inputs_for_common()
    config.tie_word_embeddings = tied
    config.pad_token_id = 0          # kept when the vocabulary shrinks below the tester's pad id
    vocab = tester.vocab_size
    for model_class in model_classes:
        model = model_class(copy.deepcopy(config)).eval()
        kind = type(model.get_input_embeddings())
        kept = model.get_input_embeddings().weight.detach().clone()
        before = logits_of(model, inputs_dict)
        head = model.get_output_embeddings()
        grown = model.resize_token_embeddings(vocab + 10)
        assert model.config.vocab_size == vocab + 10 and type(grown) is kind, model_class.__name__
        assert grown.weight.shape[0] == vocab + 10
        torch.testing.assert_close(grown.weight[vocab:].mean(0), grown.weight[:vocab].mean(0),
                                   rtol=1e-3, atol=1e-3)
        after = logits_of(model, inputs_dict)
        if head is None:
            torch.testing.assert_close(after, before, rtol=0, atol=0)
        else:
            assert model.get_output_embeddings().weight.shape[0] == vocab + 10
            assert (model.get_output_embeddings().weight is grown.weight) == tied, model_class.__name__
            torch.testing.assert_close(after[..., :vocab], before, rtol=0, atol=0)
            assert after.shape[-1] == vocab + 10
        model.save_pretrained(tmp_path / model_class.__name__)
        reloaded = model_class.from_pretrained(tmp_path / model_class.__name__).eval()
        assert reloaded.config.vocab_size == vocab + 10
        torch.testing.assert_close(logits_of(reloaded, inputs_dict), after, rtol=0, atol=0)

        shrunk = model.resize_token_embeddings(vocab - 15)
        assert model.config.vocab_size == vocab - 15 and shrunk.weight.shape[0] == vocab - 15
        torch.testing.assert_close(shrunk.weight, kept[:vocab - 15], rtol=0, atol=0)
        if head is not None:
            assert model.get_output_embeddings().weight.shape[0] == vocab - 15
        fewer = dict(inputs_dict, input_ids=inputs_dict["input_ids"].clamp(max=vocab - 16))
        assert logits_of(model, fewer).shape[-1] == (vocab - 15 if head is not None else before.shape[-1])
        padded = model.resize_token_embeddings(vocab + 13, pad_to_multiple_of=64)
        assert padded.weight.shape[0] == 128 and model.config.vocab_size == 128


@pytest.mark.parametrize("problem_type", [None, "single_label_classification", "multi_label_classification",
                                          "regression"])
@pytest.mark.parametrize("tester, model_classes", CASES, ids=IDS)
def test_sequence_classification_model(tester, model_classes, problem_type):
    """CausalLMModelTest.test_sequence_classification_model{,_for_single_label,_for_multi_label}
    (mask from `input_ids != 1`), and regression with one label."""
    config, inputs_dict = tester.prepare_config_and_inputs_for_common()
    ids = inputs_dict["input_ids"]
    generator = torch.Generator().manual_seed(1)
    labels = torch.randint(0, tester.num_labels, (tester.batch_size,), generator=generator)
    if problem_type == "multi_label_classification":
        labels = torch.rand(tester.batch_size, tester.num_labels, generator=generator).round()
    elif problem_type == "regression":
        config.num_labels = 1
        labels = torch.rand(tester.batch_size, generator=generator)
    config.problem_type = problem_type
    model = head_of(model_classes, "ForSequenceClassification")(config).eval()
    result = model(input_ids=ids, attention_mask=ids.ne(1), labels=labels)
    assert result.logits.shape == (tester.batch_size, config.num_labels)
    assert result.loss.dim() == 0 and torch.isfinite(result.loss)


class TokenDataset(Dataset):
    """A few rows of token ids with the labels each head wants."""

    def __init__(self, tester, model_class, rows=8):
        generator = torch.Generator().manual_seed(3)
        self.ids = torch.randint(0, tester.vocab_size - 1, (rows, tester.seq_length), generator=generator)
        self.spans = model_class.__name__.endswith("ForQuestionAnswering")
        if self.spans:
            self.labels = (self.ids[:, :2] % tester.seq_length).sort(-1).values   # start <= end
        elif model_class.__name__.endswith("ForSequenceClassification"):
            self.labels = self.ids[:, 0] % tester.num_labels
        elif model_class.__name__.endswith("ForTokenClassification"):
            self.labels = self.ids % tester.num_labels
        else:
            self.labels = self.ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        row = {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i])}
        if self.spans:
            return {**row, "start_positions": self.labels[i, 0], "end_positions": self.labels[i, 1]}
        return {**row, "labels": self.labels[i]}


class GradientRecorder(TrainerCallback):
    """Keeps every step's gradients, as the optimizer is about to use them."""

    def __init__(self):
        self.steps = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append({n: p.grad.detach().clone() for n, p in model.named_parameters()
                           if p.grad is not None})


def train_steps(model_class, tester, checkpointing, output_dir):
    """Three SGD steps of transformers.Trainer from one seed; the gradients of every step and the losses."""
    config, _ = tester.prepare_config_and_inputs_for_common()
    torch.manual_seed(0)
    model = model_class(config)
    recorder = GradientRecorder()
    args = TrainingArguments(output_dir=str(output_dir), max_steps=3, per_device_train_batch_size=4,
                             learning_rate=0.1, optim="sgd", lr_scheduler_type="constant", logging_steps=1,
                             activation_checkpointing=checkpointing, report_to=[], save_strategy="no",
                             use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=TokenDataset(tester, model_class),
                      callbacks=[recorder])
    trainer.train()
    assert model.is_activation_checkpointing == checkpointing
    return recorder.steps, [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


# The Trainer's switch once per backbone (its first head; two Trainers take about 2.3 s on the CI
# machine): every head's checkpointed step is compared with its plain one, without a Trainer, in
# test_training_gradient_checkpointing.
TRAINER_HEADS = [(model_class, tester) for tester, classes in CASES for model_class in classes[1:2]]


@pytest.mark.parametrize("model_class, tester", TRAINER_HEADS,
                         ids=[HEAD_IDS[HEADS.index(head)] for head in TRAINER_HEADS])
def test_trainer_with_gradient_checkpointing(model_class, tester, tmp_path):
    """TrainingArguments(activation_checkpointing=True) (formerly gradient_checkpointing): finite
    losses, and every step's gradients equal to those of the same run without checkpointing."""
    plain, plain_losses = train_steps(model_class, tester, False, tmp_path / "plain")
    checkpointed, losses = train_steps(model_class, tester, True, tmp_path / "checkpointed")
    assert len(losses) == 3 and all(map(math.isfinite, losses))
    assert len(checkpointed) == len(plain) == 3
    for step, (expected, got) in enumerate(zip(plain, checkpointed)):
        assert expected.keys() == got.keys(), step
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-5,
                                       msg=f"step {step} {name}")
    assert losses == pytest.approx(plain_losses, rel=1e-5)


def word_tokenizer(tester):
    """A word-level tokenizer over the tester's vocabulary ("w0" ... ; pad is its last id)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {f"w{i}": i for i in range(tester.vocab_size - 2)}
    vocab.update({"[UNK]": tester.vocab_size - 2, "[PAD]": tester.vocab_size - 1})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]")


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("tester, model_classes", CASES, ids=IDS)
def test_pipelines_give_each_text_of_a_padded_batch_its_result_alone(tester, model_classes, side):
    """transformers' text-classification and feature-extraction pipelines (PipelineTesterMixin's
    tasks for these heads) on a word-level tokenizer: texts of different lengths batched, padded
    on either side, each get the scores and features they get alone."""
    from transformers import pipeline
    config, _ = tester.prepare_config_and_inputs_for_common()
    tokenizer = word_tokenizer(tester)
    tokenizer.padding_side = side
    texts = ["w3 w5 w7", "w1 w2 w3 w4 w9 w10 w11 w12"]
    torch.manual_seed(0)
    classifier = head_of(model_classes, "ForSequenceClassification")
    classify = pipeline("text-classification", model=classifier(config).eval(), tokenizer=tokenizer,
                        top_k=None)
    features = pipeline("feature-extraction", model=model_classes[0](config).eval(), tokenizer=tokenizer,
                        return_tensors=True)
    by_label = lambda result: {entry["label"]: entry["score"] for entry in result}
    batched, alone = classify(texts, batch_size=2), [classify([text])[0] for text in texts]
    for together, single in zip(batched, alone):
        assert by_label(together).keys() == by_label(single).keys()
        for label, score in by_label(single).items():
            assert math.isclose(by_label(together)[label], score, rel_tol=1e-5, abs_tol=1e-6)
    for text, together in zip(texts, features(texts, batch_size=2)):
        single = features(text)
        real = together[0][:single.shape[1]] if side == "right" else together[0][-single.shape[1]:]
        torch.testing.assert_close(real, single[0], atol=1e-5, rtol=1e-4)
