"""Host time of one Triton momentum-attention forward+backward through the public API, without a
GPU: Triton's real launch path (autotuner, binder, launcher) runs with the stand-in driver of
tests/triton_standin.py, whose launches are no-ops, so what is timed is everything the host does
per call. On a GPU this time is what the device waits for whenever it exceeds the kernels' own
time (docs/benchmarks.md, 2026-11-27: 0.76 ms of kernels in a 2.34 ms fwd+bwd at B16-H16-T1k).

    python benchmarks/triton_host_overhead.py [--length 64] [--profile 25]
    python benchmarks/triton_host_overhead.py --decode        # one decoding step, no gradients
    python benchmarks/triton_host_overhead.py --model-decode  # a 4-layer HF model's decoding step, Llama's
    python benchmarks/triton_host_overhead.py --lstm          # MomentumLSTMs at PTB's steps and batch
Must run without TRITON_INTERPRET (the interpreter skips the launcher)."""
import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET: the interpreter skips the launcher timed here")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import triton_standin  # noqa: E402  (active before any kernel is used)


def fwd_bwd(B=1, H=1, N=64, D=64, beta=0.6, entry="api"):
    """A closure running one forward + backward on small CPU bf16 tensors (small, so that the CPU
    arithmetic of the torch ops around the kernels stays out of the time; nothing else runs):
    `entry` "api" is plugins.attention.momentum_attention (the feature map, checks, dispatch),
    "chunk" the Triton entry point on feature-mapped inputs (what benchmarks/gpu_attention.py
    times after its own elu + 1), "layer" the trusted path a decoder layer takes (attend: raw q,
    k, v with heads transposed out of (B, N, H, D), the feature map and NaN marks always)."""
    import torch

    from plugins.attention import momentum_attention
    from plugins.attention.attend import attend
    from plugins.attention.spec import AttentionSpec
    from plugins.attention.triton import chunk_momentum_attention
    gen = torch.Generator().manual_seed(0)
    leaves = [torch.randn(B, N, H, D, generator=gen).to(torch.bfloat16).requires_grad_() for _ in range(3)]
    q, k, v = (t.transpose(1, 2) if entry == "layer" else t.view(B, H, N, D) for t in leaves)
    grad = torch.randn(B, H, N, D, generator=gen).to(torch.bfloat16)
    spec = AttentionSpec(momentum=beta, step_size=1.0, backend="triton")

    def step():
        if entry == "api":
            out = momentum_attention(q, k, v, momentum=beta, backend="triton")
        elif entry == "layer":
            out = attend(q, k, v, spec)
        else:
            out, _ = chunk_momentum_attention(q, k, v, momentum=beta, step_size=1.0, eps=1e-6, chunk_size=64)
        torch.autograd.grad(out, leaves, grad)
    return step


def decode_step(B=1, H=8, D=64, beta=0.6):
    """A closure running attend_step, the trusted path a decoder layer takes (no argument checks,
    plugins/transformer/attention.py), on one bf16 token per row of a padded batch (a padding
    mask, as HF generation passes one) from an fp32 state, without gradients."""
    import torch

    from plugins.attention import MomentumAttentionState
    from plugins.attention.attend import attend_step
    from plugins.attention.spec import AttentionSpec
    from plugins.packing import Segments
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, 1, D, generator=gen).to(torch.bfloat16) for _ in range(3))
    state = MomentumAttentionState.zeros(B, H, D, D, dtype=torch.float32, device=q.device)
    spec = AttentionSpec(momentum=beta, backend="triton")
    segments = Segments.from_padding_mask(torch.ones(B, 1, dtype=torch.bool), B, 1)

    def step():
        with torch.no_grad():
            attend_step(q, k, v, state, spec, segments=segments)
    return step


def llama_decode_step(layers=4, hidden=64, heads=8, vocab=100, prompt=64):
    """The same step of LlamaForCausalLM (SDPA, a DynamicCache) at the same widths: the baseline
    whose host work per eager decoding step the momentum model's is compared with."""
    import torch
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, intermediate_size=4 * hidden,
                         max_position_embeddings=100_000)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()
    return decoding_step(model, DynamicCache(config=config), vocab, prompt)


def model_decode_step(layers=4, hidden=64, heads=8, vocab=100, prompt=64):
    """A closure running one eager greedy decoding step of MomentumTransformerForCausalLM (a
    MomentumCache, bf16 autocast, batch 1), as benchmarks/hf_speed.py's decode_rates does, at tiny
    widths so that the CPU arithmetic stays small: what is timed is the host's work per step,
    the layers' attention through the Triton launcher (no-op launches; the model's backend "auto"
    takes it after allow_cpu_tensors(auto=True))."""
    import torch

    from hf_momentum import MomentumCache, MomentumTransformerConfig, MomentumTransformerForCausalLM
    torch.manual_seed(0)
    config = MomentumTransformerConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                       num_attention_heads=heads, intermediate_size=4 * hidden,
                                       max_position_embeddings=100_000, hidden_dropout=0.0)
    return decoding_step(MomentumTransformerForCausalLM(config).eval(), MomentumCache(config), vocab, prompt)


def decoding_step(model, cache, vocab: int, prompt: int):
    """A closure running one cached greedy step of `model` after a `prompt`-token prompt, under bf16
    autocast without gradients."""
    import torch

    from hf_momentum.modeling_common import CACHE_NAME
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        token = model(input_ids=torch.randint(0, vocab, (1, prompt)), **{CACHE_NAME: cache},
                      use_cache=True).logits[:, -1:].argmax(-1)

    def step():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=token, **{CACHE_NAME: cache}, use_cache=True)
    return step


def model_train_step(layers=4, hidden=128, heads=2, vocab=100, batch=2, length=64):
    """A closure running one training forward+backward of MomentumTransformerForCausalLM (labels,
    bf16 autocast, no optimizer) as a Trainer's step calls it, at tiny widths: the host's work per
    step, the layers' attention through the Triton launcher (no-op launches)."""
    import torch

    from hf_momentum import MomentumTransformerConfig, MomentumTransformerForCausalLM
    torch.manual_seed(0)
    config = MomentumTransformerConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                       num_attention_heads=heads, intermediate_size=2 * hidden,
                                       max_position_embeddings=4 * length, hidden_dropout=0.0)
    model = MomentumTransformerForCausalLM(config).train()
    ids = torch.randint(0, vocab, (batch, length))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    return step


def lstm_fwd_bwd(variant):
    """A closure running one forward+backward of a 3-layer MomentumLSTM at PTB's steps and batch
    (T 70, B 20), benchmarks/rnn.py's `variant` ("adam-triton": a GEMM and a Triton kernel per
    step; "adam-triton-one-launch": one kernel per step; "adam-cudnn": the drive first, then one
    fused call per layer; "momentum": eq. 9's filter, then one fused call per layer), float32, at
    tiny widths (input 16, hidden 32) so that the CPU arithmetic stays small."""
    import rnn
    return rnn.build(variant, T=70, B=20, D=16, H=32, L=3)


# Ops that launch no kernel on a GPU (views, allocations, metadata; a cast counts only when it copies).
NO_KERNEL = {"aten::" + name for name in (
    "to", "promote_types", "empty_like", "empty", "empty_strided", "new_empty", "select", "unsqueeze",
    "detach", "as_strided", "view", "alias", "expand", "slice", "reshape", "_unsafe_view", "t", "transpose",
    "lift_fresh", "resolve_conj", "resolve_neg", "unbind")}


def aten_ops(step) -> tuple[int, int]:
    """(top-level aten ops of one call, those that compute: a kernel each on a GPU)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()

    def computes(event):
        return event.name not in NO_KERNEL or any(computes(child) for child in event.cpu_children
                                                  if child.name != "aten::detach")
    top = [e for e in prof.events() if e.name.startswith("aten::")
           and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
    return len(top), sum(1 for e in top if e.name != "aten::detach" and computes(e))


def host_us(step, rounds=7, calls=50):
    """Median over rounds of the mean host µs per call."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def python_calls(step, calls=10) -> int:
    """Function calls (Python's and built-ins', as cProfile counts them) per call of `step`: the
    host work in a number that machine load does not move."""
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [step() for _ in range(calls)])
    return round(pstats.Stats(profiler).total_calls / calls)


def launches_of(step) -> int:
    """Triton launches of one call of `step` (the first one also compiles and autotunes, with the
    stand-in's timings)."""
    before = triton_standin._NoLaunch.launches
    step()
    return triton_standin._NoLaunch.launches - before


def compared(steps: dict, rounds: int, calls: int) -> dict:
    """Per named step: (median host µs of `rounds` rounds of `calls` calls, the steps taking turns each
    round so that load on the machine hits all alike; Triton launches, aten ops, those computing, and
    function calls, per call)."""
    counts = {name: (launches_of(step), *aten_ops(step), python_calls(step, calls=calls))
              for name, step in steps.items()}
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            times[name].append(host_us(step, rounds=1, calls=calls))
    return {name: (statistics.median(times[name]), *counts[name]) for name in steps}


def model_step_report(step, rounds: int, calls: int, warm: int) -> tuple:
    """(Triton launches, host µs, aten ops, computing aten ops) of one model step after `warm` steps
    (compilation and autotuning)."""
    for _ in range(warm):
        step()
    per_call = launches_of(step)
    return (per_call, host_us(step, rounds=rounds, calls=calls), *aten_ops(step))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=int, default=0, help="print the N functions with the most own time")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--length", type=int, default=64,
                        help="N (B1-H1-D64): from 2048 on, one row splits its scans (split.scan_splits)")
    parser.add_argument("--decode", action="store_true", help="time one decoding step (B1-H8-D64) instead")
    parser.add_argument("--model-decode", action="store_true",
                        help="time an eager decoding step of a 4-layer HF momentum model and Llama's instead")
    parser.add_argument("--model-train", action="store_true",
                        help="time a training forward+backward of a 4-layer HF momentum model instead")
    parser.add_argument("--lstm", action="store_true",
                        help="time a 3-layer MomentumLSTM forward+backward (T 70, B 20): Adam on both "
                             "Triton recurrences and drive first, and the momentum cell")
    args = parser.parse_args()
    triton_standin.activate(90)
    import torch
    torch.set_num_threads(1)
    from triton_launch_check import allow_cpu_tensors
    allow_cpu_tensors(auto=args.model_decode or args.model_train)
    if args.model_train:
        step = model_train_step()
        per_call, us, ops, computing = model_step_report(step, args.rounds, 10, warm=5)
        print(f"host ms per training forward+backward of MomentumTransformerForCausalLM (4 layers, hidden "
              f"128, 2 heads, B2-T64, labels, bf16 autocast; median of {args.rounds} rounds of 10): "
              f"{us / 1e3:.2f}; {per_call} Triton launches and {ops} aten ops per step, {computing} of "
              f"them computing; {python_calls(step)} function calls per step (cProfile)")
        return
    if args.model_decode:
        steps = {"momentum": model_decode_step(), "Llama-SDPA": llama_decode_step()}
        for step in steps.values():
            for _ in range(20):                  # compilation and autotuning
                step()
        print(f"host µs per eager decoding step (4 layers, hidden 64, 8 heads, batch 1, bf16 autocast; "
              f"median of {args.rounds} alternating rounds of 20): MomentumTransformerForCausalLM with a "
              "MomentumCache, LlamaForCausalLM (SDPA) with a DynamicCache, the CPU's arithmetic included")
        for name, (us, launches, ops, computing, calls) in compared(steps, args.rounds, 20).items():
            print(f"  {name}: {us:.0f} µs; {launches} Triton launches, {ops} aten ops ({computing} "
                  f"computing), {calls} function calls (cProfile) per step")
        return
    if args.lstm:
        variants = ("adam-triton", "adam-triton-one-launch", "adam-cudnn", "momentum")
        steps = {name: lstm_fwd_bwd(name) for name in variants}
        print(f"host ms per forward+backward of a 3-layer MomentumLSTM (T 70, B 20, hidden 32, float32; "
              f"Triton launch path, no-op launches; median of {args.rounds} rounds of 3):")
        for name, (us, launches, _, computing, calls) in compared(steps, args.rounds, 3).items():
            print(f"  {name}: {us / 1e3:.2f} ms; {launches} Triton launches, {computing} computing aten ops "
                  f"and {calls} function calls (cProfile) per call")
        return
    if args.decode:
        step = decode_step()
        per_call = launches_of(step)
        for _ in range(20):
            step()
        us = host_us(step, rounds=args.rounds)
        print(f"host µs per decoding step (bf16, B1-H8-D64, padding mask, no gradients, median of "
              f"{args.rounds} rounds of 50): attend_step {us:.0f}; {per_call} Triton launches and "
              "%d aten ops per call, %d of them computing" % aten_ops(step))
        return
    entries = {"api": "momentum_attention", "chunk": "chunk_momentum_attention", "layer": "attend"}
    steps = {entry: fwd_bwd(N=args.length, entry=entry) for entry in entries}
    step = steps["api"]
    per_call = launches_of(step)
    layer_launches = launches_of(steps["layer"])
    for _ in range(20):
        for entry_step in steps.values():
            entry_step()
    rounds = {entry: [] for entry in entries}
    for _ in range(args.rounds):                 # alternating, so that load on the machine hits all
        for entry, entry_step in steps.items():
            rounds[entry].append(host_us(entry_step, rounds=1))
    times = ", ".join(f"{name} {statistics.median(rounds[entry]):.0f}" for entry, name in entries.items())
    calls = ", ".join(f"{name} {python_calls(steps[entry])}" for entry, name in entries.items())
    print(f"host µs per forward+backward (bf16, B1-H1-N{args.length}-D64, Triton launch path, no-op "
          f"launches, median of {args.rounds} rounds of 50): {times}; {per_call} Triton launches in the "
          f"first call (autotuning included); attend: {launches_of(steps['layer'])} launches per call after "
          f"{layer_launches} in its first, {aten_ops(steps['layer'])[1]} computing aten ops; function calls "
          f"per call (cProfile): {calls}")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [step() for _ in range(100)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
