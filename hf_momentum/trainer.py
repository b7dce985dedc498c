"""transformers' Trainer with the native families' model card (`hf_momentum.saving`).

Trainer.create_model_card writes its training summary over README.md with no pipeline_tag, no
license unless one is passed and, called without tags, without the custom_code tag that tells the
Hub the model needs trust_remote_code; Trainer.push_to_hub calls it just before its upload.
`ModelCardTrainer` adds those fields to that card (`complete_model_card`), so both leave a card
that says what the model is. Not a sibling of the modeling files: saved models do not need it.

`NTASGDTrainer` trains with AWD-LSTM's NT-ASGD (`plugins.nt_asgd`), the optimizer of MomentumRNN's
PTB runs (Appendix A.3).
"""
import logging
from typing import Optional

from transformers import Trainer

from plugins.nt_asgd import NTASGD
from plugins.validation import check_int

from .saving import RemoteCodeMixin, complete_model_card

logger = logging.getLogger(__name__)


class ModelCardTrainer(Trainer):
    """A Trainer whose create_model_card (also run by push_to_hub) completes the card with the
    model's library_name, license, pipeline_tag and tags when the model is a native one."""

    def create_model_card(self, *args, **kwargs) -> None:
        super().create_model_card(*args, **kwargs)
        model = self.accelerator.unwrap_model(self.model)
        if self.is_world_process_zero() and isinstance(model, RemoteCodeMixin):
            complete_model_card(self.args.output_dir, model)


class NTASGDTrainer(ModelCardTrainer):
    """A Trainer whose optimizer is NT-ASGD (`plugins.nt_asgd.NTASGD`, at `args.learning_rate`, with
    `args.weight_decay` on the parameters the Trainer decays): SGD until an evaluation's loss is worse
    than the best of all evaluations before the last `nonmono`, then the mean of the iterates since.

    - Before the switch, each evaluation during training scores the iterate and hands its loss to
      the optimizer. After it, each evaluation scores the average, and so does every saved model
      (`save_model`, each checkpoint, `load_best_model_at_end`). The next training step puts the
      iterate back, and the checkpoint's optimizer state carries it, so `resume_from_checkpoint`
      continues exactly.
    - The loss is `args.metric_for_best_model` when it is set (a loss: lower is better; with
      several eval datasets, name one of them, e.g. "eval_ptb_loss"), else "eval_loss".
    - AWD-LSTM keeps the rate constant: `lr_scheduler_type="constant"`."""

    def __init__(self, *args, nonmono: int = 5, **kwargs):
        if kwargs.get("optimizer_cls_and_kwargs") is not None or (kwargs.get("optimizers") or (None,))[0]:
            raise ValueError("NTASGDTrainer builds its own optimizer (NTASGD): pass neither optimizers nor "
                             "optimizer_cls_and_kwargs")
        nonmono = check_int(nonmono, "nonmono", low=1)
        super().__init__(*args, **kwargs)
        if self.args.greater_is_better and self.args.metric_for_best_model is not None:
            raise ValueError(f"NTASGDTrainer switches on a loss (lower is better); metric_for_best_model="
                             f"{self.args.metric_for_best_model!r} is greater_is_better")
        self.optimizer_cls_and_kwargs = (NTASGD, {"lr": self.args.learning_rate, "nonmono": nonmono})
        self._observed_at = None          # the global step whose evaluation the optimizer last saw
        self._evaluating = False

    @property
    def nt_asgd(self) -> Optional[NTASGD]:
        """The NTASGD inside the (accelerate-wrapped) optimizer; None before it is built."""
        optimizer = self.optimizer
        while optimizer is not None and not isinstance(optimizer, NTASGD):
            optimizer = getattr(optimizer, "optimizer", None)
        return optimizer

    def _use_average(self, average: bool) -> None:
        optimizer = self.nt_asgd
        if optimizer is not None:
            optimizer.use_average(average)

    def training_step(self, *args, **kwargs):
        self._use_average(False)
        return super().training_step(*args, **kwargs)

    def save_model(self, output_dir: Optional[str] = None, _internal_call: bool = False) -> None:
        self._use_average(True)
        super().save_model(output_dir, _internal_call)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        optimizer = self.nt_asgd
        if optimizer is None or self._evaluating:       # not training, or one of several eval datasets
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        optimizer.use_average(True)
        self._evaluating = True
        try:
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        finally:
            self._evaluating = False
        if optimizer.averaging or self._observed_at == self.state.global_step:
            return metrics
        name = self.args.metric_for_best_model or "loss"
        name = name if name.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{name}"
        if name not in metrics:
            raise ValueError(f"NTASGDTrainer switches on {name!r}, which the evaluation did not return (it "
                             f"returned {sorted(metrics)}): set metric_for_best_model to one of its losses")
        self._observed_at = self.state.global_step
        if optimizer.observe(metrics[name]):
            logger.info(f"NT-ASGD: {name} {metrics[name]:.4f} at step {self.state.global_step} is worse than "
                        f"the best before the last {optimizer.nonmono} evaluations: averaging the iterates "
                        "from here on")
        return metrics
