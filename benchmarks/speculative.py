"""Prompt-lookup decoding against greedy decoding for the native models (issue 29): tokens/s of
`generate(prompt_lookup_num_tokens=k)` and of plain greedy `generate()` on a repetitive prompt
(a random phrase repeated), for a small MomentumTransformerForCausalLM and MomentumLSTMForCausalLM
with random weights (fixed seed). Both runs must give the same tokens (checked); reported: the
median wall time of `--repeats` runs each (interleaved), tokens/s, the ratio, and per run of
prompt lookup the target forwards (generate's verification forwards) and the model forwards in
all (with the re-runs of accepted tokens after a crop, hf_momentum/cache_history.py).

    python benchmarks/speculative.py                      # defaults below
    python benchmarks/speculative.py --new_tokens 32 --repeats 3   # quick look
"""
import argparse
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def build(family: str, args):
    import hf_momentum  # noqa: F401  (registers the native model types)
    torch.manual_seed(0)
    if family == "transformer":
        config = AutoConfig.for_model(
            "momentum_transformer", vocab_size=args.vocab, hidden_size=args.hidden,
            num_hidden_layers=args.layers, num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
            max_position_embeddings=1024, hidden_dropout=0.0, attention_momentum=0.6, connection="adaptive")
    else:
        config = AutoConfig.for_model("momentum_lstm", vocab_size=args.vocab, hidden_size=args.hidden,
                                      num_hidden_layers=args.layers, cell="momentum")
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = None       # every run makes --new_tokens tokens
    return model


def count_calls(module):
    calls = []
    module.register_forward_pre_hook(lambda *a: calls.append(1))
    return calls


def run(family: str, args) -> dict:
    model = build(family, args)
    phrase = torch.randint(3, args.vocab, (1, args.phrase), generator=torch.Generator().manual_seed(1))
    prompt = phrase.repeat(1, args.copies)
    common = dict(max_new_tokens=args.new_tokens, do_sample=False)
    lookup_kwargs = dict(common, prompt_lookup_num_tokens=args.lookup)
    top, base = count_calls(model), count_calls(model.model)
    times = {"greedy": [], "lookup": []}
    with torch.no_grad():
        greedy = model.generate(prompt, **common)
        before = (len(top), len(base))
        lookup = model.generate(prompt, **lookup_kwargs)
        target_forwards, all_forwards = len(top) - before[0], len(base) - before[1]
        if not torch.equal(greedy, lookup):
            raise AssertionError(f"{family}: prompt lookup gave other tokens than greedy decoding")
        for _ in range(args.repeats):
            for name, kwargs in (("greedy", common), ("lookup", lookup_kwargs)):
                start = time.perf_counter()
                model.generate(prompt, **kwargs)
                times[name].append(time.perf_counter() - start)
    greedy_s, lookup_s = statistics.median(times["greedy"]), statistics.median(times["lookup"])
    return dict(family=family, greedy_tps=args.new_tokens / greedy_s, lookup_tps=args.new_tokens / lookup_s,
                ratio=greedy_s / lookup_s, target_forwards=target_forwards, all_forwards=all_forwards)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["transformer", "lstm"])
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--phrase", type=int, default=16, help="tokens of the repeated phrase")
    parser.add_argument("--copies", type=int, default=8, help="times the phrase is repeated in the prompt")
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--lookup", type=int, default=10, help="prompt_lookup_num_tokens")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"prompt {args.phrase}x{args.copies} tokens, {args.new_tokens} new tokens, "
          f"prompt_lookup_num_tokens={args.lookup}, hidden {args.hidden}, {args.layers} layers, "
          f"{args.threads} thread(s), median of {args.repeats}")
    print(f"{'model':<12} {'greedy tok/s':>13} {'lookup tok/s':>13} {'speed-up':>9} "
          f"{'target fwd':>11} {'all fwd':>8}")
    for family in args.families:
        r = run(family, args)
        print(f"{r['family']:<12} {r['greedy_tps']:>13.1f} {r['lookup_tps']:>13.1f} {r['ratio']:>8.2f}x "
              f"{r['target_forwards']:>11} {r['all_forwards']:>8}")


if __name__ == "__main__":
    main()
