"""The recipes' shared accelerate loop (recipes/common/training.py): a tiny model learns, the
History's points, its training clock without evaluation, the LR schedule and clipping, errors, and
a run resumed at any step (gradient accumulation, passes of different lengths) ends like the
uninterrupted run."""
import copy
import itertools

import pytest
import torch
from accelerate import Accelerator
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from recipes.common import training
from recipes.common.training import fit, make_accelerator


def regression_data(n=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=generator)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.3


def mse(model, batch):
    x, y = batch
    prediction = model(x)
    return F.mse_loss(prediction, y), {"mean_prediction": prediction.mean()}


def test_a_tiny_model_learns_and_every_point_is_recorded():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    loader = DataLoader(TensorDataset(*regression_data()), batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    x, y = regression_data(32, seed=1)
    calls = []

    def evaluate(m):
        calls.append((m.training, torch.is_grad_enabled()))
        return {"val_mse": F.mse_loss(m(x), y)}

    plain, history = fit(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, mse,
                         accelerator=make_accelerator("cpu"), epochs=6, evaluate=evaluate, progress=False)
    assert plain is model
    assert history.steps == [8, 16, 24, 32, 40, 48] and history.epochs == [1, 2, 3, 4, 5, 6]
    assert history.eval["val_mse"][-1] < 0.01 * history.eval["val_mse"][0]
    assert history.train["loss"][-1] < history.train["loss"][0]
    assert len(history.train["mean_prediction"]) == 6
    assert calls == [(False, False)] * 6          # eval mode, no gradients
    assert model.training


def test_steps_with_eval_every_record_the_last_step_too_and_repeat_the_data():
    model = torch.nn.Linear(3, 1)
    loader = DataLoader(TensorDataset(*regression_data(16)), batch_size=8)
    _, history = fit(model, torch.optim.SGD(model.parameters(), lr=0.01), loader, mse,
                     accelerator=make_accelerator("cpu"), steps=7, eval_every=3, progress=False)
    assert history.steps == [3, 6, 7]
    assert history.epochs == [1.5, 3.0, 3.5]
    assert history.eval == {}


def test_an_iterable_without_length_runs_by_steps():
    model = torch.nn.Linear(3, 1)
    batches = itertools.repeat(regression_data(8))
    _, history = fit(model, torch.optim.SGD(model.parameters(), lr=0.01), batches, mse,
                     accelerator=make_accelerator("cpu"), steps=4, eval_every=2, progress=False)
    assert history.steps == [2, 4] and history.epochs == [None, None]


def test_the_training_clock_excludes_evaluation(monkeypatch):
    """A fake clock: each training step costs 1 s, each evaluation 100 s."""
    clock = {"now": 0.0}
    monkeypatch.setattr(training.time, "perf_counter", lambda: clock["now"])

    def loss_fn(model, batch):
        clock["now"] += 1.0
        return mse(model, batch)

    def evaluate(model):
        clock["now"] += 100.0
        return {}

    model = torch.nn.Linear(3, 1)
    loader = DataLoader(TensorDataset(*regression_data(32)), batch_size=8)
    _, history = fit(model, torch.optim.SGD(model.parameters(), lr=0.01), loader, loss_fn,
                     accelerator=make_accelerator("cpu"), steps=10, eval_every=4, evaluate=evaluate,
                     progress=False)
    assert history.steps == [4, 8, 10]
    assert history.seconds == [4.0, 8.0, 10.0]


def test_the_schedule_steps_once_per_optimizer_step_and_gradients_are_clipped():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    norms = []

    def loss_fn(model, batch):
        if model.weight.grad is not None:
            norms.append(float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm()))
        x, y = batch
        return 1000.0 * F.mse_loss(model(x), y)

    loader = DataLoader(TensorDataset(*regression_data(8)), batch_size=4)
    fit(model, optimizer, loader, loss_fn, accelerator=make_accelerator("cpu"), steps=5,
        schedule=schedule, clip_grad_norm=0.5, progress=False)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1.0 / 6)
    assert norms and all(n <= 0.5 + 1e-6 for n in norms)


@pytest.mark.parametrize("kwargs, match", [
    (dict(), "exactly one of epochs and steps"),
    (dict(epochs=1, steps=1), "exactly one of epochs and steps"),
    (dict(steps=0), "steps must be a positive integer"),
    (dict(epochs=1.5), "epochs must be a positive integer"),
    (dict(steps=2, eval_every=0), "eval_every must be a positive integer"),
    (dict(steps=2, clip_grad_norm=-1.0), "clip_grad_norm must be a positive number"),
])
def test_bad_arguments_are_named(kwargs, match):
    model = torch.nn.Linear(3, 1)
    loader = DataLoader(TensorDataset(*regression_data(8)), batch_size=4)
    with pytest.raises(ValueError, match=match):
        fit(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, mse,
            accelerator=make_accelerator("cpu"), progress=False, **kwargs)


def test_an_exhausted_iterator_is_an_error_not_a_hang():
    model = torch.nn.Linear(3, 1)
    with pytest.raises(ValueError, match="gave no batch"):
        fit(model, torch.optim.SGD(model.parameters(), lr=0.1), iter([regression_data(4)]), mse,
            accelerator=make_accelerator("cpu"), steps=3, progress=False)


def test_accumulated_run_resumed_at_a_step_ends_like_the_uninterrupted_run():
    """Two batches per optimizer step, 10 batches per pass, 8 steps. A run resumed at step 3
    from that step's model and optimizer skips the 6 batches already used, crosses into the
    second pass, and ends with the uninterrupted run's parameters, bit for bit."""
    def run(start_step=0, state=None):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
        loader = DataLoader(TensorDataset(*regression_data(40)), batch_size=4)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        seen, steps, saved = [], [], {}

        def on_step(step, loss, metrics):
            steps.append(step)
            if step == 3:
                saved.update(model=copy.deepcopy(model.state_dict()),
                             optimizer=copy.deepcopy(optimizer.state_dict()))

        plain, _ = fit(model, optimizer, loader, mse, accelerator=accelerator, steps=8, prepared=True,
                       start_step=start_step, progress=False, on_step=on_step,
                       on_batch=lambda batch: seen.append(batch[0][0, 0].item()))
        return plain, seen, steps, saved

    full, full_seen, full_steps, saved = run()
    assert full_steps == list(range(1, 9)) and len(full_seen) == 16
    resumed, resumed_seen, resumed_steps, _ = run(start_step=3, state=saved)
    assert resumed_steps == list(range(4, 9))
    assert resumed_seen == full_seen[6:]
    for p, q in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


class PassesOfTheirOwnLength(torch.utils.data.Dataset):
    """40 samples in pass 0, then 4 fewer in each pass (as random BPTT lengths change a pass's)."""

    def __init__(self):
        self.x, self.y = regression_data(40)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return 40 - 4 * self.epoch

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class LoaderOfEpochs(DataLoader):
    """A plain DataLoader that tells its dataset each pass's index, as accelerate's loaders do."""

    def set_epoch(self, epoch):
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)


@pytest.mark.parametrize("varying", [False, True], ids=["equal passes", "passes of their own length"])
@pytest.mark.parametrize("prepare", [True, False], ids=["accelerate's loader", "plain loader"])
def test_a_run_resumed_at_any_step_with_three_batches_a_step_ends_like_the_uninterrupted(prepare, varying):
    """Passes of 10 (or 10, 9, 8) batches, three per optimizer step: accelerate's loader ends each pass
    with a shorter step, a plain loader's accumulation runs on into the next pass. Resumed at each
    step, the run skips exactly the batches the uninterrupted run had used, pass by pass, and ends
    with its parameters, bit for bit."""
    def run(start_step=0, saved=None):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
        loader = LoaderOfEpochs(PassesOfTheirOwnLength() if varying else TensorDataset(*regression_data(40)),
                                batch_size=4)
        model, optimizer = accelerator.prepare(model, optimizer)
        if prepare:
            loader = accelerator.prepare(loader)
        if saved is not None:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
        seen, states, used = [], {}, {}

        def on_step(step, loss, metrics):
            used[step] = len(seen)
            states[step] = {"model": copy.deepcopy(model.state_dict()),
                            "optimizer": copy.deepcopy(optimizer.state_dict())}

        plain, _ = fit(model, optimizer, loader, mse, accelerator=accelerator, steps=9, prepared=True,
                       start_step=start_step, progress=False, on_step=on_step,
                       on_batch=lambda batch: seen.append(batch[0][:, 0].tolist()))
        return plain, seen, states, used

    full, full_seen, states, used = run()
    passes = [10, 9, 8] if varying else [10, 10, 10]
    if prepare:
        first, second = itertools.accumulate(-(-batches // 3) for batches in passes[:2])
        assert used[first - 1] == 9 and used[first] == passes[0] and used[second] == passes[0] + passes[1]
    else:
        assert all(used[step] == 3 * step for step in used) and len(full_seen) == 27
    for step in range(1, 9):
        resumed, resumed_seen, _, _ = run(step, states[step])
        assert resumed_seen == full_seen[used[step]:], step
        for p, q in zip(full.parameters(), resumed.parameters()):
            assert torch.equal(p, q), step


@pytest.mark.parametrize("length", [dict(epochs=3), dict(steps=10)], ids=["epochs", "steps"])
def test_epochs_of_their_own_length_count_their_own_steps(length):
    """Three passes of 10, 9 and 8 batches at three batches a step: 4 + 3 + 3 steps, a point after
    each pass at whole epochs (train_clm runs by steps and evaluates at each pass's end so)."""
    model = torch.nn.Linear(3, 1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    _, history = fit(model, torch.optim.SGD(model.parameters(), lr=0.01),
                     DataLoader(PassesOfTheirOwnLength(), batch_size=4), mse, accelerator=accelerator,
                     progress=False, **length)
    assert history.steps == [4, 7, 10] and history.epochs == [1.0, 2.0, 3.0]
