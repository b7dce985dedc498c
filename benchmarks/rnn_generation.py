"""Per-token decoding time of MomentumLSTMForCausalLM with its recurrent cache.

With the cache, each generated token is one `MomentumLSTM.step` (plugins.rnn), so its cost
must not depend on how long the prompt was. For each cell and prompt length, the prompt is
absorbed once (prefill) and then --tokens tokens are decoded greedily one at a time; the
best of --repeats runs is kept. Reported, all measured in the same run:
- ms/token with the cache, and its ratio to the shortest prompt (≈ 1 when independent);
- "layer/step": the same decode loop when each token instead runs the sequence layer on a
  length-1 input (the path before `step` existed), as a ratio to the step path;
- "no cache": one forward over prompt + 1 tokens (what each token costs without a cache),
  as a ratio to the cached token.

    python benchmarks/rnn_generation.py                   # lengths 16 … 4096, 1 thread
    python benchmarks/rnn_generation.py --cells momentum sr --lengths 32 2048
"""
import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def best_time(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def decode(model, prompt, tokens, cache, sequence_layer):
    """Prefill into `cache`, then `tokens` greedy tokens one by one; returns the decode time only,
    and every greedy token (the prefill's, then each step's)."""
    import torch

    from hf_momentum.modeling_common import CACHE_NAME
    with torch.no_grad():
        logits = model(input_ids=prompt, **{CACHE_NAME: cache}, use_cache=True).logits
        step = model.model.lstm.step
        if sequence_layer:  # the pre-`step` path: the whole layer on a length-1 input
            layer = model.model.lstm
            def one_token_layer(x, state, *, all_layers=False):
                outs, state = layer(x[:, None], state, all_layers=all_layers)
                outs = tuple(out[:, 0] for out in outs)
                return (outs if all_layers else outs[0]), state

            model.model.lstm.step = one_token_layer
        try:
            token = logits[:, -1:].argmax(-1)
            generated = [token]
            start = time.perf_counter()
            for _ in range(tokens):
                token = model(input_ids=token, **{CACHE_NAME: cache}, use_cache=True).logits.argmax(-1)
                generated.append(token)
            return time.perf_counter() - start, generated
        finally:
            if sequence_layer:
                del model.model.lstm.step
            assert model.model.lstm.step.__func__ is step.__func__


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", default=["lstm", "momentum", "adam", "sr"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[16, 256, 4096])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: torch's default)")
    args = parser.parse_args()

    import torch

    sys.path.insert(0, str(ROOT))
    from hf_momentum import (
        MomentumLSTMCache,
        MomentumLSTMConfig,
        MomentumLSTMForCausalLM,
    )

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"MomentumLSTMForCausalLM hidden {args.hidden}, {args.layers} layers, vocab 1000, batch 1, "
          f"{args.tokens} tokens, best of {args.repeats}, {torch.get_num_threads()} thread(s), CPU")
    print(f"{'cell':<9} {'prompt':>6} {'ms/token':>9} {'x shortest':>10} {'layer/step':>10} {'no cache':>9}")
    for cell in args.cells:
        torch.manual_seed(0)
        config = MomentumLSTMConfig(vocab_size=1000, hidden_size=args.hidden, num_hidden_layers=args.layers,
                                    cell=cell, restart=2 if cell == "sr" else None)
        model = MomentumLSTMForCausalLM(config).eval()
        shortest = None
        for length in args.lengths:
            prompt = torch.randint(0, 1000, (1, length))
            step = min(decode(model, prompt, args.tokens, MomentumLSTMCache(config), False)[0]
                       for _ in range(args.repeats)) / args.tokens
            layer = min(decode(model, prompt, args.tokens, MomentumLSTMCache(config), True)[0]
                        for _ in range(args.repeats)) / args.tokens
            longer = torch.randint(0, 1000, (1, length + 1))
            with torch.no_grad():
                full = best_time(lambda m=model, ids=longer: m(input_ids=ids, use_cache=False), args.repeats)
            shortest = step if shortest is None else shortest
            print(f"{cell:<9} {length:>6} {1e3 * step:>9.3f} {step / shortest:>10.2f} {layer / step:>10.2f} "
                  f"{full / step:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
