"""`--optimizer nt_asgd --lr-scheduler nt_asgd [--nonmono 5]`: AWD-LSTM's NT-ASGD in fairseq-train
(`plugins.nt_asgd.NTASGD`; MomentumRNN, Appendix A.3).

- The scheduler is fairseq's `fixed` one (the same options). At the end of each epoch it hands the
  validation loss to the optimizer, which switches from SGD to averaging when the loss stops
  improving (`--nonmono`).
- `--task language_modeling_bptt` validates the average and saves it as the checkpoint's model.
  Before each validation the task puts the average in the parameters, and before the next training
  step it puts the iterate back. The iterate rides in the optimizer's state, so `checkpoint_best.pt`,
  fairseq-validate and convert_to_hf see the averaged model, and a resumed run continues the
  iterate.
- Refused: the scheduler without this optimizer, this optimizer without the scheduler or with
  another task, and --fp16/--bf16, whose optimizer steps float32 copies of the parameters. --amp
  steps the model's own parameters and is not refused; it needs CUDA and is untested here."""
import logging
from dataclasses import dataclass, field
from typing import List, Optional

from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from fairseq.optim.amp_optimizer import AMPOptimizer
from fairseq.optim.lr_scheduler import register_lr_scheduler
from fairseq.optim.lr_scheduler.fixed_schedule import FixedLRSchedule, FixedLRScheduleConfig
from omegaconf import II

from plugins.nt_asgd import NTASGD

logger = logging.getLogger(__name__)
NAME = "nt_asgd"


@dataclass
class FairseqNTASGDConfig(FairseqDataclass):
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay (added to the gradient)"})
    nonmono: int = field(default=5, metadata={
        "help": "switch to averaging when the validation loss is worse than the best of all earlier "
                "epochs but the last NONMONO (AWD-LSTM's default 5)"})
    lr: List[float] = II("optimization.lr")


@register_optimizer(NAME, dataclass=FairseqNTASGDConfig)
class FairseqNTASGD(FairseqOptimizer):
    def __init__(self, cfg: FairseqNTASGDConfig, params):
        super().__init__(cfg)
        self._optimizer = NTASGD(params, **self.optimizer_config, nonmono=cfg.nonmono)
        self.scheduled = False      # set by --lr-scheduler nt_asgd, which feeds it validation losses
        self.task_swaps = False     # set by --task language_modeling_bptt, which swaps in the average
        self.unobserved_steps = 0   # steps since the last validation loss the scheduler handed over

    @property
    def optimizer_config(self):
        return {"lr": self.cfg.lr[0], "weight_decay": self.cfg.weight_decay}

    def step(self, closure=None, scale=1.0, groups=None):
        if not self.scheduled:
            raise ValueError(f"--optimizer {NAME} switches to averaging on the validation loss that "
                             f"--lr-scheduler {NAME} hands it: use that scheduler")
        if not self.task_swaps:
            raise ValueError(f"--optimizer {NAME} validates and saves the average of its iterates through "
                             "--task language_modeling_bptt, which swaps it into the model; this task "
                             "did not")
        self.unobserved_steps += 1
        return super().step(closure, scale, groups)


def nt_asgd_in(optimizer) -> Optional[FairseqNTASGD]:
    """The FairseqNTASGD the trainer's `optimizer` is or wraps (None: another optimizer). Refuses the
    wrappers that step float32 copies of the parameters (--fp16, --bf16): the average must be of the
    model's own parameters to be swapped into them."""
    if isinstance(optimizer, FairseqNTASGD):
        return optimizer
    inner = getattr(optimizer, "fp32_optimizer", None)
    if isinstance(inner, FairseqNTASGD):
        if isinstance(optimizer, AMPOptimizer):
            return inner
        raise ValueError(f"--optimizer {NAME} averages the model's own parameters: train in float32 or "
                         f"with --amp, not with {type(optimizer).__name__} (--fp16 / --bf16), which "
                         "steps float32 copies of them")
    return None


@dataclass
class NTASGDScheduleConfig(FixedLRScheduleConfig):
    pass


@register_lr_scheduler(NAME, dataclass=NTASGDScheduleConfig)
class NTASGDSchedule(FixedLRSchedule):
    """fairseq's fixed schedule that hands each epoch's validation loss to --optimizer nt_asgd."""

    def __init__(self, cfg, optimizer):
        super().__init__(cfg, optimizer)
        self.nt_asgd = nt_asgd_in(optimizer)
        if self.nt_asgd is None:
            raise ValueError(f"--lr-scheduler {NAME} switches --optimizer {NAME} to averaging; the "
                             f"optimizer is {type(optimizer).__name__}")
        self.nt_asgd.scheduled = True

    def step(self, epoch, val_loss=None):
        optimizer = self.nt_asgd.optimizer
        if val_loss is None:               # also called so when a checkpoint is loaded: no step since
            if self.nt_asgd.unobserved_steps and not optimizer.averaging:
                logger.warning(f"NT-ASGD: epoch {epoch} ended without a validation loss; the switch to "
                               "averaging is checked at validated epochs only")
        else:
            self.nt_asgd.unobserved_steps = 0
            if optimizer.observe(val_loss):
                logger.info(f"NT-ASGD: the validation loss {val_loss:.4f} of epoch {epoch} is worse than "
                            f"the best before the last {optimizer.nonmono} epochs: averaging the iterates "
                            "from here on")
        return super().step(epoch, val_loss)
