"""The one training loop of the transformer recipes (copy task, image generation, Long-Range
Arena, recipes/hf/train_clm.py), on `accelerate`.

`make_accelerator` runs the forward in bf16 autocast on CUDA and in float32 on the CPU, and
under `accelerate launch` places each rank on its GPU and wraps the model for distributed data
parallel training. `fit` prepares the model, the optimizer and a DataLoader of training batches,
then repeats: forward under autocast, `accelerator.backward`, optional gradient clipping, the
optimizer step, an optional LR schedule step (stepped once per optimizer step on every rank, as
the schedules are written for optimizer steps, not for samples). Every `eval_every` steps (or
after every epoch) it records a `History` point: the step, the epoch, the training wall time so
far with evaluation excluded, the mean of each training metric since the last point, and what
the `evaluate` callback returns. With the accelerator's gradient accumulation, a step is one
optimizer step over that many batches; a prepared DataLoader's pass ends with a shorter step, as
accelerate syncs the gradients at its end. A run can resume at a step (its checkpoint loaded by the
caller): the batches the earlier run consumed are skipped, pass by pass (a pass's length may depend
on its index, as a random BPTT length makes it).
"""
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch
from accelerate import Accelerator
from accelerate.data_loader import DataLoaderStateMixin
from torch.utils.data import DataLoader
from tqdm import tqdm

from .timing import synchronize

LossOutput = Union[torch.Tensor, Tuple[torch.Tensor, Dict[str, torch.Tensor]]]


@dataclass
class History:
    """One entry per evaluation point. epochs: passes over the training data so far (None when
    the data has no length); seconds: training time only; train: {metric: mean since the
    previous point} ("loss" always); eval: {metric: value} from the evaluate callback."""

    steps: List[int] = field(default_factory=list)
    epochs: List[Optional[float]] = field(default_factory=list)
    seconds: List[float] = field(default_factory=list)
    train: Dict[str, List[float]] = field(default_factory=dict)
    eval: Dict[str, List[float]] = field(default_factory=dict)


def make_accelerator(device, mixed_precision: Optional[str] = None) -> Accelerator:
    """bf16 autocast on CUDA, float32 on the CPU (mixed_precision None); `accelerate launch`
    decides each rank's GPU."""
    device = torch.device(device)
    if mixed_precision is None:
        mixed_precision = "bf16" if device.type == "cuda" else "no"
    return Accelerator(cpu=device.type == "cpu", mixed_precision=mixed_precision)


def _check_count(value, name: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")


def _split_loss(output: LossOutput) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    if isinstance(output, tuple):
        loss, metrics = output
        return loss, dict(metrics)
    return output, {}


class _Recorder:
    """Training metrics since the last point, and the training clock (stopped while evaluating)."""

    def __init__(self, device):
        self.device = device
        self.window: Dict[str, List[torch.Tensor]] = defaultdict(list)
        self.elapsed = 0.0
        self.started = 0.0

    def resume(self) -> None:
        synchronize(self.device)
        self.started = time.perf_counter()

    def pause(self) -> float:
        synchronize(self.device)
        self.elapsed += time.perf_counter() - self.started
        return self.elapsed

    def add(self, loss: torch.Tensor, metrics: Dict[str, torch.Tensor]) -> None:
        # detached tensors, averaged at the next point: no device sync per step
        self.window["loss"].append(loss.detach().float())
        for name, value in metrics.items():
            self.window[name].append(torch.as_tensor(value).detach().float())

    def means(self) -> Dict[str, float]:
        out = {name: float(torch.stack(values).double().mean()) for name, values in self.window.items()}
        self.window.clear()
        return out


class Passes:
    """The passes over sized training data in optimizer steps. A pass's length is read after
    `set_epoch(index)` where the data has it, so it may change from pass to pass. `ends_cycle`: the
    last step of a pass is cut short at its end (accelerate's prepared DataLoaders), rather than the
    accumulation running on into the next pass."""

    def __init__(self, data, accumulation: int, ends_cycle: bool):
        self.data, self.accumulation, self.ends_cycle = data, accumulation, ends_cycle
        self._batches: Dict[int, int] = {}

    def batches(self, index: int) -> int:
        """The batches in pass `index` (from 0)."""
        if index not in self._batches:
            if hasattr(self.data, "set_epoch"):
                self.data.set_epoch(index)
            self._batches[index] = len(self.data)
            if not self._batches[index]:
                raise ValueError(f"train_data has no batch in pass {index + 1}")
        return self._batches[index]

    def _steps_of(self, index: int) -> int:
        """Optimizer steps in pass `index` where each pass ends its last step (ends_cycle)."""
        return math.ceil(self.batches(index) / self.accumulation)

    def steps(self, passes: int) -> int:
        """Optimizer steps in the first `passes` passes."""
        if self.ends_cycle:
            return sum(self._steps_of(i) for i in range(passes))
        return math.ceil(sum(self.batches(i) for i in range(passes)) / self.accumulation)

    def locate(self, step: int) -> Tuple[int, int]:
        """(pass, batches of it already used) after `step` optimizer steps."""
        index = 0
        if self.ends_cycle:
            while step >= self._steps_of(index):
                step -= self._steps_of(index)
                index += 1
            return index, step * self.accumulation
        used = step * self.accumulation
        while used >= self.batches(index):
            used -= self.batches(index)
            index += 1
        return index, used


def passes_of(train_data, accelerator: Accelerator) -> Passes:
    """`Passes` of sized data as `fit` walks them with this accelerator."""
    accumulation = accelerator.gradient_accumulation_steps
    ends_cycle = accumulation == 1 or (accelerator.gradient_state.sync_with_dataloader
                                       and isinstance(train_data, DataLoaderStateMixin))
    return Passes(train_data, accumulation, ends_cycle)


def fit(model: torch.nn.Module, optimizer: torch.optim.Optimizer, train_data: Iterable,
        loss_fn: Callable[[torch.nn.Module, object], LossOutput], *, accelerator: Accelerator,
        epochs: Optional[int] = None, steps: Optional[int] = None, eval_every: Optional[int] = None,
        evaluate: Optional[Callable[[torch.nn.Module], Dict[str, float]]] = None, schedule=None,
        clip_grad_norm: Optional[float] = None, progress: bool = True, desc: str = "training",
        prepared: bool = False, start_step: int = 0, on_batch: Optional[Callable[[object], None]] = None,
        on_step: Optional[Callable[[int, torch.Tensor, Dict[str, torch.Tensor]], None]] = None,
        ) -> Tuple[torch.nn.Module, History]:
    """Train for `epochs` passes over `train_data` or for `steps` optimizer steps (exactly one of
    them; with `steps`, the data is passed over again as often as needed). Returns the unwrapped
    model and its History.

    loss_fn(model, batch) → loss, or (loss, {metric: scalar tensor}) averaged between points.
    evaluate(model) → {metric: float}, called with the prepared model in eval mode, without
    gradients and under autocast; prepare its DataLoaders with the same accelerator first.
    eval_every: steps between points (None: after every epoch); a point is always recorded after
    the last step. A DataLoader is prepared (sharded across ranks); any other iterable of batches
    is used as it is.

    prepared: the caller has passed the model, optimizer, data and schedule through
    `accelerator.prepare` (e.g. to load a checkpoint with `accelerator.load_state` before
    training); fit then prepares nothing. A prepared schedule is stepped with every batch, as
    accelerate expects under gradient accumulation; give an unprepared one only without it.
    start_step: optimizer steps already done; training goes on from there to `steps` (or to the
    end of `epochs`), skipping the batches those steps consumed. Data with `set_epoch` (a
    prepared DataLoader, a distributed sampler's loader) is told each pass's index.
    on_batch(batch) sees every batch before its forward; on_step(step, loss, metrics) runs after
    every optimizer step, with the detached loss and metrics of its last batch, before a point
    is recorded."""
    if (epochs is None) == (steps is None):
        raise ValueError(f"give exactly one of epochs and steps, got epochs={epochs!r}, steps={steps!r}")
    for value, name in ((epochs, "epochs"), (steps, "steps"), (eval_every, "eval_every")):
        _check_count(value, name)
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise ValueError(f"start_step must be a non-negative integer, got {start_step!r}")
    if clip_grad_norm is not None and not (isinstance(clip_grad_norm, (int, float)) and clip_grad_norm > 0):
        raise ValueError(f"clip_grad_norm must be a positive number or None, got {clip_grad_norm!r}")
    if not prepared:
        model, optimizer = accelerator.prepare(model, optimizer)
        if isinstance(train_data, DataLoader):
            train_data = accelerator.prepare(train_data)
    passes = passes_of(train_data, accelerator) if hasattr(train_data, "__len__") else None
    if steps is None and not (passes and len(train_data)):
        raise ValueError("epochs needs training data with a length of at least one batch")
    total = steps if steps is not None else passes.steps(epochs)
    history, recorder = History(), _Recorder(accelerator.device)
    bar = tqdm(total=total, initial=start_step, desc=desc, leave=False,
               disable=not progress or not accelerator.is_local_main_process)

    def record(step: int) -> None:
        seconds = recorder.pause()
        history.steps.append(step)
        history.epochs.append(epoch - 1 + batches / passes.batches(epoch - 1) if passes else None)
        history.seconds.append(seconds)
        for name, value in recorder.means().items():
            history.train.setdefault(name, []).append(value)
        if evaluate is not None:
            model.eval()
            with torch.no_grad(), accelerator.autocast():
                for name, value in evaluate(model).items():
                    history.eval.setdefault(name, []).append(float(value))
            model.train()
        latest = {**history.train, **history.eval}
        bar.set_postfix({name: f"{values[-1]:.3g}" for name, values in latest.items()})
        recorder.resume()

    model.train()
    step, epoch, skip, cycle_start = start_step, 0, 0, True
    if start_step and passes:
        epoch, skip = passes.locate(start_step)
    recorder.resume()
    while step < total:
        if hasattr(train_data, "set_epoch"):
            train_data.set_epoch(epoch)
        epoch += 1
        batches = skip
        for batch in accelerator.skip_first_batches(train_data, skip) if skip else train_data:
            batches += 1
            if on_batch is not None:
                on_batch(batch)
            with accelerator.accumulate(model):
                with accelerator.autocast():
                    loss, metrics = _split_loss(loss_fn(model, batch))
                if cycle_start:
                    # the last step's gradients, kept until here for a loss_fn that reads them; the
                    # wrapped optimizer's zero_grad, as accelerate's skips it between accumulated batches
                    getattr(optimizer, "optimizer", optimizer).zero_grad(set_to_none=True)
                accelerator.backward(loss)
                if clip_grad_norm is not None and accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), clip_grad_norm)
                optimizer.step()
                if schedule is not None:
                    schedule.step()
            recorder.add(loss, metrics)
            cycle_start = accelerator.sync_gradients
            if not cycle_start:
                continue
            step += 1
            bar.update(1)
            if on_step is not None:
                on_step(step, loss.detach(), metrics)
            if (eval_every is not None and step % eval_every == 0) or step == total:
                record(step)
            if step == total:
                break
        else:
            if batches == skip:
                raise ValueError(f"train_data gave no batch in pass {epoch} (an exhausted iterator?)")
            if eval_every is None and step < total:
                record(step)
        skip = 0
    bar.close()
    return accelerator.unwrap_model(model), history

