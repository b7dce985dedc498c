"""hf_momentum.trainer.NTASGDTrainer: transformers' Trainer with AWD-LSTM's NT-ASGD, on the MomentumLSTM
causal LM. It switches at the evaluation that the rule names (from the logged losses); every later
evaluation scores the mean of the iterates since the switch (recomputed from the iterates a callback
records); the final model and each checkpoint hold that mean; resuming from a checkpoint after the
switch ends with the uninterrupted run's model and iterate; misuse is refused."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from torch.utils.data import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, TrainerCallback, TrainingArguments

import hf_momentum  # noqa: F401  (registers the model types)
from hf_momentum.trainer import NTASGDTrainer

VOCAB, LENGTH, EPOCHS, NONMONO = 12, 10, 7, 1


class Sequences(Dataset):
    """Rows of one repeating pattern: training fits `pattern`, so the loss on another one rises."""

    def __init__(self, pattern, rows):
        ids = torch.tensor(pattern * LENGTH)[:LENGTH]
        self.rows = [ids] * rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


TRAIN, EVAL = Sequences([1, 2, 3], 8), Sequences([4, 5], 2)


def model():
    torch.manual_seed(0)
    config = AutoConfig.for_model("momentum_lstm", vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                                  cell="momentum", dropout=0.0, embedding_dropout=0.0)
    return AutoModelForCausalLM.from_config(config)


class Iterates(TrainerCallback):
    def __init__(self):
        self.after_step = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after_step.append({n: p.detach().clone() for n, p in model.named_parameters()})


def arguments(output_dir, **extra):
    return TrainingArguments(
        output_dir=str(output_dir), num_train_epochs=EPOCHS, per_device_train_batch_size=4,
        per_device_eval_batch_size=2, learning_rate=1.0, lr_scheduler_type="constant", weight_decay=1e-3,
        eval_strategy="epoch", save_strategy="epoch", logging_steps=1, report_to=[], use_cpu=True, seed=0,
        data_seed=0, disable_tqdm=True, **extra)


def run(output_dir, resume=None, callbacks=()):
    trainer = NTASGDTrainer(model=model(), args=arguments(output_dir), train_dataset=TRAIN,
                            eval_dataset=EVAL, nonmono=NONMONO, callbacks=list(callbacks))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    iterates = Iterates()
    trainer = run(tmp_path_factory.mktemp("nt_asgd_whole"), callbacks=[iterates])
    return trainer, iterates


def switch_index(losses):
    for i in range(len(losses)):
        if i > NONMONO and losses[i] > min(losses[:i - NONMONO]):
            return i
    return None


def eval_loss_of(net, params):
    net = model().eval()
    net.load_state_dict(params, strict=False)
    batch = torch.stack(EVAL.rows)
    with torch.no_grad():
        return net(input_ids=batch, labels=batch).loss.item()


def test_every_evaluation_after_the_switch_scores_the_mean_of_the_iterates(whole):
    trainer, iterates = whole
    losses = [row["eval_loss"] for row in trainer.state.log_history if "eval_loss" in row]
    assert len(losses) == EPOCHS
    switch = switch_index(losses)
    assert switch is not None and switch < EPOCHS - 2, losses
    optimizer = trainer.nt_asgd
    steps_per_epoch = len(iterates.after_step) // EPOCHS
    assert optimizer.averaged_steps == (EPOCHS - 1 - switch) * steps_per_epoch
    for epoch in range(switch + 1, EPOCHS):
        since = iterates.after_step[(switch + 1) * steps_per_epoch:(epoch + 1) * steps_per_epoch]
        mean = {name: torch.stack([it[name] for it in since]).mean(0) for name in since[0]}
        assert losses[epoch] == pytest.approx(eval_loss_of(trainer.model, mean), rel=1e-5), epoch
    assert optimizer.switch["average_in_params"]
    final = dict(trainer.model.named_parameters())
    assert all(torch.allclose(final[n], mean[n], atol=1e-6) for n in mean), "the model ends as the mean"
    last = iterates.after_step[-1]
    assert not all(torch.allclose(final[n], last[n]) for n in last), "not the last iterate"


def test_resuming_after_the_switch_ends_as_the_uninterrupted_run(whole, tmp_path):
    trainer, _ = whole
    checkpoints = sorted((p for p in os.scandir(trainer.args.output_dir) if p.name.startswith("checkpoint-")),
                         key=lambda p: int(p.name.split("-")[1]))
    state = torch.load(os.path.join(checkpoints[-2].path, "optimizer.pt"), weights_only=True)
    switch = state["param_groups"][0]["nt_asgd"]
    assert switch["averaged_steps"], "the second last checkpoint is after the switch"
    resumed = run(trainer.args.output_dir + "-resumed", resume=checkpoints[-2].path)
    for (name, p), q in zip(resumed.model.named_parameters(), trainer.model.parameters()):
        assert torch.equal(p, q), name
        assert torch.equal(resumed.nt_asgd.state[p]["average"], trainer.nt_asgd.state[q]["average"]), name
    assert resumed.nt_asgd.switch == trainer.nt_asgd.switch


def test_misuse_is_refused(tmp_path):
    with pytest.raises(ValueError, match="builds its own optimizer"):
        NTASGDTrainer(model=model(), args=arguments(tmp_path),
                      optimizers=(torch.optim.SGD(model().parameters(), lr=1.0), None))
    with pytest.raises(ValueError, match="nonmono must be an integer >= 1"):
        NTASGDTrainer(model=model(), args=arguments(tmp_path), nonmono=0)
    with pytest.raises(ValueError, match="greater_is_better"):
        NTASGDTrainer(model=model(), args=arguments(tmp_path, metric_for_best_model="accuracy"),
                      eval_dataset=EVAL)
    trainer = NTASGDTrainer(model=model(), args=arguments(tmp_path, metric_for_best_model="perplexity",
                                                          greater_is_better=False, max_steps=2),
                            train_dataset=TRAIN, eval_dataset=EVAL)
    with pytest.raises(ValueError, match="'eval_perplexity', which the evaluation did not return"):
        trainer.train()
