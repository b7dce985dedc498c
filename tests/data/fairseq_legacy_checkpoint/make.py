"""Writes this directory's fixture for tests/test_fairseq_legacy_checkpoint.py: a tiny
momentum_transformer checkpoint saved by fairseq-train, its dictionaries, and the model's outputs
on a fixed batch (expected.pt), all computed by the code on PYTHONPATH.

It was run once with the code of commit 9869984, before fairseq's attention became glue over
plugins.transformer.MultiHeadAttention (parameter `out_proj`, and --connection-* values stored
for every connection):

    git archive 9869984 | tar -x -C /tmp/old
    cd /tmp/old && PYTHONPATH=/tmp/old:/tmp/old/tests python <this file> <this directory>
"""
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from test_fairseq_support import preprocess_translation, train, write_parallel_text

TASK = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt"]
ARCH = ["--arch", "momentum_transformer", "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-embed-dim", "8", "--decoder-embed-dim", "8", "--encoder-ffn-embed-dim", "16",
        "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--attention-momentum", "0.5", "--attention-step-size", "0.8", "--attention-chunk-size", "4"]


def fixed_batch(src_dict, tgt_dict):
    """Two left-padded source sentences of lengths 6 and 3, and 5 target tokens each."""
    g = torch.Generator().manual_seed(0)
    src = torch.full((2, 6), src_dict.pad())
    for row, n in enumerate((6, 3)):
        src[row, 6 - n:] = torch.randint(src_dict.nspecial, len(src_dict), (n,), generator=g)
        src[row, -1] = src_dict.eos()
    tgt = torch.randint(tgt_dict.nspecial, len(tgt_dict), (2, 5), generator=g)
    tgt[:, 0] = tgt_dict.eos()
    return src, torch.tensor([6, 3]), tgt


def main(out: Path):
    from fairseq import checkpoint_utils

    import fairseq_momentum  # noqa: F401  (allowlists the checkpoint's types for torch.load)

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sizes = (("train", 40), ("valid", 8), ("test", 8))
        data = preprocess_translation(write_parallel_text(tmp / "text", sizes=sizes), tmp / "bin")
        train(data, tmp / "ckpt", *TASK, *ARCH, "--max-tokens", "400", "--max-update", "2",
              "--optimizer", "adam", "--lr", "0.01")
        shutil.copy(tmp / "ckpt" / "checkpoint_last.pt", out / "checkpoint.pt")
        for lang in ("src", "tgt"):
            shutil.copy(data / f"dict.{lang}.txt", out / f"dict.{lang}.txt")
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(out / "checkpoint.pt")], arg_overrides={"data": str(out)})
    model = model.double().eval()
    src, src_lengths, tgt = fixed_batch(task.source_dictionary, task.target_dictionary)
    with torch.no_grad():
        logits = model(src, src_lengths, tgt)[0]
    torch.save({"src_tokens": src, "src_lengths": src_lengths, "prev_output_tokens": tgt, "logits": logits},
               out / "expected.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
