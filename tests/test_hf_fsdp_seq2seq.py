"""FSDP2 (torch's `fully_shard`) on the two encoder-decoders, wrapped as accelerate's default FSDP2 policy
wraps a transformers model: every module whose class `_no_split_modules` names, then the root. Two gloo
ranks, a forward and backward of each rank's own padded pairs, with and without activation checkpointing:
each rank's loss, and every parameter's gradient as FSDP reduces it, equal one process that averages
the two ranks' gradients.
The LSTM encoder-decoder runs with its LM head tied to the decoder's embedding and with one embedding
for both sides, which FSDP2 refuses to split between two units."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from gloo_ranks import spawn_gloo
from test_hf_fsdp import WORLD, assert_ranks_match_one_process

CASES = {"transformer": {}, "lstm-tied": dict(tie_word_embeddings=True),
         "lstm-shared": dict(tie_word_embeddings=True, share_encoder_decoder_embeddings=True)}


def build(case):
    """A float32 model in training mode, the same weights on every rank and in the reference."""
    torch.manual_seed(0)
    if case == "transformer":
        from test_hf_seq2seq import model
        built = model(cross_attention="momentum")
    else:
        from test_hf_momentum_lstm_seq2seq import model
        sizes = dict(encoder_embedding_size=7, decoder_embedding_size=7, decoder_output_size=7,
                     encoder_dropout_in=0.1, decoder_dropout_out=0.1)
        built = model(**sizes, **CASES[case])
    return built.float().train()


def rank_batch(rank):
    from test_hf_momentum_lstm_seq2seq import VOCAB
    g = torch.Generator().manual_seed(100 + rank)
    src = torch.randint(3, VOCAB, (2, 6), generator=g)
    mask = torch.ones_like(src)
    mask[1, :2] = 0                                        # a left-padded source
    labels = torch.randint(3, VOCAB, (2, 5), generator=g)
    labels[0, 3:] = -100                                   # a shorter target
    return dict(input_ids=src, attention_mask=mask, labels=labels)


def loss_of(model, rank):
    torch.manual_seed(10 + rank)                           # dropout's masks, the same in the reference
    return model(**rank_batch(rank)).loss


def _worker(rank, world, case, checkpointing, out_dir):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    model = build(case)
    if checkpointing:
        model.activation_checkpointing_enable()
    mesh = init_device_mesh("cpu", (world,))
    units = [m for m in model.modules() if type(m).__name__ in model._no_split_modules]
    assert units
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    loss = loss_of(model, rank)
    loss.backward()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    torch.save({"loss": loss.detach(), "grads": grads, "units": len(units)}, f"{out_dir}/rank{rank}.pt")


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("case", list(CASES))
def test_fully_sharded_gradients_equal_one_process_averaging_the_ranks(case, checkpointing, tmp_path):
    spawn_gloo(_worker, WORLD, case, checkpointing, str(tmp_path))
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    assert got[0]["units"] == (3 + 2 if case == "transformer" else 1)
    assert_ranks_match_one_process(got, build(case), loss_of)
