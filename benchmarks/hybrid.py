"""A 4-layer momentum_transformer with 0, 1 or 4 softmax layers (layer_types, issue 29): training
tokens/s (forward + backward of the causal-LM loss) and the decoding cache's memory per token.

Memory per token: the bytes of every tensor in the generation cache (MomentumCache: S, z, m per
momentum layer, keys/values and the real-token mask per softmax layer) after a prompt of P and of
2P tokens, (bytes(2P) − bytes(P)) / P per sequence; the fixed part (the O(1) states) is printed
beside it. Timings are medians in one run on whatever device is given (ratios only within one run).

    .venv/bin/python benchmarks/hybrid.py                       # CPU, hidden 256, N 512, batch 4
    .venv/bin/python benchmarks/hybrid.py --quick
    .venv/bin/python benchmarks/hybrid.py --device cuda
"""
import argparse
import os
import platform
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import median_ms  # noqa: E402

from hf_momentum import MomentumTransformerConfig, MomentumTransformerForCausalLM  # noqa: E402
from hf_momentum.modeling_common import CACHE_NAME  # noqa: E402

MODELS = {
    "all momentum": ["linear_attention"] * 4,
    "hybrid (1 softmax in 4)": ["linear_attention"] * 3 + ["full_attention"],
    "all softmax": ["full_attention"] * 4,
}


def build(layer_types, hidden, device):
    torch.manual_seed(0)
    config = MomentumTransformerConfig(vocab_size=1000, hidden_size=hidden, num_hidden_layers=4,
                                       num_attention_heads=hidden // 64, max_position_embeddings=4096,
                                       hidden_dropout=0.0, layer_types=layer_types)
    return MomentumTransformerForCausalLM(config).to(device)


def train_tokens_per_s(model, batch, length, device):
    ids = torch.randint(0, 1000, (batch, length), device=device)
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

    return batch * length / (median_ms(step, device, warmup=1, target_ms=2000.0, max_reps=10) / 1e3)


def cache_bytes(cache):
    total = 0
    for layer in cache.layers:
        tensors = list(getattr(layer, "recurrent_states", {}).values())
        tensors += [getattr(layer, name, None) for name in ("keys", "values", "real")]
        total += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    return total


def decode_bytes(model, prompt, device):
    """(bytes per sequence after `prompt` tokens, after 2·prompt) of the generation cache."""
    model.eval()
    sizes = []
    with torch.no_grad():
        for length in (prompt, 2 * prompt):
            ids = torch.randint(0, 1000, (1, length), device=device)
            sizes.append(cache_bytes(getattr(model(input_ids=ids, use_cache=True), CACHE_NAME)))
    return sizes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="hidden 128, N 256, batch 2")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.length, args.batch = 128, 256, 2
    print(f"device {args.device} ({platform.processor() or platform.machine()}, {torch.get_num_threads()} "
          f"threads), torch {torch.__version__}, hidden {args.hidden}, heads {args.hidden // 64}, fp32; "
          f"training batch {args.batch} x {args.length}; cache after {args.prompt} and "
          f"{2 * args.prompt} tokens\n")
    print("| model | train tokens/s | vs all momentum | cache bytes/token | fixed cache bytes |")
    print("|---|---|---|---|---|")
    base = None
    for name, layer_types in MODELS.items():
        model = build(layer_types, args.hidden, args.device)
        speed = train_tokens_per_s(model, args.batch, args.length, args.device)
        base = speed if base is None else base
        short, long = decode_bytes(model, args.prompt, args.device)
        per_token = (long - short) / args.prompt
        fixed = short - per_token * args.prompt
        print(f"| {name} | {speed:,.0f} | {speed / base:.2f} | {per_token:,.0f} | {fixed:,.0f} |")


if __name__ == "__main__":
    main()
