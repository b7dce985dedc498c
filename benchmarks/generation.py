"""Generation speed and memory: MomentumTransformerForCausalLM (recurrent state of eq. 12)
against the same-size softmax model (GPT-2 layout, SDPA, its growing KV cache).

For each model and context length N a fresh worker process builds the model (fixed seed,
random weights), runs `generate()` `--repeats` times on a random N-token prompt for
`--new_tokens` greedy tokens and records, through a streamer, the wall time of every generated
token. Reported: decode tokens/s of the fastest repeat (prefill excluded), the smallest median
per-token latency, bytes held by the cache after generation, and the worker's peak RSS.
A second table times one cached forward step per token at every context for both models in a
single process, interleaved round-robin `--latency_repeats` times, keeping each cell's minimum:
on a shared machine this gives the latency-vs-position ratios that separate runs cannot.
Workers use `--threads` torch threads (default 1).

    python benchmarks/generation.py                       # full table, 64 … 8192
    python benchmarks/generation.py --contexts 64 256 --new_tokens 8   # quick look
"""
import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer

from hf_momentum.modeling_common import CACHE_NAME

MODELS = ("momentum", "softmax")


class TokenClock(BaseStreamer):
    """Wall-clock time of each `put` (the prompt first, then every new token)."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def build(kind: str, args):
    import hf_momentum  # noqa: F401  (registers model_type "momentum_transformer")
    torch.manual_seed(0)
    positions = max(args.contexts) + args.new_tokens + 8
    if kind == "momentum":
        config = AutoConfig.for_model(
            "momentum_transformer", vocab_size=args.vocab, hidden_size=args.hidden,
            num_hidden_layers=args.layers, num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
            max_position_embeddings=positions, hidden_dropout=0.0, attention_momentum=0.6,
            connection="adaptive")
        return AutoModelForCausalLM.from_config(config).eval()
    config = AutoConfig.for_model("gpt2", vocab_size=args.vocab, n_embd=args.hidden, n_layer=args.layers,
                                  n_head=args.heads, n_inner=4 * args.hidden, n_positions=positions,
                                  bos_token_id=0, eos_token_id=0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def cache_bytes(cache) -> int:
    total = 0
    for layer in cache.layers:
        tensors = [getattr(layer, "keys", None), getattr(layer, "values", None)]
        tensors += list(getattr(layer, "recurrent_states", {}).values())
        total += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    return total


def worker(kind: str, context: int, args) -> dict:
    torch.set_num_threads(args.threads)
    model = build(kind, args)
    prompt = torch.randint(1, args.vocab, (1, context), generator=torch.Generator().manual_seed(context))
    runs = []
    with torch.no_grad():
        model.generate(prompt[:, :16], max_new_tokens=4, do_sample=False, pad_token_id=0)
        for _ in range(args.repeats):
            clock = TokenClock()
            out = model.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 do_sample=False, pad_token_id=0, streamer=clock,
                                 return_dict_in_generate=True)
            runs.append([b - a for a, b in zip(clock.times[1:], clock.times[2:])])
    steps = min(runs, key=sum)
    return {"model": kind, "context": context, "tokens_per_s": len(steps) / sum(steps),
            "median_ms": 1000 * min(statistics.median(r) for r in runs),
            "cache_mb": cache_bytes(getattr(out, CACHE_NAME)) / 2**20,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6}


def latency_worker(args) -> list:
    """Per-token forward latency with a cache at each context, both models, interleaved so that
    load from other processes hits every cell alike; the minimum over `--latency_repeats`."""
    torch.set_num_threads(args.threads)
    from transformers import DynamicCache

    from hf_momentum import MomentumCache
    models = {kind: build(kind, args) for kind in args.models}
    caches, token = {}, torch.ones(1, 1, dtype=torch.long)
    with torch.no_grad():
        for kind, model in models.items():
            for n in args.contexts:
                prompt = torch.randint(1, args.vocab, (1, n), generator=torch.Generator().manual_seed(n))
                cache = (MomentumCache(model.config) if kind == "momentum"
                         else DynamicCache(config=model.config))
                model(input_ids=prompt, **{CACHE_NAME: cache}, use_cache=True)
                caches[kind, n] = cache
        best = {key: float("inf") for key in caches}
        for _ in range(args.latency_repeats):
            for (kind, n), cache in caches.items():
                start = time.perf_counter()
                models[kind](input_ids=token, **{CACHE_NAME: cache}, use_cache=True)
                best[kind, n] = min(best[kind, n], time.perf_counter() - start)
    return [{"model": kind, "context": n, "min_ms": 1000 * t} for (kind, n), t in best.items()]


def latency_table(rows, reference_context):
    by = {(r["model"], r["context"]): r["min_ms"] for r in rows}
    lines = [f"| context | momentum ms/token (× at {reference_context}) | softmax ms/token (× at "
             f"{reference_context}) | softmax / momentum |", "|---:|---:|---:|---:|"]
    for n in sorted({r["context"] for r in rows}):
        m, s = by[("momentum", n)], by[("softmax", n)]
        lines.append(f"| {n} | {m:.2f} ({m / by[('momentum', reference_context)]:.2f}×) | "
                     f"{s:.2f} ({s / by[('softmax', reference_context)]:.2f}×) | {s / m:.2f}× |")
    return "\n".join(lines)


def table(rows, reference_context):
    by = {(r["model"], r["context"]): r for r in rows}
    contexts = sorted({r["context"] for r in rows})
    lines = ["| context | momentum tok/s | softmax tok/s | speed-up | momentum ms/token (× at "
             f"{reference_context}) | softmax ms/token (× at {reference_context}) | momentum cache MB | "
             "softmax cache MB | momentum peak RSS MB | softmax peak RSS MB |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in contexts:
        m, s = by.get(("momentum", n)), by.get(("softmax", n))
        if m is None or s is None:
            continue
        rel = lambda r: r["median_ms"] / by[(r["model"], reference_context)]["median_ms"] \
            if (r["model"], reference_context) in by else float("nan")
        lines.append(f"| {n} | {m['tokens_per_s']:.1f} | {s['tokens_per_s']:.1f} | "
                     f"{m['tokens_per_s'] / s['tokens_per_s']:.2f}× | {m['median_ms']:.2f} ({rel(m):.2f}×) | "
                     f"{s['median_ms']:.2f} ({rel(s):.2f}×) | {m['cache_mb']:.3f} | {s['cache_mb']:.2f} | "
                     f"{m['peak_rss_mb']:.0f} | {s['peak_rss_mb']:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[64, 256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--new_tokens", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3, help="generate() calls per worker; the fastest is kept")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per worker (1 avoids stalls from oversubscribed shared cores)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--json", help="also write the raw rows here")
    p.add_argument("--latency_repeats", type=int, default=30)
    p.add_argument("--skip_generate", action="store_true", help="only the interleaved latency table")
    p.add_argument("--latency_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker", nargs=2, metavar=("MODEL", "CONTEXT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args)))
        return
    if args.latency_worker:
        print(json.dumps(latency_worker(args)))
        return
    rows = []
    passthrough = ["--new_tokens", str(args.new_tokens), "--hidden", str(args.hidden), "--layers",
                   str(args.layers), "--heads", str(args.heads), "--vocab", str(args.vocab),
                   "--repeats", str(args.repeats), "--threads", str(args.threads),
                   "--latency_repeats", str(args.latency_repeats), "--contexts", *map(str, args.contexts)]
    if not args.skip_generate:
        for context in args.contexts:
            for kind in args.models:
                proc = subprocess.run(
                    [sys.executable, __file__, "--worker", kind, str(context), *passthrough],
                    capture_output=True, text=True, check=True)
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), file=sys.stderr)
        print(table(rows, min(args.contexts)))
    proc = subprocess.run([sys.executable, __file__, "--latency_worker", *passthrough],
                          capture_output=True, text=True, check=True)
    latency = json.loads(proc.stdout.strip().splitlines()[-1])
    print()
    print(latency_table(latency, min(args.contexts)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"generate": rows, "latency": latency}, f, indent=1)


if __name__ == "__main__":
    main()
