"""plugins.nt_asgd.NTASGD (AWD-LSTM's NT-ASGD, MomentumRNN Appendix A.3): the switch is AWD-LSTM's rule
on any loss sequence; before it the iterates are SGD's, after it the average is the mean of the
iterates since the switch (float64, each step at its own rate); the average swaps in and out of the
parameters exactly; a state saved anywhere, swapped or not, resumes to the uninterrupted run; under
accelerate's fp16 scaler a skipped step is not averaged."""
import random

import pytest
import torch

from plugins.nt_asgd import NTASGD


def awd_lstm_switch(losses, nonmono):
    """The epoch (0-based) at which AWD-LSTM's main.py builds its ASGD, or None: its loop literally."""
    best_val_loss = []
    for epoch, val_loss in enumerate(losses):
        if len(best_val_loss) > nonmono and val_loss > min(best_val_loss[:-nonmono]):
            return epoch
        best_val_loss.append(val_loss)
    return None


def test_the_switch_is_awd_lstms_rule():
    rng = random.Random(0)
    switches = set()
    for trial in range(400):
        nonmono = rng.randint(1, 4)
        if trial % 4:
            losses = [rng.choice([4.0, 4.1, 4.2, 4.3]) - 0.01 * epoch * rng.random() for epoch in range(12)]
        else:                                # improving, with ties and rises inside the window
            losses = [4.0 - 0.1 * epoch + rng.choice([0.0, 0.0, 0.15]) for epoch in range(12)]
        optimizer = NTASGD([torch.zeros(1, requires_grad=True)], lr=1.0, nonmono=nonmono)
        switched = [epoch for epoch, loss in enumerate(losses) if optimizer.observe(loss)]
        expected = awd_lstm_switch(losses, nonmono)
        assert switched == ([] if expected is None else [expected]), (losses, nonmono)
        assert optimizer.averaging == (expected is not None)
        switches.add(expected)
    assert None in switches and len(switches) > 4, "the sequences reach several outcomes"


def gradient(params, step):
    """A fixed, nonlinear gradient field (the same in both computations)."""
    torch.manual_seed(100 + step)
    return [torch.sin(3 * p) + torch.randn_like(p) for p in params]


def run(optimizer, params, rates, switch_at, start=0):
    """Steps start..len(rates)-1 at rates[t], observing a loss that switches before step switch_at."""
    for step in range(start, len(rates)):
        if step == switch_at:
            optimizer.observe(1.0)
            optimizer.observe(1.0)
            assert optimizer.observe(2.0), "a worse loss than the best before the last check"
        for group in optimizer.param_groups:
            group["lr"] = rates[step]
        for p, g in zip(params, gradient([p.detach() for p in params], step)):
            p.grad = g
        optimizer.step()


def fresh_params():
    torch.manual_seed(1)
    return [torch.randn(3, 4, dtype=torch.float64, requires_grad=True),
            torch.randn(5, dtype=torch.float64, requires_grad=True)]


@pytest.mark.parametrize("foreach", [False, True])
def test_sgd_then_the_mean_of_the_iterates_since_the_switch(foreach):
    rates = [0.3, 0.1, 0.2, 0.05, 0.25, 0.15, 0.1, 0.3]
    switch_at, weight_decay = 3, 0.01
    params = fresh_params()
    optimizer = NTASGD(params, lr=rates[0], weight_decay=weight_decay, nonmono=1, foreach=foreach)
    run(optimizer, params, rates, switch_at)

    expected = [p.detach().clone() for p in fresh_params()]
    iterates = []
    for step, rate in enumerate(rates):
        grads = gradient(expected, step)
        expected = [p - rate * (g + weight_decay * p) for p, g in zip(expected, grads)]
        if step >= switch_at:
            iterates.append(expected)
    mean = [torch.stack(parts).mean(0) for parts in zip(*iterates)]
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.detach(), e, rtol=1e-13, atol=1e-13)
    assert optimizer.averaged_steps == len(rates) - switch_at
    assert optimizer.use_average(True)
    for p, m in zip(params, mean):
        torch.testing.assert_close(p.detach(), m, rtol=1e-13, atol=1e-13)
    assert not torch.allclose(params[0].detach(), expected[0]), "the average is not the last iterate"


def test_the_average_swaps_in_and_out_exactly_and_no_step_runs_on_it():
    params = fresh_params()
    optimizer = NTASGD(params, lr=0.1, nonmono=1)
    assert not optimizer.use_average(True), "no average before the switch"
    run(optimizer, params, [0.1] * 4, switch_at=1)
    iterate = [p.detach().clone() for p in params]
    average = [optimizer.state[p]["average"].clone() for p in params]
    assert optimizer.use_average(True) and not optimizer.use_average(True)
    assert all(torch.equal(p, a) for p, a in zip(params, average))
    with pytest.raises(RuntimeError, match="use_average\\(False\\)"):
        optimizer.step()
    assert optimizer.use_average(False)
    assert all(torch.equal(p, i) for p, i in zip(params, iterate))
    assert all(torch.equal(optimizer.state[p]["average"], a) for p, a in zip(params, average))


@pytest.mark.parametrize("stop", [2, 5], ids=["before-switch", "averaging"])
@pytest.mark.parametrize("swapped", [False, True])
def test_a_saved_state_resumes_the_uninterrupted_run(stop, swapped):
    rates, switch_at = [0.2, 0.1, 0.3, 0.1, 0.2, 0.2, 0.1, 0.3], 3
    whole = fresh_params()
    optimizer = NTASGD(whole, lr=0.2, weight_decay=0.01, nonmono=1)
    run(optimizer, whole, rates, switch_at)
    optimizer.use_average(True)

    params = fresh_params()
    first = NTASGD(params, lr=0.2, weight_decay=0.01, nonmono=1)
    run(first, params, rates[:stop], switch_at)
    first.use_average(swapped)
    saved_params = [p.detach().clone() for p in params]
    saved = first.state_dict()

    resumed = [p.detach().clone().requires_grad_() for p in saved_params]
    second = NTASGD(resumed, lr=0.2, weight_decay=0.01, nonmono=1)
    second.load_state_dict(saved)
    second.use_average(False)
    run(second, resumed, rates, switch_at if stop <= switch_at else None, start=stop)
    second.use_average(True)
    assert second.averaged_steps == optimizer.averaged_steps
    for p, q in zip(resumed, whole):
        assert torch.equal(p, q)
        assert torch.equal(second.state[p]["average"], optimizer.state[q]["average"])


def test_the_state_dict_keeps_the_switch_where_distributed_checkpoints_keep_entries():
    """torch.distributed.checkpoint keeps a state dict's "state" and "param_groups" only, and loads into a
    fresh optimizer's dict in place: the switch rides in every group, and before the switch each
    parameter has a zero average of its shape (a place for a later state's averages) that a load
    drops again. A state saved with the switch as a top-level entry (before 2026-12-06) still loads."""
    params = fresh_params()
    fresh = NTASGD(params, lr=0.1, nonmono=1).state_dict()
    assert set(fresh) == {"state", "param_groups"}
    assert [fresh["state"][i]["average"].shape for i in range(len(params))] == [p.shape for p in params]
    assert not any(fresh["state"][i]["average"].any() for i in range(len(params)))
    assert all(group["nt_asgd"]["averaged_steps"] is None for group in fresh["param_groups"])
    before = NTASGD(params, lr=0.1, nonmono=1)
    before.load_state_dict(fresh)
    assert not before.state and not before.averaging

    optimizer = NTASGD(params, lr=0.1, nonmono=1)
    run(optimizer, params, [0.1] * 4, switch_at=1)
    saved = optimizer.state_dict()
    groups = [{k: v for k, v in group.items() if k != "nt_asgd"} for group in saved["param_groups"]]
    old_format = {"state": saved["state"], "nt_asgd": saved["param_groups"][0]["nt_asgd"],
                  "param_groups": groups}
    for state in (saved, old_format):
        loaded = NTASGD([p.detach().clone().requires_grad_() for p in params], lr=0.1, nonmono=1)
        loaded.load_state_dict(state)
        assert loaded.switch == optimizer.switch and loaded.averaged_steps == 3
        assert "nt_asgd" not in loaded.param_groups[0]
        for p, q in zip(loaded._params(), params):
            assert torch.equal(loaded.state[p]["average"], optimizer.state[q]["average"])


def test_under_accelerates_fp16_scaler_a_skipped_step_is_not_averaged():
    """Mixed precision fp16 (accelerate's AcceleratedOptimizer with a GradScaler; here the CPU's):
    the scaler unscales before the step, so the average takes the unscaled update, and a step it
    skips for an inf gradient leaves the iterate, the average and the count as they were."""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    Accelerator(cpu=True)                  # the process state AcceleratedOptimizer reads
    params = fresh_params()
    optimizer = NTASGD(params, lr=0.1, nonmono=1)
    for loss in (1.0, 1.0, 2.0):
        optimizer.observe(loss)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    wrapped = AcceleratedOptimizer(optimizer, device_placement=False, scaler=scaler)

    def step(grads):
        for p, g in zip(params, grads):
            p.grad = scaler.scale(g.clone())           # what backward of a scaled loss leaves
        wrapped.step()                                  # which also updates the scale
    expected = [p.detach() - 0.1 * g for p, g in zip(params, gradient(params, 0))]
    step(gradient(params, 0))
    assert not wrapped.step_was_skipped and optimizer.averaged_steps == 1
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-12)
    kept = [p.detach().clone() for p in params] + [optimizer.state[p]["average"].clone() for p in params]
    step([torch.full_like(p, float("inf")) for p in params])
    assert wrapped.step_was_skipped and optimizer.averaged_steps == 1
    now = [p.detach() for p in params] + [optimizer.state[p]["average"] for p in params]
    assert all(torch.equal(a, b) for a, b in zip(now, kept))


def test_bad_arguments_are_refused_by_name():
    params = [torch.zeros(2, requires_grad=True)]
    with pytest.raises(ValueError, match="nonmono must be an integer >= 1"):
        NTASGD(params, lr=1.0, nonmono=0)
    with pytest.raises(ValueError, match="lr must be >= 0"):
        NTASGD(params, lr=-1.0)
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        NTASGD(params, lr=1.0, weight_decay=-0.1)
    with pytest.raises(ValueError, match="no NT-ASGD switch"):
        NTASGD(params, lr=1.0).load_state_dict(torch.optim.SGD(params, lr=1.0).state_dict())
