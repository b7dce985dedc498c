"""Pretrain or continue pretraining a bidirectional momentum transformer as a masked LM
(MomentumTransformerForMaskedLM, eq. 14) with transformers' Trainer and
DataCollatorForLanguageModeling, as transformers' examples/pytorch/language-modeling/run_mlm.py does
for its models, and report the evaluation loss and perplexity.

Data: `--train_file` / `--validation_file`, plain text; or, without them, `--corpus austen` (the
offline Jane Austen novels the demo uses, prepared on first use), `shakespeare` or `ptb`
(downloaded). Lines are tokenized, wrapped in `<s> ... </s>` and cut at `--max_seq_length`
(`--line_by_line`), or concatenated and cut into blocks of that length (the default, RoBERTa's
FULL-SENTENCES packing). A byte-level BPE tokenizer with `<mask>` (RoBERTa's scheme,
`--vocab_size` pieces) is trained on the training text unless `--tokenizer PATH` names a saved
one; `--model_name_or_path DIR` continues from a saved masked LM and its tokenizer instead, e.g.
a fairseq `momentum_roberta` converted by `python -m fairseq_momentum.convert_to_hf`. The model and
tokenizer are saved together, so `pipeline("fill-mask", model=OUTPUT)` loads both (`import
hf_momentum` first, or `trust_remote_code=True`).

Every TrainingArguments option applies (`--per_device_train_batch_size`, `--bf16`,
`--gradient_accumulation_steps`, `--save_steps` and `--resume_from_checkpoint`, `--push_to_hub`,
`--report_to`, ...). Several processes: `torchrun --nproc_per_node N` or `accelerate launch` (on CPU:
`--ddp_backend gloo`).

    python recipes/hf/run_mlm.py --output_dir runs/mlm --do_train --do_eval \\
        --num_train_epochs 3 --per_device_train_batch_size 32
"""
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from transformers import (
    AutoModelForMaskedLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
    set_seed,
)

from hf_momentum import MomentumTransformerConfig, MomentumTransformerForMaskedLM
from recipes.common.hf_trainer import MomentumArguments, end_ranks, from_scratch, record, train_and_save

SPECIAL = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
           "mask_token": "<mask>"}


@dataclass
class ModelArguments(MomentumArguments):
    model_name_or_path: Optional[str] = field(default=None, metadata={
        "help": "a saved masked LM (and its tokenizer) to continue from; the size arguments are then unused"})
    num_layers: int = field(default=4)


@dataclass
class DataArguments:
    train_file: Optional[Path] = field(default=None, metadata={"help": "plain text"})
    validation_file: Optional[Path] = field(default=None)
    corpus: str = field(default="austen", metadata={
        "help": "without --train_file: austen (offline), shakespeare (offline) or ptb (downloaded)"})
    cache_dir: Path = field(default=Path.home() / ".cache" / "momentum_plugins")
    tokenizer: Optional[Path] = field(default=None, metadata={"help": "a saved tokenizer to use instead of "
                                                                      "training one"})
    vocab_size: int = field(default=8000)
    max_seq_length: int = field(default=128, metadata={"help": "tokens per example, <s> and </s> included"})
    line_by_line: bool = field(default=False, metadata={"help": "one example per non-empty line, instead "
                                                                "of blocks of the concatenated text"})
    mlm_probability: float = field(default=0.15, metadata={"help": "share of tokens the collator masks"})
    max_train_lines: int = field(default=0, metadata={"help": "keep the first N training lines (0: all)"})


def corpus_lines(data: DataArguments, output_dir: Path) -> dict:
    """{"train"|"validation": non-empty lines} of the text files, or of `--corpus`."""
    if data.train_file is not None:
        files = {"train": data.train_file, "validation": data.validation_file}
    else:
        from recipes.common.corpora import lm_corpus
        _, paths = lm_corpus(data.corpus, data.cache_dir, output_dir / "corpus")
        files = {"train": paths["train"], "validation": paths["valid"]}
    lines = {split: [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
             for split, path in files.items() if path is not None}
    if data.max_train_lines:
        lines["train"] = lines["train"][:data.max_train_lines]
    return lines


def train_tokenizer(lines: list, vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (RoBERTa's scheme: no unknown bytes) trained on `lines`; it wraps a
    text in `<s> ... </s>` and knows `<mask>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(lines, trainer=trainer)
    bos, eos = SPECIAL["bos_token"], SPECIAL["eos_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, tokenizer.token_to_id(bos)), (eos, tokenizer.token_to_id(eos))])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL)


def build_model(args: ModelArguments, tokenizer) -> MomentumTransformerForMaskedLM:
    fields = dict(**args.config_fields(tokenizer), num_hidden_layers=args.num_layers, is_causal=False)
    config = from_scratch(MomentumTransformerConfig, fields, args.config_overrides)
    return MomentumTransformerForMaskedLM(config)


def examples(lines: list, tokenizer, data: DataArguments) -> list:
    """Trainer features: each line wrapped and cut (`--line_by_line`), or blocks of
    `--max_seq_length` ids of the concatenated lines, each its own `<s> ... </s>` (the last,
    shorter block dropped, as run_mlm's group_texts does)."""
    if data.line_by_line:
        encoded = tokenizer(lines, max_length=data.max_seq_length, truncation=True)
        return [{"input_ids": ids} for ids in encoded["input_ids"]]
    ids = [token for row in tokenizer(lines, add_special_tokens=False)["input_ids"] for token in row]
    width = data.max_seq_length - 2
    return [{"input_ids": [tokenizer.bos_token_id, *ids[start:start + width], tokenizer.eos_token_id]}
            for start in range(0, len(ids) - width + 1, width)]


def main(argv=None):
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data, training = parser.parse_args_into_dataclasses(args=argv)
    if not 0 < data.mlm_probability < 1:
        parser.error(f"--mlm_probability must be in (0, 1), got {data.mlm_probability}")
    if model_args.config_overrides and model_args.model_name_or_path:
        parser.error("--config_overrides sets the config of a model trained from scratch, not of "
                     "--model_name_or_path")
    if data.max_seq_length < 3:
        parser.error(f"--max_seq_length must be at least 3 (<s>, a token, </s>), got {data.max_seq_length}")
    set_seed(training.seed)
    lines = corpus_lines(data, Path(training.output_dir))
    if model_args.model_name_or_path:
        tokenizer = AutoTokenizer.from_pretrained(data.tokenizer or model_args.model_name_or_path,
                                                  trust_remote_code=True)
        model = AutoModelForMaskedLM.from_pretrained(model_args.model_name_or_path, trust_remote_code=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(data.tokenizer) if data.tokenizer else \
            train_tokenizer(lines["train"], data.vocab_size)
        try:
            model = build_model(model_args, tokenizer)
        except ValueError as error:      # a config field out of its range, or a bad --config_overrides
            parser.error(str(error))
    if tokenizer.mask_token is None:
        parser.error("the tokenizer has no mask token; a masked LM needs one (e.g. <mask>)")
    if data.max_seq_length > model.config.max_position_embeddings:
        parser.error(f"--max_seq_length {data.max_seq_length} exceeds the model's max_position_embeddings "
                     f"{model.config.max_position_embeddings}")
    trainer = Trainer(
        model=model, args=training, processing_class=tokenizer,
        train_dataset=examples(lines["train"], tokenizer, data) if training.do_train else None,
        eval_dataset=examples(lines["validation"], tokenizer, data) if "validation" in lines else None,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=data.mlm_probability,
                                                      pad_to_multiple_of=8, seed=training.seed))
    if training.do_train:
        train_and_save(trainer, training)
    if training.do_eval and "validation" in lines:
        metrics = trainer.evaluate()
        metrics["perplexity"] = math.exp(min(metrics["eval_loss"], 700.0))
        record(trainer, "eval", metrics)
    end_ranks(trainer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
