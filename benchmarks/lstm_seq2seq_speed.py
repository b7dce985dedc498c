"""Training words/s and generation tokens/s of the transformers MomentumLSTM encoder-decoder
(`MomentumLSTMSeq2SeqForConditionalGeneration`) against the fairseq `momentum_lstm` it was
converted from (the same weights), on CPU, in one process (ratios are same-run).

Sizes: fairseq_speed.py's LSTM row (256 units, embeddings 256; 1 layer unidirectional, and 2 layers
with a bidirectional encoder), `--lstm-cell momentum`, source length 64, vocabulary 8000, batch 4.
Training: forward + backward + Adam step of each model on one random batch (64 target tokens per
row); words/s counts target tokens (fairseq's wps). Generation: fairseq's SequenceGenerator against
generate(), beam 1 (greedy) and beam 4, exactly GEN_LEN new tokens per sentence; tokens/s counts
the best hypothesis' tokens. Each cell is the median of REPEATS timed runs after one warm-up; the
two models of a row are timed alternately (fairseq_speed.timed_rate).

    .venv/bin/python benchmarks/lstm_seq2seq_speed.py [--repeats 5] [--threads 1]
"""
import argparse
import os
import platform
import sys
import tempfile
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fairseq_speed import (  # noqa: E402
    BATCH,
    LSTM,
    TRANSLATION,
    build_with_args,
    random_batch,
    timed_rate,
    write_dicts,
)

import hf_momentum  # noqa: E402,F401  (registers the model types)
from fairseq_momentum.convert_to_hf import to_transformers  # noqa: E402

SRC_LEN, TGT_LEN, GEN_LEN = 64, 64, 32
LAYOUTS = {"1 layer": [],
           "2 layers, bidirectional encoder": ["--encoder-layers", "2", "--decoder-layers", "2",
                                               "--encoder-bidirectional"]}


def train_steps(fairseq_model, converted, task):
    """(fairseq step, transformers step): forward + backward + Adam on the same batch."""
    src, prev, tgt = random_batch(task, BATCH, SRC_LEN, TGT_LEN, torch.Generator().manual_seed(0))
    lengths = torch.full((BATCH,), SRC_LEN)
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-4) for m in (fairseq_model, converted)]

    def step(model, optimizer, logits):
        model.train()
        loss = F.cross_entropy(logits().reshape(-1, len(task.target_dictionary)), tgt.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return tgt.numel()
    return (lambda: step(fairseq_model, optimizers[0], lambda: fairseq_model(src, lengths, prev)[0]),
            lambda: step(converted, optimizers[1],
                         lambda: converted(input_ids=src, decoder_input_ids=prev).logits))


def generate_steps(fairseq_model, converted, task, beam):
    """(fairseq step, transformers step): GEN_LEN new tokens per sentence with `beam` beams."""
    from fairseq.sequence_generator import SequenceGenerator
    src, _, _ = random_batch(task, BATCH, SRC_LEN, 1, torch.Generator().manual_seed(1))
    dictionary = task.target_dictionary
    generator = SequenceGenerator([fairseq_model], dictionary, beam_size=beam, max_len_a=0,
                                  max_len_b=GEN_LEN, min_len=GEN_LEN)
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.full((BATCH,), SRC_LEN)}}
    # the decoder's start token, then exactly GEN_LEN tokens (the converted config's own limits replaced)
    converted.generation_config.update(max_length=GEN_LEN + 1, min_new_tokens=GEN_LEN, early_stopping=True)

    def fairseq_step():
        fairseq_model.eval()
        with torch.no_grad():
            return sum(len(h[0]["tokens"]) - 1 for h in generator.generate([fairseq_model], sample))

    def transformers_step():
        converted.eval()
        with torch.no_grad():
            out = converted.generate(input_ids=src, num_beams=beam, do_sample=False)
        return (out.shape[1] - 1) * BATCH
    return fairseq_step, transformers_step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on a shared, oversubscribed machine 2 threads stall)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"transformers port vs fairseq momentum_lstm, {date.today()}, "
          f"{platform.processor() or platform.machine()}, {args.threads} threads, batch {BATCH}, source "
          f"{SRC_LEN}, target {TGT_LEN}, {GEN_LEN} generated tokens, cell momentum\n")
    print("| layout | train wps: fairseq | transformers | ratio | greedy tok/s: fairseq | transformers "
          "| ratio | beam 4 tok/s: fairseq | transformers | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        write_dicts(data)
        for name, extra in LAYOUTS.items():
            model, task, parsed = build_with_args(data, TRANSLATION, ["--arch", "momentum_lstm", *LSTM,
                                                                      "--lstm-cell", "momentum", *extra])
            converted = to_transformers(model.eval(), parsed, task.source_dictionary,
                                        target_dictionary=task.target_dictionary)
            cells = []
            for steps in (train_steps(model, converted, task), generate_steps(model, converted, task, 1),
                          generate_steps(model, converted, task, 4)):
                base, port = timed_rate(list(steps), args.repeats)
                cells += [f"{base:,.0f}", f"{port:,.0f}", f"{port / base:.2f}"]
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
