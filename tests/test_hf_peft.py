"""LoRA through PEFT on both native causal LMs: momentum_transformer through its nn.Linear layers
(`target_modules="all-linear"`), momentum_lstm through its recurrent weights, which are
nn.Parameters of one stack module (`target_parameters`, PEFT's ParamWrapper). Only the LoRA
factors train; training changes the outputs and lowers the loss on a fixed batch; the saved
adapter reloads onto a fresh base exactly; merge_and_unload computes what the adapted model
computes; generation through the recurrent cache runs the adapted weights at every step. The AWD
stack (a last layer of its own width, weight drop) takes LoRA on the layers below its last one or
on its last one, where in training each weight-drop mask falls on the adapted matrix."""
import pytest
import torch
from torch import nn

import hf_momentum  # noqa: F401  (registers the model types)

peft = pytest.importorskip("peft")
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

VOCAB, HIDDEN, LAYERS, RANK = 40, 16, 2, 4
LSTM_WEIGHTS = [f"lstm.{name}_l{k}" for k in range(LAYERS) for name in ("weight_ih", "weight_hh")]
AWD_WEIGHTS = {"awd": LSTM_WEIGHTS,  # the two layers below the last (the AWD stack has three)
               "awd-top": ["lstm.top.weight_ih_l0", "lstm.top.weight_hh_l0"]}
FAMILIES = ["momentum_transformer", "momentum_lstm:momentum", "momentum_lstm:lstm", "momentum_lstm:adam",
            "momentum_lstm:awd", "momentum_lstm:awd-top"]


def base_model(family, seed=0):
    torch.manual_seed(seed)
    model_type, _, cell = family.partition(":")
    if model_type == "momentum_transformer":
        config = AutoConfig.for_model(model_type, vocab_size=VOCAB, hidden_size=HIDDEN,
                                      num_hidden_layers=LAYERS, num_attention_heads=4,
                                      max_position_embeddings=64, hidden_dropout=0.0, connection="momentum")
    elif cell in AWD_WEIGHTS:
        config = AutoConfig.for_model(model_type, vocab_size=VOCAB, hidden_size=HIDDEN,
                                      num_hidden_layers=LAYERS + 1, cell="momentum", dropout=0.0,
                                      embedding_dropout=0.0, embedding_size=12, last_hidden_size=12,
                                      weight_drop=0.3)
    else:
        config = AutoConfig.for_model(model_type, vocab_size=VOCAB, hidden_size=HIDDEN,
                                      num_hidden_layers=LAYERS, cell=cell, dropout=0.0, embedding_dropout=0.0)
    return AutoModelForCausalLM.from_config(config).eval()


def lora_config(family):
    if family == "momentum_transformer":
        return LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules="all-linear", task_type="CAUSAL_LM")
    return LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=[], target_parameters=lstm_weights(family),
                      task_type="CAUSAL_LM")


def lstm_weights(family):
    return AWD_WEIGHTS.get(family.partition(":")[2], LSTM_WEIGHTS)


def expected_lora_sizes(model, family):
    """(in, out) of every adapted weight, read from the base model: every nn.Linear but the
    output head for the transformer, the four recurrent weight matrices for the LSTM."""
    if family == "momentum_transformer":
        return [(m.in_features, m.out_features) for name, m in model.named_modules()
                if isinstance(m, nn.Linear) and name != "lm_head"]
    return [tuple(reversed(model.model.lstm.get_parameter(name.split(".", 1)[1]).shape))
            for name in lstm_weights(family)]


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module", params=FAMILIES)
def trained(request, tmp_path_factory):
    """A base model saved before LoRA, its PEFT model trained 20 steps on a fixed batch, and the
    record of that training."""
    family = request.param
    folder = tmp_path_factory.mktemp(family.replace(":", "_"))
    base = base_model(family)
    base.save_pretrained(folder / "base")
    sizes = expected_lora_sizes(base, family)
    ids = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    before = logits(base, ids)
    frozen = {name: p.detach().clone() for name, p in base.named_parameters()}
    model = get_peft_model(base, lora_config(family))
    at_start = logits(model, ids)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    model.train()
    for _ in range(20):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.eval()
    return dict(family=family, folder=folder, model=model, ids=ids, sizes=sizes, before=before,
                at_start=at_start, frozen=frozen, losses=losses)


def test_only_lora_factors_train_and_lower_the_loss(trained):
    model, sizes = trained["model"], trained["sizes"]
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    assert sum(p.numel() for p in trainable.values()) == sum(RANK * (i + o) for i, o in sizes)
    assert len(trainable) == 2 * len(sizes)
    assert torch.equal(trained["at_start"], trained["before"])     # lora_B starts at zero
    base = {name.replace("base_model.model.", "").replace(".base_layer", ""): p
            for name, p in model.named_parameters() if "lora_" not in name}
    assert all(torch.equal(base[name], value) for name, value in trained["frozen"].items())
    losses = trained["losses"]
    # the AWD stack adapts one or two of its three layers, under weight drop: the loss falls more slowly
    assert losses[-1] < losses[0] - (0.005 if ":awd" in trained["family"] else 0.02), losses
    assert (logits(model, trained["ids"]) - trained["before"]).abs().max() > 1e-2


def test_saved_adapter_reloads_onto_a_fresh_base_exactly(trained, tmp_path):
    model, ids = trained["model"], trained["ids"]
    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    fresh = AutoModelForCausalLM.from_pretrained(trained["folder"] / "base")
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    for p in model.parameters():      # as the reloaded model's: PEFT forms LoRA weights of trainable
        p.requires_grad_(False)        # factors in another order (a 1-ulp difference in the LSTM)
    with torch.no_grad():
        got, want = reloaded(input_ids=ids), model(input_ids=ids)
    for name in ("logits", "start_logits", "end_logits"):
        if name in want:
            assert torch.equal(got[name], want[name]), name
    assert not any(p.requires_grad for p in reloaded.parameters())


def test_disabling_the_adapter_gives_the_base_outputs(trained):
    with trained["model"].disable_adapter():
        assert torch.equal(logits(trained["model"], trained["ids"]), trained["before"])


def merged_copy(trained):
    """merge_and_unload of a reloaded copy (the module-scoped model stays adapted); the copy's
    base is evaluated first, so a weight cache kept from it would show in the merged outputs."""
    fresh = AutoModelForCausalLM.from_pretrained(trained["folder"] / "base").eval()
    logits(fresh, trained["ids"])
    folder = trained["folder"] / "adapter_for_merge"
    trained["model"].save_pretrained(folder)
    return PeftModel.from_pretrained(fresh, folder).merge_and_unload().eval()


def test_merge_and_unload_matches_the_adapted_model(trained):
    merged = merged_copy(trained)
    assert type(merged).__name__.endswith("ForCausalLM")
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    torch.testing.assert_close(logits(merged, trained["ids"]), logits(trained["model"], trained["ids"]),
                               rtol=1e-5, atol=1e-5)


def test_generation_through_the_recurrent_cache_runs_the_adapted_weights(trained):
    """Each token decoded with the cache (one recurrent step per token) scores as the whole
    sequence scores without a cache, and greedy decoding equals the merged model's."""
    model, prompt = trained["model"], trained["ids"][:, :5]
    out = model.generate(input_ids=prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                         use_cache=True, output_scores=True, return_dict_in_generate=True)
    assert out.past_key_values is not None and out.past_key_values.get_seq_length() == 12
    whole = logits(model, out.sequences)
    torch.testing.assert_close(torch.stack(out.scores, 1), whole[:, 4:-1], rtol=1e-4, atol=1e-4)
    merged = merged_copy(trained).generate(input_ids=prompt, max_new_tokens=8, min_new_tokens=8,
                                           do_sample=False)
    assert torch.equal(out.sequences, merged)


@pytest.mark.parametrize("family", ["momentum_lstm:awd", "momentum_lstm:awd-top"])
def test_weight_drop_falls_on_the_adapted_matrices(family):
    """In training, the adapted AWD stack computes from a seed what the merged one computes from it:
    each recurrent matrix is W + BA with its mask on the whole (the last layer's mask is drawn before
    any layer runs, outside the forward in which PEFT's wrapper puts W + BA in place). lora_B is
    non-zero, so a mask on W alone, with BA added after it, changes the output."""
    model = get_peft_model(base_model(family), lora_config(family))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    model.train()
    torch.manual_seed(5)
    adapted = model(input_ids=ids).logits
    merged = model.merge_and_unload().train()
    torch.manual_seed(5)
    want = merged(input_ids=ids).logits
    torch.testing.assert_close(adapted, want, rtol=1e-5, atol=1e-6)
    torch.manual_seed(6)
    assert (merged(input_ids=ids).logits - want).abs().max() > 1e-3      # the masks change the output


def test_lstm_biases_are_not_lora_targets():
    """PEFT's ParamWrapper adapts 2-D and 3-D parameters only: a bias vector is refused."""
    model = base_model("momentum_lstm:momentum")
    config = LoraConfig(r=RANK, target_modules=[], target_parameters=["lstm.bias_hh_l0"])
    with pytest.raises(ValueError, match="1 dimensional Parameter"):
        get_peft_model(model, config)


HEADS = {"SEQ_CLS": ("AutoModelForSequenceClassification", "score"),
         "TOKEN_CLS": ("AutoModelForTokenClassification", "score"),
         "QUESTION_ANS": ("AutoModelForQuestionAnswering", "qa_outputs")}


def head_targets(task_type):
    """The loss inputs of each task, drawn at random for a batch (4, 9)."""
    generator = torch.Generator().manual_seed(2)
    return {"SEQ_CLS": dict(labels=torch.randint(0, 3, (4,), generator=generator)),
            "TOKEN_CLS": dict(labels=torch.randint(0, 3, (4, 9), generator=generator)),
            "QUESTION_ANS": dict(start_positions=torch.randint(0, 9, (4,), generator=generator),
                                 end_positions=torch.randint(0, 9, (4,), generator=generator))}[task_type]


@pytest.mark.parametrize("task_type", HEADS)
@pytest.mark.parametrize("family", ["momentum_transformer", "momentum_lstm:adam"])
def test_task_heads_train_whole_beside_the_adapter(family, task_type, tmp_path):
    """PEFT's classification and question-answering tasks find the heads by their conventional
    names (`score`, `qa_outputs`) and train them whole (modules_to_save) beside the LoRA factors;
    the saved adapter carries the trained head, and onto a fresh base reproduces the adapted
    outputs exactly. (PEFT leaves a head out of "all-linear" for SEQ_CLS only, so the other tasks
    name the transformer's linear layers.)"""
    import transformers
    auto_name, head_name = HEADS[task_type]
    auto = getattr(transformers, auto_name)
    torch.manual_seed(0)
    config = base_model(family).config
    config.num_labels = 3
    base = auto.from_config(config)
    base.save_pretrained(tmp_path / "base")
    head = getattr(base, head_name).weight.detach().clone()
    if family == "momentum_transformer":
        targets = "all-linear" if task_type == "SEQ_CLS" else ["q_proj", "k_proj", "v_proj", "o_proj"]
        lora = LoraConfig(r=RANK, target_modules=targets, task_type=task_type)
    else:
        lora = LoraConfig(r=RANK, target_modules=[], target_parameters=LSTM_WEIGHTS, task_type=task_type)
    model = get_peft_model(base, lora)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert {name for name in trainable if "lora_" not in name} == {
        f"base_model.model.{head_name}.modules_to_save.default.weight",
        f"base_model.model.{head_name}.modules_to_save.default.bias"}
    assert any(".lora_A." in name for name in trainable)
    ids = torch.randint(3, VOCAB, (4, 9), generator=torch.Generator().manual_seed(1))
    targets = head_targets(task_type)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    model.train()
    for _ in range(10):
        loss = model(input_ids=ids, **targets).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses
    model.eval()
    assert not torch.equal(getattr(model.base_model.model, head_name).modules_to_save["default"].weight, head)
    model.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(auto.from_pretrained(tmp_path / "base"), tmp_path / "adapter").eval()
    for p in model.parameters():      # frozen as the reloaded model is: PEFT's wrapped head gives
        p.requires_grad_(False)        # logits 1 ulp apart when trainable (seen with the LSTM)
    with torch.no_grad():
        got, want = reloaded(input_ids=ids), model(input_ids=ids)
    for name in ("logits", "start_logits", "end_logits"):
        if name in want:
            assert torch.equal(got[name], want[name]), name
