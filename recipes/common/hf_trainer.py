"""What the transformers Trainer recipes (recipes/hf/run_translation.py, run_mlm.py) share: the
momentum transformer's size and regularisation arguments, and the train / save / evaluate sequence
of transformers' own examples."""
from dataclasses import dataclass, field
from typing import Optional

from .config_overrides import with_overrides
from .process_group import end_process_group


@dataclass
class MomentumArguments:
    hidden_size: int = field(default=256)
    num_attention_heads: int = field(default=4)
    intermediate_size: Optional[int] = field(default=None, metadata={"help": "default 4 x hidden_size"})
    attention_momentum: float = field(default=0.6, metadata={"help": "β of eq. 12-14, in [0, 1)"})
    attention_step_size: float = field(default=1.0, metadata={"help": "γ of eq. 12-14, > 0"})
    connection: str = field(default="none",
                            metadata={"help": "none | momentum (eq. 15) | adaptive (eq. 18)"})
    layer_norm: str = field(default="pre", metadata={"help": "pre | post"})
    dropout: float = field(default=0.1)
    max_position_embeddings: int = field(default=512)
    config_overrides: Optional[str] = field(default=None, metadata={
        "help": 'config fields of a model trained from scratch beyond these arguments, as transformers\' '
                'examples take them: "name=value,name=value" (e.g. "scale_embedding=true,rule=momentum")'})

    def config_fields(self, tokenizer) -> dict:
        """MomentumTransformerConfig fields of these arguments and the tokenizer's vocabulary and
        special ids (every dropout is `dropout`)."""
        return dict(vocab_size=len(tokenizer), hidden_size=self.hidden_size,
                    num_attention_heads=self.num_attention_heads, intermediate_size=self.intermediate_size,
                    attention_momentum=self.attention_momentum, attention_step_size=self.attention_step_size,
                    connection=self.connection, layer_norm=self.layer_norm, embedding_dropout=self.dropout,
                    attention_dropout=self.dropout, hidden_dropout=self.dropout,
                    max_position_embeddings=self.max_position_embeddings, pad_token_id=tokenizer.pad_token_id,
                    bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)


def from_scratch(config_class, fields: dict, overrides: Optional[str]):
    """The config of a model trained from scratch: `fields` with --config_overrides applied."""
    return config_class(**with_overrides(config_class, fields, overrides))


def train_and_save(trainer, training) -> None:
    """Train (resuming where `--resume_from_checkpoint` says), then save the model and tokenizer,
    the training metrics and the trainer's state into the output folder."""
    result = trainer.train(resume_from_checkpoint=training.resume_from_checkpoint)
    trainer.save_model()
    record(trainer, "train", result.metrics)
    trainer.save_state()


def end_ranks(trainer) -> None:
    """The end of a run that finished normally: every rank waits for the others, then the process
    group is destroyed, as torch.distributed asks before exit, and released at exit after the
    Trainer's DDP wrapper (recipes/common/process_group.py says why). A single process has no
    group, and nothing is done."""
    end_process_group(trainer.accelerator)


def record(trainer, split: str, metrics: dict) -> None:
    """Log `metrics` and save them as `<split>_results.json` in the output folder."""
    trainer.log_metrics(split, metrics)
    trainer.save_metrics(split, metrics)
