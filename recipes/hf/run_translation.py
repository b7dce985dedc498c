"""Train the encoder-decoder momentum transformer (MomentumSeq2SeqForConditionalGeneration) or,
with `--model_type momentum_lstm_seq2seq`, the attentional MomentumLSTM encoder-decoder
(MomentumLSTMSeq2SeqForConditionalGeneration: `--cell`, `--momentum`, `--step_size`,
`--encoder_bidirectional`) for translation with transformers' Seq2SeqTrainer, as transformers'
examples/pytorch/translation does for its models, and report sacreBLEU of its beam-search
translations. `--model_name_or_path DIR` fine-tunes a saved model instead (one this script saved, or
one `python -m fairseq_momentum.convert_to_hf` converted, with the tokenizer saved beside it).

Data: `--train_file` / `--validation_file` / `--test_file`, each a TSV of `source<TAB>target`
lines; or, without them, `--corpus bible` (the offline English→Spanish verse pairs that
recipes/iwslt uses, prepared on first use) or `--corpus iwslt14` (downloaded). A sentencepiece-style
BPE tokenizer (`tokenizers`, `--vocab_size` pieces, one vocabulary for both languages, a source
ending in `</s>`) is trained on the training pairs unless `--tokenizer PATH` names a saved one;
it is saved with the model, so `AutoTokenizer` / `AutoModelForSeq2SeqLM.from_pretrained(OUTPUT)`
load both (`import hf_momentum` first, or `trust_remote_code=True` for the model). Targets are
encoded with `text_target=`, so a tokenizer of two vocabularies (a converted fairseq model's, which
loads with `--trust_remote_code`) gives labels in the target's.

Every Seq2SeqTrainingArguments option applies (`--per_device_train_batch_size`, `--bf16`,
`--gradient_accumulation_steps`, `--save_steps` and `--resume_from_checkpoint`, `--push_to_hub`,
`--report_to`, ...): with `--predict_with_generate`, evaluation translates with
`--generation_num_beams` beams and reports `bleu`. Several processes: `torchrun --nproc_per_node N`
or `accelerate launch` (on CPU: `--ddp_backend gloo`).

    python recipes/hf/run_translation.py --output_dir runs/mt --do_train --do_eval \\
        --predict_with_generate --num_train_epochs 10 --per_device_train_batch_size 32
"""
import csv
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    PreTrainedTokenizerFast,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)

from hf_momentum import (
    MomentumLSTMSeq2SeqConfig,
    MomentumLSTMSeq2SeqForConditionalGeneration,
    MomentumSeq2SeqConfig,
    MomentumSeq2SeqForConditionalGeneration,
)
from recipes.common.hf_trainer import MomentumArguments, end_ranks, from_scratch, record, train_and_save

SPECIAL = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}


@dataclass
class ModelArguments(MomentumArguments):
    encoder_layers: int = field(default=3)
    decoder_layers: int = field(default=3)
    cross_attention: str = field(default="momentum", metadata={"help": "momentum | linear | softmax"})
    model_type: str = field(default="momentum_seq2seq",
                            metadata={"help": "momentum_seq2seq | momentum_lstm_seq2seq"})
    model_name_or_path: Optional[str] = field(default=None, metadata={
        "help": "a saved model (folder or Hub id) to fine-tune instead of one trained from scratch; its "
                "tokenizer is used unless --tokenizer names another"})
    cell: str = field(default="momentum", metadata={
        "help": "momentum_lstm_seq2seq: the cell (lstm or a momentum cell of docs/cells.md)"})
    momentum: Optional[float] = field(default=None, metadata={
        "help": "momentum_lstm_seq2seq: the cell's momentum mu (default: the config's, 0.6)"})
    step_size: Optional[float] = field(default=None, metadata={
        "help": "momentum_lstm_seq2seq: the cell's step size s (default: the config's, 1.0)"})
    encoder_bidirectional: bool = field(default=True, metadata={
        "help": "momentum_lstm_seq2seq: the encoder reads both directions"})
    trust_remote_code: bool = field(default=False, metadata={
        "help": "run the code saved with --model_name_or_path's tokenizer (a converted fairseq model's)"})


@dataclass
class DataArguments:
    train_file: Optional[Path] = field(default=None, metadata={"help": "TSV: source<TAB>target per line"})
    validation_file: Optional[Path] = field(default=None)
    test_file: Optional[Path] = field(default=None)
    corpus: str = field(default="bible",
                        metadata={"help": "without --train_file: bible (offline) or iwslt14"})
    cache_dir: Path = field(default=Path.home() / ".cache" / "momentum_plugins")
    tokenizer: Optional[Path] = field(default=None, metadata={"help": "a saved tokenizer to use instead of "
                                                                      "training one"})
    vocab_size: int = field(default=8000)
    max_source_length: int = field(default=256)
    max_target_length: int = field(default=256)
    max_train_pairs: int = field(default=0, metadata={"help": "keep the first N training pairs (0: all)"})
    max_eval_pairs: int = field(default=0, metadata={"help": "keep the first N evaluation pairs (0: all)"})


def read_tsv(path: Path, limit: int = 0) -> list:
    """(source, target) pairs of a TSV file; a line without exactly one tab is refused by number."""
    pairs = []
    with open(path, encoding="utf-8", newline="") as handle:
        for number, row in enumerate(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
            if len(row) != 2:
                raise ValueError(f"{path}:{number}: expected source<TAB>target, got {len(row)} fields")
            pairs.append((row[0], row[1]))
    return pairs[:limit] if limit else pairs


def corpus_pairs(data: DataArguments, output_dir: Path) -> dict:
    """{"train"|"validation"|"test": pairs} from the TSV files, or from `--corpus`."""
    if data.train_file is not None:
        files = {"train": data.train_file, "validation": data.validation_file, "test": data.test_file}
        return {split: read_tsv(path) for split, path in files.items() if path is not None}
    from recipes.common.parallel import parallel_corpus
    _, src, tgt, prefixes = parallel_corpus(data.corpus, data.cache_dir, output_dir / "corpus")
    names = {"train": "train", "validation": "valid", "test": "test"}
    pairs = {}
    for split, name in names.items():
        sources = Path(f"{prefixes[name]}.{src}").read_text(encoding="utf-8").splitlines()
        targets = Path(f"{prefixes[name]}.{tgt}").read_text(encoding="utf-8").splitlines()
        pairs[split] = list(zip(sources, targets))
    return pairs


def train_tokenizer(pairs: list, vocab_size: int) -> PreTrainedTokenizerFast:
    """A BPE tokenizer over `▁`-marked words (sentencepiece's scheme) trained on both sides of
    `pairs`; it ends every text with `</s>`, as fairseq does a source."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL.values()))
    tokenizer.train_from_iterator((text for pair in pairs for text in pair), trainer=trainer)
    eos = SPECIAL["eos_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, tokenizer.token_to_id(eos))])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL)


MODEL_TYPES = ("momentum_seq2seq", "momentum_lstm_seq2seq")


def build_model(args: ModelArguments, tokenizer):
    """The saved model `--model_name_or_path`, or a model of `--model_type` trained from scratch with
    the tokenizer's vocabulary."""
    if args.model_name_or_path:
        from transformers import AutoModelForSeq2SeqLM
        return AutoModelForSeq2SeqLM.from_pretrained(args.model_name_or_path,
                                                     trust_remote_code=args.trust_remote_code)
    if args.model_type not in MODEL_TYPES:
        raise ValueError(f"--model_type {args.model_type!r}: one of {', '.join(MODEL_TYPES)}")
    if args.model_type == "momentum_lstm_seq2seq":
        return MomentumLSTMSeq2SeqForConditionalGeneration(from_scratch(
            MomentumLSTMSeq2SeqConfig, lstm_fields(args, tokenizer), args.config_overrides))
    return MomentumSeq2SeqForConditionalGeneration(from_scratch(MomentumSeq2SeqConfig, dict(
        **args.config_fields(tokenizer), num_hidden_layers=args.decoder_layers,
        encoder_layers=args.encoder_layers, cross_attention=args.cross_attention, scale_embedding=True,
        decoder_start_token_id=tokenizer.eos_token_id), args.config_overrides))


def lstm_fields(args: ModelArguments, tokenizer) -> dict:
    """MomentumLSTMSeq2SeqConfig fields: every width `--hidden_size`, one embedding matrix (one
    vocabulary), every dropout `--dropout`; the config refuses a hyperparameter the cell never reads."""
    if args.encoder_layers != args.decoder_layers:
        raise ValueError(f"--encoder_layers {args.encoder_layers} differs from --decoder_layers "
                         f"{args.decoder_layers}: the LSTM decoder starts from the encoder's final states, "
                         "layer by layer, so both stacks have one depth")
    hyper = {name: getattr(args, name) for name in ("momentum", "step_size")
             if getattr(args, name) is not None}
    dropouts = {f"{side}_dropout_{at}": args.dropout for side in ("encoder", "decoder")
                for at in ("in", "out")}
    width = args.hidden_size
    return dict(vocab_size=len(tokenizer), encoder_embedding_size=width, encoder_hidden_size=width,
                encoder_bidirectional=args.encoder_bidirectional, decoder_embedding_size=width,
                hidden_size=width,
                num_hidden_layers=args.decoder_layers, cell=args.cell, **hyper, **dropouts,
                tie_word_embeddings=True, share_encoder_decoder_embeddings=True,
                pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.eos_token_id)


def encode(pairs: list, tokenizer, data: DataArguments) -> list:
    """Trainer features: the source's ids and mask, the target's ids as labels (with `</s>`)."""
    sources = tokenizer([s for s, _ in pairs], max_length=data.max_source_length, truncation=True)
    targets = tokenizer(text_target=[t for _, t in pairs], max_length=data.max_target_length, truncation=True)
    return [{"input_ids": ids, "attention_mask": mask, "labels": labels}
            for ids, mask, labels in zip(sources["input_ids"], sources["attention_mask"],
                                         targets["input_ids"])]


def bleu_metric(tokenizer):
    """compute_metrics for predict_with_generate: sacreBLEU of the decoded translations."""
    import sacrebleu

    def compute(prediction):
        predictions, labels = prediction.predictions, prediction.label_ids
        predictions = np.where(predictions < 0, tokenizer.pad_token_id, predictions)
        labels = np.where(labels < 0, tokenizer.pad_token_id, labels)
        hypotheses = tokenizer.batch_decode(predictions, skip_special_tokens=True)
        references = tokenizer.batch_decode(labels, skip_special_tokens=True)
        return {"bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score}

    return compute


def main(argv=None):
    parser = HfArgumentParser((ModelArguments, DataArguments, Seq2SeqTrainingArguments))
    model_args, data, training = parser.parse_args_into_dataclasses(args=argv)
    set_seed(training.seed)
    output_dir = Path(training.output_dir)
    pairs = corpus_pairs(data, output_dir)
    if data.max_train_pairs:
        pairs["train"] = pairs["train"][:data.max_train_pairs]
    if data.max_eval_pairs:
        pairs = {split: rows if split == "train" else rows[:data.max_eval_pairs]
                 for split, rows in pairs.items()}
    saved = data.tokenizer or model_args.model_name_or_path
    remote = model_args.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(saved, trust_remote_code=remote) if saved else \
        train_tokenizer(pairs["train"], data.vocab_size)
    try:
        model = build_model(model_args, tokenizer)
    except ValueError as error:      # a config field out of its range, or a bad --config_overrides
        parser.error(str(error))
    trainer = Seq2SeqTrainer(
        model=model, args=training, processing_class=tokenizer,
        train_dataset=encode(pairs["train"], tokenizer, data) if training.do_train else None,
        eval_dataset=encode(pairs["validation"], tokenizer, data) if "validation" in pairs else None,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, pad_to_multiple_of=8),
        compute_metrics=bleu_metric(tokenizer) if training.predict_with_generate else None)
    if training.do_train:
        train_and_save(trainer, training)
    generation = dict(max_new_tokens=data.max_target_length, num_beams=training.generation_num_beams)
    if training.do_eval and "validation" in pairs:
        record(trainer, "eval", trainer.evaluate(metric_key_prefix="eval", **generation))
    if training.do_predict and "test" in pairs:
        result = trainer.predict(encode(pairs["test"], tokenizer, data), metric_key_prefix="test",
                                 **generation)
        record(trainer, "test", result.metrics)
    end_ranks(trainer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
