"""One decode step (one new token per row, with a cache) of MomentumTransformerForCausalLM, eager
with its MomentumCache and compiled whole with a StaticMomentumCache (torch.compile, fullgraph,
static shapes; mode="reduce-overhead", i.e. CUDA graphs, on a GPU), against Llama of the same
width eager with its DynamicCache and compiled with its StaticCache after 512 and 4096 context
tokens, and against the arithmetic floor of each step measured on this machine in the same run.

Every step and every floor probe below is timed `--rounds` × `--per_round` times, all of them
taking turns each round so that load from other processes falls on all alike (host clock on the
CPU, CUDA events on a GPU; benchmarks/timing.py); medians are reported, minima beside them. The
compiled steps are compiled and warmed up first, and the graphs compiled during the timed runs
are counted (0: one compilation served every step). The momentum step does not depend on the
context (its state has a fixed size), so it runs after a short prompt. Floors, per step:
  compute: the step's flops (every weight matrix once, 2 flops per multiply-add, plus attention:
           eq. 12's state update and read-out for momentum, q·K and p·V over the context for
           Llama) at the rate this device reached on the step's own matrix products, timed as
           two stacked matmuls (batch × d by d × all d-input weights, batch × ffn by ffn × all
           ffn-input weights);
  memory:  bytes the step must read and write (the weights once, the recurrent state read and
           written, or the KV cache read) at the bandwidth of one tensor copy of that size.
The floor is the larger; "× floor" is step time / floor.

    python benchmarks/decode_step.py                                   # the issue's size
    python benchmarks/decode_step.py --layers 2 --contexts 64 --batches 1   # quick look
    python benchmarks/decode_step.py --batches 1 --contexts 512 --host-trace   # where the host's time goes
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.host_trace import markdown, trace  # noqa: E402
from benchmarks.timing import synchronize, time_once_ms  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def momentum_model(args):
    from transformers import AutoConfig, AutoModelForCausalLM

    import hf_momentum  # noqa: F401  (registers model_type "momentum_transformer")
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "momentum_transformer", vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, intermediate_size=args.ffn, max_position_embeddings=args.prompt + 512,
        hidden_dropout=0.0, attention_momentum=0.6, connection=args.connection)
    return AutoModelForCausalLM.from_config(config).to(args.device, DTYPES[args.dtype]).eval()


def llama_model(args):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, max_position_embeddings=max(args.contexts) + 512,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    return model.to(args.device, DTYPES[args.dtype]).eval()


def compiled(model, device):
    mode = "reduce-overhead" if device.startswith("cuda") else None
    return torch.compile(model, fullgraph=True, dynamic=False, mode=mode)


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def prefill(model, prompt, cache, chunk: int):
    """The prompt into the cache in chunks (a static cache's explicit mask over the whole
    prompt would otherwise take batch × heads × context² floats)."""
    from hf_momentum.modeling_common import CACHE_NAME
    for start in range(0, prompt.shape[1], chunk):
        ids = prompt[:, start:start + chunk]
        position = torch.arange(start, start + ids.shape[1], device=prompt.device).expand(ids.shape[0], -1)
        model(input_ids=ids, position_ids=position, **{CACHE_NAME: cache}, use_cache=True)


def momentum_cases(model, args, batch: int):
    """(name, kind, context, one step) for the eager and the compiled momentum step."""
    from hf_momentum import MomentumCache, StaticMomentumCache
    from hf_momentum.modeling_common import CACHE_NAME
    prompt = torch.randint(1, args.vocab, (batch, args.prompt), device=args.device)
    token = prompt[:, -1:].clone()
    step = compiled(model, args.device)
    cases = []
    for kind, cache_class, run in (("eager", MomentumCache, model), ("compiled", StaticMomentumCache, step)):
        if kind not in args.kinds:
            continue
        cache = cache_class(model.config)
        model(input_ids=prompt, **{CACHE_NAME: cache}, use_cache=True)

        def one(run=run, cache=cache):
            run(input_ids=token, **{CACHE_NAME: cache}, use_cache=True)
        cases.append(("momentum", kind, None, one))
    return cases


def llama_cases(model, args, batch: int, context: int, steps: int):
    """The same for Llama after `context` tokens: DynamicCache eager, StaticCache compiled."""
    from transformers import DynamicCache, StaticCache

    from hf_momentum.modeling_common import CACHE_NAME
    prompt = torch.randint(1, args.vocab, (batch, context), device=args.device)
    token = prompt[:, -1:].clone()
    step = compiled(model, args.device)
    cases = []
    for kind in args.kinds:
        if kind == "eager":
            cache, run = DynamicCache(config=model.config), model
        else:
            cache, run = StaticCache(config=model.config, max_cache_len=context + steps + 8), step
        prefill(model, prompt, cache, args.prefill_chunk)
        position = torch.full((batch, 1), context, device=args.device)

        def one(run=run, cache=cache, position=position):
            run(input_ids=token, position_ids=position.clone(), **{CACHE_NAME: cache}, use_cache=True)
            position.add_(1)         # the next slot of the static cache; an eager op outside the graph
        cases.append(("llama", kind, context, one))
    return cases


def linear_weights(model):
    """(d-input, ffn-input) weight matrices of one step: every nn.Linear, the lm_head included."""
    by_input = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            by_input.setdefault(module.in_features, []).append(module.weight)
    return by_input


def matmul_probe(model, batch: int, args):
    """(flops, one call) of the step's matrix products stacked into one matmul per input width."""
    stacks = [(torch.randn(batch, width, device=args.device, dtype=DTYPES[args.dtype]),
               torch.cat([w.detach() for w in ws]).t().contiguous())
              for width, ws in linear_weights(model).items()]
    flops = sum(2 * batch * w.shape[0] * w.shape[1] for _, w in stacks)
    return flops, lambda: [x @ w for x, w in stacks]


def copy_probe(nbytes: int, args):
    """(bytes read plus written, one call) of one tensor copy of `nbytes`."""
    src = torch.empty(max(nbytes // 4, 1), device=args.device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4, lambda: dst.copy_(src)


def step_work(model, name: str, batch: int, context, args):
    """(flops, bytes) one decode step must do and move (module docstring)."""
    weights = linear_weights(model)
    linear = sum(2 * w.numel() for ws in weights.values() for w in ws) * batch
    weight_bytes = sum(w.numel() * w.element_size() for ws in weights.values() for w in ws)
    layers, heads, head = args.layers, args.heads, args.hidden // args.heads
    if name == "momentum":
        # eq. 12 per head: m ← βm − φ(k)vᵀ, S ← S − γm, z ← z + φ(k), φ(q)ᵀS and φ(q)ᵀz
        attention = layers * batch * heads * (7 * head * head + 4 * head)
        state = layers * batch * heads * (2 * head * head + head) * 4
        return linear + attention, weight_bytes + 2 * state
    attention = layers * batch * 4 * context * args.hidden          # q·K and p·V
    kv = layers * batch * 2 * context * args.hidden * 4
    return linear + attention, weight_bytes + kv


def interleaved(calls: dict, args) -> dict:
    """Per call: the times (ms) of `--rounds` × `--per_round` runs, the calls taking turns each
    round so that load from other processes falls on all of them alike."""
    times = {key: [] for key in calls}
    for _ in range(args.rounds):
        for key, fn in calls.items():
            times[key] += [time_once_ms(fn, args.device) for _ in range(args.per_round)]
    return times


def measure(batch: int, models: dict, args) -> list:
    steps = args.warmup + args.rounds * args.per_round
    cases = momentum_cases(models["momentum"], args, batch)
    for context in args.contexts:
        cases += llama_cases(models["llama"], args, batch, context, steps)
    rows = [{"model": name, "kind": kind, "batch": batch, "context": context}
            for name, kind, context, _ in cases]
    for *_, fn in cases:
        for _ in range(args.warmup):          # compilation (the first call) and warm-up
            fn()
    synchronize(args.device)
    calls = {("step", i): case[-1] for i, case in enumerate(cases)}
    work = {}
    for name in models:
        work[name] = matmul_probe(models[name], batch, args)
        calls[("matmul", name)] = work[name][1]
    for i, row in enumerate(rows):
        model = models[row["model"]]
        row["flops"], row["bytes"] = step_work(model, row["model"], batch, row["context"], args)
        moved, calls[("copy", i)] = copy_probe(row["bytes"], args)
        row["copied"] = moved
    before = graphs_compiled()
    times = interleaved(calls, args)
    recompiles = graphs_compiled() - before
    for i, row in enumerate(rows):
        step = times[("step", i)]
        matmul = statistics.median(times[("matmul", row["model"])])
        copy = statistics.median(times[("copy", i)])
        rate = work[row["model"]][0] / (matmul / 1e3)
        row.update(ms=statistics.median(step), min_ms=min(step), matmul_gflops=rate / 1e9,
                   copy_gbps=row["copied"] / (copy / 1e3) / 1e9, recompiles=recompiles)
        row.update(compute_ms=1e3 * row["flops"] / rate,
                   memory_ms=1e3 * row["bytes"] / (row["copy_gbps"] * 1e9))
        del row["copied"]
        print(json.dumps(row), file=sys.stderr)
    return rows


def table(rows, reference: str = "compiled") -> str:
    """The rows, each also over the momentum step of `reference` kind at its batch."""
    lines = ["| model | cache | batch | context | ms/step median (min) | floor ms (compute / memory) | "
             f"× floor | × momentum {reference} |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    best = {r["batch"]: r["ms"] for r in rows if r["model"] == "momentum" and r["kind"] == reference}
    for r in rows:
        cache = {("momentum", "eager"): "MomentumCache, eager", ("momentum", "compiled"):
                 "StaticMomentumCache, compiled", ("llama", "eager"): "DynamicCache, eager",
                 ("llama", "compiled"): "StaticCache, compiled"}[r["model"], r["kind"]]
        floor = max(r["compute_ms"], r["memory_ms"])
        lines.append(f"| {r['model']} | {cache} | {r['batch']} | {r['context'] or '–'} | {r['ms']:.2f} "
                     f"({r['min_ms']:.2f}) | {floor:.3f} ({r['compute_ms']:.3f} / {r['memory_ms']:.3f}) | "
                     f"{r['ms'] / floor:.1f}× | {r['ms'] / best[r['batch']]:.2f}× |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=256, help="256: one pixel per token, as in §4.2")
    p.add_argument("--connection", default="none", choices=("none", "momentum", "adaptive"))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096], help="Llama's cached tokens")
    p.add_argument("--prompt", type=int, default=16, help="momentum prompt (its step does not depend on it)")
    p.add_argument("--prefill_chunk", type=int, default=512)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the cores are shared)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per step, the first compiles")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--per_round", type=int, default=5)
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--kinds", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"],
                   help="the steps to time: eager (MomentumCache, DynamicCache), compiled (static caches)")
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES), help="the models' parameters")
    p.add_argument("--host-trace", action="store_true",
                   help="then where the host's time goes in an eager step of each model at the first batch "
                        "and context, on every thread, by kind (benchmarks/host_trace.py)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit,
                                                2 * len(args.batches) * (len(args.contexts) + 1))
    rows = []
    with torch.no_grad():
        models = {"momentum": momentum_model(args), "llama": llama_model(args)}
        for batch in args.batches:
            rows += measure(batch, models, args)
        traces = host_traces(models, args) if args.host_trace else []
    name = (torch.cuda.get_device_name() if args.device.startswith("cuda")
            else f"CPU, {args.threads} torch thread(s)")
    print(f"{time.strftime('%Y-%m-%d')}, {name}, torch {torch.__version__}; layers {args.layers}, "
          f"d {args.hidden}, heads {args.heads}, ffn {args.ffn}, vocab {args.vocab}, "
          f"connection {args.connection}; graphs compiled during the timed steps: "
          f"{max(r['recompiles'] for r in rows)}")
    print(table(rows, "compiled" if "compiled" in args.kinds else "eager"))
    rates = sorted({(r["model"], r["batch"], round(r["matmul_gflops"], 2)) for r in rows})
    print("matmul GFLOP/s at the step's shapes (model, batch, rate):", rates)
    print("copy GB/s (read + written) per case:", [round(r["copy_gbps"], 1) for r in rows])
    for title, result in traces:
        print("\n" + markdown(result, title))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def host_traces(models, args) -> list:
    """(title, host_trace.trace) of the eager momentum step and Llama's at the first batch and context."""
    batch, context = args.batches[0], args.contexts[0]
    eager = [momentum_cases(models["momentum"], args, batch)[0],
             llama_cases(models["llama"], args, batch, context, args.warmup + 40)[0]]
    return [(f"Host trace: {name}, eager, batch {batch}" + (f", context {at}" if at else ""),
             trace(one, steps=20, cuda=args.device.startswith("cuda")))
            for name, _, at, one in eager]


if __name__ == "__main__":
    main()
