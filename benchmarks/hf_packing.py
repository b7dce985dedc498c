"""Packed vs padded training of the native momentum_transformer with transformers' collators:
the same documents in the same batches, as one packed row (`DataCollatorWithFlattening`,
padding-free) or as a right-padded batch (`DataCollatorForLanguageModeling`, labels -100 at
padding); each layout in a fresh process, in one run.

Documents are the paragraphs of Jane Austen's six novels (the recipes' corpus, Debian's
r-cran-janeaustenr, fetched once into --cache-dir), as UTF-8 bytes (ByT5Tokenizer) with an
end-of-sequence token, cut into pieces of at most --max-length: median 258 bytes, 5 % over 1215,
a realistic long tail. Batches of --batch-docs documents are drawn in a seeded random order, as a
Trainer would. Reported per layout: padding fraction, real (non-padding) tokens per second of
training steps (forward, backward, AdamW), and the peak memory the training steps add to the
built model and data (peak RSS on CPU, reset before the first step; allocated memory on CUDA).
Packing should win by about 1 / (1 − padding fraction). Both layouts train on the same targets,
so their per-step losses agree (printed as a check).

    python benchmarks/hf_packing.py                    # CPU, 1 thread
    python benchmarks/hf_packing.py --device cuda --batch-docs 64 --hidden-size 512
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def documents(cache: Path, max_length: int):
    """Token ids of every paragraph of the six novels (bytes + end-of-sequence), cut into pieces
    of at most max_length; one-token pieces (nothing to predict) are dropped."""
    from transformers import ByT5Tokenizer

    from recipes.common.corpora import austen_documents, paragraphs

    tokenizer = ByT5Tokenizer()
    pieces = []
    for _, _, lines in austen_documents(cache):
        for paragraph in paragraphs(lines):
            ids = tokenizer(paragraph)["input_ids"]
            pieces.extend(ids[i:i + max_length] for i in range(0, len(ids), max_length))
    return tokenizer, [p for p in pieces if len(p) > 1]


def rss_kib(field: str) -> int:
    """VmRSS (now) or VmHWM (peak since the process started or since reset_peak_rss)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def reset_peak_rss() -> None:
    """Linux: VmHWM := VmRSS, so the peak counts only what follows (not the data preparation)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def worker(layout: str, args) -> dict:
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        DataCollatorForLanguageModeling,
        DataCollatorWithFlattening,
    )

    import hf_momentum  # noqa: F401  (registers momentum_transformer)
    from benchmarks.timing import synchronize

    torch.set_num_threads(args.threads)
    tokenizer, docs = documents(args.cache_dir, args.max_length)
    order = list(range(len(docs)))
    random.Random(args.seed).shuffle(order)
    batches = [[{"input_ids": docs[i]} for i in order[b * args.batch_docs:(b + 1) * args.batch_docs]]
               for b in range(args.steps + 1)]
    if layout == "packed":
        collate = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    else:
        collate = DataCollatorForLanguageModeling(tokenizer, mlm=False, return_tensors="pt")
    device = torch.device(args.device)
    batches = [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in collate(b).items()}
               for b in batches]
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "momentum_transformer", vocab_size=len(tokenizer), hidden_size=args.hidden_size,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, intermediate_size=4 * args.hidden_size,
        max_position_embeddings=args.max_length, hidden_dropout=0.0, attention_dropout=0.0,
        embedding_dropout=0.0, pad_token_id=tokenizer.pad_token_id, use_cache=False)
    model = AutoModelForCausalLM.from_config(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(batch):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        reset_peak_rss()
        base = rss_kib("VmRSS") * 1024
    losses = [step(batches[0])]                      # warm-up (untimed): allocator growth, optimizer state
    synchronize(args.device)
    start = time.perf_counter()
    losses += [step(b) for b in batches[1:]]
    synchronize(args.device)
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() if cuda else rss_kib("VmHWM") * 1024) - base
    real = sum(int(b["input_ids"].numel() if layout == "packed" else b["attention_mask"].sum())
               for b in batches[1:])
    slots = sum(b["input_ids"].numel() for b in batches[1:])
    return dict(layout=layout, seconds=seconds, real_tokens=real, slots=slots, padding=1 - real / slots,
                tokens_per_s=real / seconds, peak_mib=peak / 2 ** 20, losses=losses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-docs", type=int, default=16, help="documents per batch")
    parser.add_argument("--steps", type=int, default=8, help="timed training steps (after one warm-up)")
    parser.add_argument("--max-length", type=int, default=1024, help="longest document (longer ones are cut)")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "momentum_plugins")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return
    print(f"momentum_transformer training (hidden {args.hidden_size}, {args.layers} layers, {args.heads} "
          f"heads), Austen paragraphs ≤ {args.max_length} bytes, {args.batch_docs} documents per batch, "
          f"{args.steps} timed steps, {args.device}, {args.threads} thread(s); peak = memory the training "
          "steps add (peak RSS on CPU)")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    rows = {}
    for layout in ("padded", "packed"):
        done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--worker", layout],
                              capture_output=True, text=True, env=env, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"{layout} worker failed:\n{done.stderr[-3000:]}")
        rows[layout] = json.loads(done.stdout.strip().splitlines()[-1])
    pad, packed = rows["padded"], rows["packed"]
    print("| layout | padding fraction | real tokens/s | peak MiB | time s |")
    print("|---|---|---|---|---|")
    for row in (pad, packed):
        print(f"| {row['layout']} | {row['padding']:.3f} | {row['tokens_per_s']:.0f} | "
              f"{row['peak_mib']:.0f} | {row['seconds']:.1f} |")
    loss_gap = max(abs(a - b) for a, b in zip(pad["losses"], packed["losses"]))
    print(f"packed / padded real tokens/s: {packed['tokens_per_s'] / pad['tokens_per_s']:.2f}× "
          f"(1 / (1 − padding fraction) = {1 / (1 - pad['padding']):.2f}×); peak memory packed / padded: "
          f"{packed['peak_mib'] / max(pad['peak_mib'], 1e-9):.2f}; max |loss padded − loss packed| over "
          f"{len(pad['losses'])} steps: {loss_gap:.1e}")


if __name__ == "__main__":
    main()
