"""Training-step throughput on a CUDA GPU: MomentumTransformerForCausalLM vs a Llama of the same
width and depth with SDPA attention.

Both: 12 layers, hidden 768, 12 heads, feed-forward 3072, vocabulary 32000, bf16 autocast, AdamW,
random tokens, loss = next-token cross-entropy. One step = forward, backward, optimizer step. T =
2048 and 8192 with the same number of tokens per step (--tokens, default 16384). The momentum
model uses whatever backend `momentum_attention` picks (the Triton kernels on CUDA once dispatch
is wired; printed). Reports tokens/s (median over the timed steps, after warm-up), peak memory
(torch.cuda.max_memory_allocated) and parameter counts (Llama's gated MLP has 1.5× the
feed-forward weights), with ratios measured in the same run. Prints Markdown.

    python benchmarks/gpu_train.py
    python benchmarks/gpu_train.py --lengths 2048 --steps 5
"""
import argparse
import os
import statistics
import sys
from datetime import date

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

LAYERS, HIDDEN, HEADS, FFN, VOCAB = 12, 768, 12, 3072, 32000
SIZE = dict(layers=LAYERS, hidden=HIDDEN, heads=HEADS, ffn=FFN, vocab=VOCAB)


def momentum_model(T, size=SIZE):
    from hf_momentum import MomentumTransformerConfig, MomentumTransformerForCausalLM
    config = MomentumTransformerConfig(vocab_size=size["vocab"], hidden_size=size["hidden"],
                                       num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
                                       intermediate_size=size["ffn"], max_position_embeddings=T,
                                       hidden_dropout=0.0)
    return MomentumTransformerForCausalLM(config)


def llama_model(T, size=SIZE):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=size["vocab"], hidden_size=size["hidden"],
                         num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
                         num_key_value_heads=size["heads"],
                         intermediate_size=size["ffn"], max_position_embeddings=T, tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def measure(make_model, T, tokens, steps, warmup, size=SIZE, device="cuda"):
    """(tokens/s, peak MiB (0 off CUDA), parameters) of training steps at sequence length T; the
    warm-up steps (Triton autotuning, cuBLAS and allocator set-up) are not timed. The caller
    empties the CUDA cache once the model is gone (measure_or_oom)."""
    from timing import time_once_ms

    model, step, B = training_step(make_model, T, tokens, size, device)
    for _ in range(warmup):
        step()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = [time_once_ms(step, device) / 1e3 for _ in range(steps)]
    peak = torch.cuda.max_memory_allocated() / 2 ** 20 if device == "cuda" else 0.0
    params = sum(p.numel() for p in model.parameters())
    return B * T / statistics.median(times), peak, params


def training_step(make_model, T, tokens, size=SIZE, device="cuda"):
    """(model, step, batch): one training step of the model at sequence length T, `tokens` per
    step (batch = tokens // T rows of random ids): bf16 autocast forward, loss, backward, AdamW
    (fused on CUDA), gradients set to None."""
    torch.manual_seed(0)
    model = make_model(T, size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    B = max(1, tokens // T)
    ids = torch.randint(0, size["vocab"], (B, T), device=device)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, step, B


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_train.py needs a CUDA GPU")
    backend = attention_backend()
    print(f"# Training step, bf16 autocast + AdamW, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, {LAYERS} layers, d {HIDDEN}, {HEADS} heads, "
          f"{args.tokens} tokens/step; momentum attention: {backend}; {date.today()}")
    print()
    print("| T | batch | momentum tok/s | Llama-SDPA tok/s | momentum / Llama | momentum MiB | Llama MiB | "
          "params momentum / Llama |")
    print("|---|---|---|---|---|---|---|---|")
    for T in args.lengths:
        mom = measure_or_oom(momentum_model, T, args)
        llama = measure_or_oom(llama_model, T, args)
        if mom is None or llama is None:
            print(f"| {T} | {max(1, args.tokens // T)} | {_cell(mom, 0, '.0f')} | {_cell(llama, 0, '.0f')} "
                  f"| — | {_cell(mom, 1, '.0f')} | {_cell(llama, 1, '.0f')} | — |")
            continue
        print(f"| {T} | {max(1, args.tokens // T)} | {mom[0]:.0f} | {llama[0]:.0f} | "
              f"{mom[0] / llama[0]:.2f} | {mom[1]:.0f} | {llama[1]:.0f} | "
              f"{mom[2] / 1e6:.1f}M / {llama[2] / 1e6:.1f}M |")


def attention_backend() -> str:
    """What the momentum model's attention runs on: the Triton kernels only once
    `momentum_attention` dispatches (has a `backend` argument) and triton is usable."""
    import inspect

    from plugins.attention import momentum_attention
    from plugins.attention import triton as attention_triton
    if "backend" not in inspect.signature(momentum_attention).parameters:
        return "PyTorch path (momentum_attention has no Triton dispatch)"
    return "auto: Triton kernels" if attention_triton.is_available() else "auto: PyTorch path (no triton)"


def measure_or_oom(make_model, T, args):
    """measure(), or None when the step does not fit in GPU memory (printed as OOM)."""
    try:
        return measure(make_model, T, args.tokens, args.steps, args.warmup)
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        torch.cuda.empty_cache()


def _cell(result, index, spec):
    return "OOM" if result is None else format(result[index], spec)


if __name__ == "__main__":
    main()
