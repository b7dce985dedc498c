"""Train a causal LM with momentum attention on plain-text files, with accelerate.

The model is a native MomentumTransformerForCausalLM (default) or any stock transformers causal
LM built from its config with `attn_implementation="momentum"` / `"linear_attention"`
(`--model_type llama`). Text is tokenized to UTF-8 bytes (no download) or with a local
tokenizer (`--tokenizer PATH`), concatenated and cut into blocks of `--block_size` tokens.

Single process:   python recipes/hf/train_clm.py --train_file a.txt --output_dir out
Several processes (CPU ranks shown; on GPUs drop ACCELERATE_USE_CPU):
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
        --mixed_precision no --dynamo_backend no recipes/hf/train_clm.py --train_file a.txt ...

Features: gradient accumulation, `--mixed_precision {no,fp16,bf16}`, checkpoints every
`--checkpointing_steps` steps (`accelerator.save_state`) and `--resume_from_checkpoint
{PATH,latest}`, tqdm progress on the main process, evaluation perplexity (losses gathered
over ranks), final `save_pretrained` and optional `--push_to_hub --hub_model_id user/name`.
`--record_dir` writes per-rank JSON (batch fingerprints, final parameter digest) for tests.
"""
import argparse
import hashlib
import json
import math
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, get_scheduler

import hf_momentum

BYTE_SPECIALS = {"pad": 256, "bos": 257, "eos": 258}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train_file", nargs="+", required=True)
    p.add_argument("--validation_file", nargs="*", default=None,
                   help="default: the last --validation_split of the training tokens")
    p.add_argument("--validation_split", type=float, default=0.05)
    p.add_argument("--tokenizer", default="bytes", help='"bytes" or a local tokenizer path')
    p.add_argument("--model_type", default="momentum_transformer",
                   help="momentum_transformer or a stock causal-LM model_type (llama, gpt2, ...)")
    p.add_argument("--attn_implementation", default="momentum", choices=["momentum", "linear_attention"],
                   help="for stock model types")
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument("--num_layers", type=int, default=4)
    p.add_argument("--num_heads", type=int, default=4)
    p.add_argument("--attention_momentum", type=float, default=0.6)
    p.add_argument("--attention_step_size", type=float, default=1.0)
    p.add_argument("--connection", default="none", choices=["none", "momentum", "adaptive"])
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--block_size", type=int, default=128)
    p.add_argument("--per_device_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--warmup_steps", type=int, default=0)
    p.add_argument("--num_epochs", type=int, default=1)
    p.add_argument("--max_train_steps", type=int, default=None, help="optimizer steps; overrides --num_epochs")
    p.add_argument("--mixed_precision", default=None, choices=["no", "fp16", "bf16"],
                   help="default: what accelerate launch was given")
    p.add_argument("--checkpointing_steps", type=int, default=None)
    p.add_argument("--resume_from_checkpoint", default=None, help='a checkpoint folder or "latest"')
    p.add_argument("--output_dir", required=True)
    p.add_argument("--push_to_hub", action="store_true")
    p.add_argument("--hub_model_id", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record_dir", default=None)
    return p.parse_args(argv)


class Tokenizer:
    """UTF-8 bytes plus pad/bos/eos, or a local transformers tokenizer."""

    def __init__(self, name: str):
        self.hf = None if name == "bytes" else AutoTokenizer.from_pretrained(name)
        if self.hf is None:
            self.vocab_size, self.pad, self.bos, self.eos = 259, *BYTE_SPECIALS.values()
        else:
            self.vocab_size, self.pad = len(self.hf), self.hf.pad_token_id
            self.bos, self.eos = self.hf.bos_token_id, self.hf.eos_token_id

    def encode(self, text: str):
        if self.hf is None:
            return list(text.encode("utf-8")) + [self.eos]
        return self.hf(text)["input_ids"] + ([self.eos] if self.eos is not None else [])


def blocks(files, tokenizer, block_size):
    ids = []
    for name in files:
        ids.extend(tokenizer.encode(Path(name).read_text(encoding="utf-8")))
    n = len(ids) // block_size
    if n == 0:
        raise ValueError(f"{files} hold {len(ids)} tokens, fewer than one block of {block_size}")
    return torch.tensor(ids[:n * block_size]).view(n, block_size)


def build_model(args, tokenizer):
    common = dict(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad, bos_token_id=tokenizer.bos,
                  eos_token_id=tokenizer.eos)
    if args.model_type == "momentum_transformer":
        config = AutoConfig.for_model(
            "momentum_transformer", hidden_size=args.hidden_size, num_hidden_layers=args.num_layers,
            num_attention_heads=args.num_heads, max_position_embeddings=args.block_size,
            attention_momentum=args.attention_momentum, attention_step_size=args.attention_step_size,
            connection=args.connection, hidden_dropout=args.dropout, **common)
        return AutoModelForCausalLM.from_config(config)
    sizes = {"hidden_size": args.hidden_size, "num_hidden_layers": args.num_layers,
             "num_attention_heads": args.num_heads, "num_key_value_heads": args.num_heads,
             "head_dim": args.hidden_size // args.num_heads, "intermediate_size": 4 * args.hidden_size,
             "max_position_embeddings": args.block_size}
    defaults = AutoConfig.for_model(args.model_type)
    config = AutoConfig.for_model(args.model_type, **common,
                                  **{k: v for k, v in sizes.items() if hasattr(defaults, k)})
    hf_momentum.set_momentum_attention(config, momentum=args.attention_momentum, step_size=args.attention_step_size)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=args.attn_implementation)
    hf_momentum.check_model(model)
    return model


def fingerprint(t: torch.Tensor) -> str:
    return hashlib.sha1(t.cpu().numpy().tobytes()).hexdigest()[:16]


def evaluate(model, loader, accelerator):
    model.eval()
    losses = []
    for batch in loader:
        with torch.no_grad():
            loss = model(input_ids=batch, labels=batch).loss
        losses.append(accelerator.gather_for_metrics(loss.detach().float().repeat(batch.shape[0])))
    model.train()
    loss = torch.cat(losses).mean().item()
    return loss, math.exp(min(loss, 50.0))


def main(argv=None):
    args = parse_args(argv)
    kwargs = {} if args.mixed_precision is None else {"mixed_precision": args.mixed_precision}
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, **kwargs)
    set_seed(args.seed)
    tokenizer = Tokenizer(args.tokenizer)
    data = blocks(args.train_file, tokenizer, args.block_size)
    if args.validation_file:
        valid = blocks(args.validation_file, tokenizer, args.block_size)
    else:
        n_valid = max(1, int(len(data) * args.validation_split))
        data, valid = data[:-n_valid], data[-n_valid:]
    train_loader = DataLoader(data, batch_size=args.per_device_batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed))
    valid_loader = DataLoader(valid, batch_size=args.per_device_batch_size)
    model = build_model(args, tokenizer)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.learning_rate)
    updates_per_epoch = math.ceil(math.ceil(len(train_loader) / accelerator.num_processes)
                                  / args.gradient_accumulation_steps)
    max_steps = args.max_train_steps or args.num_epochs * updates_per_epoch
    epochs = math.ceil(max_steps / updates_per_epoch)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=args.warmup_steps * accelerator.num_processes,
                              num_training_steps=max_steps * accelerator.num_processes)
    model, optimizer, train_loader, valid_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, valid_loader, scheduler)

    output = Path(args.output_dir)
    step, start_epoch, skip = 0, 0, 0
    if args.resume_from_checkpoint:
        path = Path(args.resume_from_checkpoint)
        if args.resume_from_checkpoint == "latest":
            found = sorted(output.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
            if not found:
                raise FileNotFoundError(f"no step_* checkpoint in {output}")
            path = found[-1]
        accelerator.load_state(str(path))
        step = int(path.name.split("_")[1])
        start_epoch, done = divmod(step * args.gradient_accumulation_steps, len(train_loader))
        skip = done
        accelerator.print(f"resumed from {path} at step {step}")

    record = {"rank": accelerator.process_index, "batches": []}
    progress = tqdm(total=max_steps, initial=step, disable=not accelerator.is_local_main_process, desc="train")
    model.train()
    for epoch in range(start_epoch, epochs):
        train_loader.set_epoch(epoch)
        loader = accelerator.skip_first_batches(train_loader, skip) if skip else train_loader
        skip = 0
        for batch in loader:
            record["batches"].append(fingerprint(batch))
            with accelerator.accumulate(model):
                loss = model(input_ids=batch, labels=batch).loss
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                step += 1
                progress.update(1)
                progress.set_postfix(loss=f"{loss.item():.3f}")
                if args.checkpointing_steps and step % args.checkpointing_steps == 0:
                    accelerator.save_state(str(output / f"step_{step}"))
                if step >= max_steps:
                    break
        if step >= max_steps:
            break
    progress.close()

    valid_loss, perplexity = evaluate(model, valid_loader, accelerator)
    accelerator.print(json.dumps({"step": step, "valid_loss": round(valid_loss, 4),
                                  "valid_perplexity": round(perplexity, 3)}))
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    if args.record_dir:
        flat = torch.cat([p.detach().float().flatten().cpu() for p in unwrapped.parameters()])
        record.update(step=step, params=fingerprint(flat), valid_loss=valid_loss)
        Path(args.record_dir).mkdir(parents=True, exist_ok=True)
        Path(args.record_dir, f"rank{accelerator.process_index}.json").write_text(json.dumps(record))
    unwrapped.save_pretrained(output / "final", is_main_process=accelerator.is_main_process,
                              save_function=accelerator.save)
    if args.push_to_hub and accelerator.is_main_process:
        if not args.hub_model_id:
            raise ValueError("--push_to_hub needs --hub_model_id")
        unwrapped.push_to_hub(args.hub_model_id)
    accelerator.end_training()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
