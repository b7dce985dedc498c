"""`fairseq-train --optimizer nt_asgd --lr-scheduler nt_asgd` (AWD-LSTM's NT-ASGD) with --task
language_modeling_bptt: the switch is logged at the epoch whose validation loss stops improving; once
averaging, each validation scores the average, which the checkpoint keeps as its model (fairseq-validate
gives the loss logged for it) with the iterate in the optimizer's state; a run stopped inside an
averaging epoch resumes to the parameters, average and iterate of one that never stopped; and the
combinations that could not average are refused."""
import re

import pytest
import torch
from helpers.fairseq_cli import USER_DIR, preprocess_lm, run_cli, train, write_lm_text

from fairseq_momentum.optim.nt_asgd import nt_asgd_in

# a small training split that the model overfits, so that the validation loss stops improving
CLI = ["--task", "language_modeling_bptt", "--arch", "momentum_lstm_lm", "--decoder-layers", "2",
       "--decoder-embed-dim", "16", "--decoder-hidden-size", "64", "--lstm-cell", "momentum",
       "--lstm-momentum", "0.5", "--tokens-per-sample", "8", "--batch-size", "2", "--batch-size-valid", "2",
       "--optimizer", "nt_asgd", "--lr-scheduler", "nt_asgd", "--nonmono", "1", "--lr", "3",
       "--clip-norm", "0.25", "--weight-decay", "1e-4"]
EPOCHS = 12
SWITCH = re.compile(r"NT-ASGD: the validation loss [0-9.]+ of epoch (\d+) is worse")
VALID = re.compile(r"epoch (\d+) \| valid on 'valid' subset \| loss ([0-9.]+)")


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("nt_asgd")
    sizes = (("train", 24), ("valid", 30), ("test", 30))
    return preprocess_lm(write_lm_text(root / "text", sizes=sizes, seed=11), root / "bin")


@pytest.fixture(scope="module")
def whole(lm_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("nt_asgd_whole")
    proc = train(lm_data, save, *CLI, "--max-epoch", str(EPOCHS))
    return save, proc.stdout + proc.stderr


def switch_epoch(log):
    epochs = [int(epoch) for epoch in SWITCH.findall(log)]
    assert len(epochs) == 1, "one switch"
    return epochs[0]


def saved(path):
    checkpoint = torch.load(path)
    state = checkpoint["last_optimizer_state"]
    names = list(checkpoint["model"])
    iterate = {names[i]: state["state"][i]["average"] for i in range(len(names))}
    return checkpoint["model"], iterate, state["param_groups"][0]["nt_asgd"]


def test_the_average_is_validated_and_saved_from_the_switch_on(lm_data, whole):
    save, log = whole
    epoch = switch_epoch(log)
    assert 1 < epoch < EPOCHS
    losses = {int(e): float(loss) for e, loss in VALID.findall(log)}
    before = [losses[e] for e in range(1, epoch)]
    assert losses[epoch] > min(before[:-1]), "the switch is the rule's (--nonmono 1)"
    assert "validating the average of the last" in log.split(f"of epoch {epoch} is worse")[1]

    model, iterate, switch = saved(save / "checkpoint_last.pt")
    assert switch["average_in_params"] and switch["averaged_steps"] > 0
    assert any(not torch.equal(model[name], iterate[name]) for name in model), "model = the average"
    validated = run_cli("validate", lm_data, "--user-dir", USER_DIR, "--task", "language_modeling_bptt",
                        "--path", save / "checkpoint_last.pt", "--cpu", "--batch-size", "2")
    output = validated.stdout + validated.stderr
    scored = float(re.search(r"valid on 'valid' subset \| loss ([0-9.]+)", output).group(1))
    assert scored == losses[EPOCHS], "fairseq-validate scores the model the last validation did"


def test_a_run_stopped_while_averaging_resumes_exactly(lm_data, whole, tmp_path):
    whole_save, log = whole
    updates = int(re.search(rf"epoch {switch_epoch(log):03d} \| .*?num_updates (\d+)", log).group(1))
    interrupted = tmp_path / "interrupted"
    train(lm_data, interrupted, *CLI, "--max-epoch", str(EPOCHS), "--max-update", str(updates + 17))
    stopped = saved(interrupted / "checkpoint_last.pt")[2]
    assert stopped["averaged_steps"] == 17 and stopped["average_in_params"]
    train(lm_data, interrupted, *CLI, "--max-epoch", str(EPOCHS))
    resumed, expected = saved(interrupted / "checkpoint_last.pt"), saved(whole_save / "checkpoint_last.pt")
    for part in (0, 1):                                   # the saved model (the average), the iterate
        assert resumed[part].keys() == expected[part].keys()
        for name in expected[part]:
            assert torch.equal(resumed[part][name], expected[part][name]), name
    assert resumed[2] == expected[2]


@pytest.mark.parametrize("change, message", [
    (["--lr-scheduler", "fixed"], "use that scheduler"),
    (["--optimizer", "sgd", "--nonmono", None], "the optimizer is SGD"),
    (["--task", "language_modeling", "--arch", "momentum_lstm_lm", "--sample-break-mode", "eos"],
     "this task did not"),
], ids=["fixed-schedule", "sgd", "other-task"])
def test_what_cannot_average_is_refused(lm_data, tmp_path, change, message):
    args = list(CLI)
    for flag, value in zip(change[::2], change[1::2]):
        if value is None:
            del args[args.index(flag):args.index(flag) + 2]
        elif flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    proc = train(lm_data, tmp_path / "save", *args, "--max-update", "2", check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]


def test_optimizers_stepping_float32_copies_are_refused():
    from fairseq_momentum.optim.nt_asgd import FairseqNTASGD
    inner = FairseqNTASGD.__new__(FairseqNTASGD)
    wrapper = type("FP16Optimizer", (), {"fp32_optimizer": inner})()
    with pytest.raises(ValueError, match="not with FP16Optimizer"):
        nt_asgd_in(wrapper)
    assert nt_asgd_in(inner) is inner and nt_asgd_in(object()) is None
