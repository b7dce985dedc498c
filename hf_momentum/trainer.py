"""transformers' Trainer with the native families' model card (`hf_momentum.saving`).

Trainer.create_model_card writes its training summary over README.md with no pipeline_tag, no
license unless one is passed and, called without tags, without the custom_code tag that tells the
Hub the model needs trust_remote_code; Trainer.push_to_hub calls it just before its upload.
`ModelCardTrainer` adds those fields to that card (`complete_model_card`), so both leave a card
that says what the model is. Not a sibling of the modeling files: saved models do not need it.
"""
from transformers import Trainer

from .saving import RemoteCodeMixin, complete_model_card


class ModelCardTrainer(Trainer):
    """A Trainer whose create_model_card (also run by push_to_hub) completes the card with the
    model's library_name, license, pipeline_tag and tags when the model is a native one."""

    def create_model_card(self, *args, **kwargs) -> None:
        super().create_model_card(*args, **kwargs)
        model = self.accelerator.unwrap_model(self.model)
        if self.is_world_process_zero() and isinstance(model, RemoteCodeMixin):
            complete_model_card(self.args.output_dir, model)
