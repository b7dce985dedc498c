"""FSDP2 (torch's `fully_shard`) on the native models, as hf_momentum/README.md shows it: two gloo
ranks, each layer and then the model sharded, one AdamW step on each rank's own batch. The loss
of each rank and the parameters after the step equal one process that computes both ranks'
losses, averages their gradients (what FSDP's reduce-scatter does) and takes the same step.
Wrapped as accelerate's default FSDP2 policy wraps (each module whose class `_no_split_modules`
names, then the root), also AWD-LSTM with weight drop, locked dropout and dropout in training: each
rank's loss and every reduced gradient equal one process's."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from gloo_ranks import spawn_gloo
from helpers.hf_tiny_models import FAMILIES, causal_lm

WORLD = 2


def rank_batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(3, 60, (2, 21), generator=g)
    mask = torch.ones(2, 21, dtype=torch.long)
    mask[1, :5] = 0                                   # a left-padded row
    return ids, mask


def shard(model, mesh):
    """The README's recipe: each decoder layer (the LSTM's stack is one module), then the model."""
    from torch.distributed.fsdp import fully_shard
    for block in getattr(model.model, "layers", None) or [model.model.lstm]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _worker(rank, world, family, out_dir):
    from torch.distributed.device_mesh import init_device_mesh
    model = shard(causal_lm(family).train(), init_device_mesh("cpu", (world,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids, mask = rank_batch(rank)
    loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    optimizer.step()
    params = {name: p.full_tensor().detach() for name, p in model.named_parameters()}
    torch.save({"loss": loss.detach(), "params": params}, f"{out_dir}/rank{rank}.pt")


@pytest.mark.parametrize("family", FAMILIES)
def test_fully_sharded_step_equals_one_process_with_averaged_gradients(family, tmp_path):
    spawn_gloo(_worker, WORLD, family, str(tmp_path))
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]

    model = causal_lm(family).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for rank in range(WORLD):
        ids, mask = rank_batch(rank)
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        (loss / WORLD).backward()
        losses.append(loss.detach())
    optimizer.step()
    for rank in range(WORLD):
        torch.testing.assert_close(got[rank]["loss"], losses[rank], rtol=1e-5, atol=1e-6)
    expected = dict(model.named_parameters())
    assert got[0]["params"].keys() == expected.keys()
    moved = 0
    for name, p in expected.items():
        for rank in range(WORLD):
            torch.testing.assert_close(got[rank]["params"][name], p.detach(), rtol=1e-5, atol=1e-6, msg=name)
        moved += int(not torch.equal(p.detach(), dict(causal_lm(family).named_parameters())[name].detach()))
    assert moved > len(expected) // 2                   # the step changed the weights


NO_SPLIT_CASES = {**{family: {} for family in FAMILIES},
                  "awd_lstm-dropped": dict(weight_drop=0.3, locked_dropout=True, dropout=0.2)}


def _no_split_worker(rank, world, case, out_dir):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    model = causal_lm(case.partition("-")[0], **NO_SPLIT_CASES[case]).train()
    mesh = init_device_mesh("cpu", (world,))
    units = [name for name, m in model.named_modules() if type(m).__name__ in model._no_split_modules]
    for name in units:
        fully_shard(model.get_submodule(name), mesh=mesh)
    fully_shard(model, mesh=mesh)
    loss = no_split_loss(model, rank)
    loss.backward()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    torch.save({"loss": loss.detach(), "grads": grads, "units": units}, f"{out_dir}/rank{rank}.pt")


def no_split_loss(model, rank):
    ids, mask = rank_batch(rank)
    torch.manual_seed(10 + rank)                 # the dropout masks, the same in the reference
    return model(input_ids=ids, attention_mask=mask, labels=ids).loss


@pytest.mark.parametrize("case", list(NO_SPLIT_CASES))
def test_accelerates_default_wrapping_gives_one_processs_gradients(case, tmp_path):
    """The LSTM stack is one unit, AWD's last layer inside it: the stack draws that layer's weight-drop
    masks before any layer runs (a unit of its own held its weights sharded then: a mixed Tensor and
    DTensor product)."""
    spawn_gloo(_no_split_worker, WORLD, case, str(tmp_path))
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    units = ["model.layers.0", "model.layers.1"] if case == "transformer" else ["model.lstm"]
    assert got[0]["units"] == units
    model = causal_lm(case.partition("-")[0], **NO_SPLIT_CASES[case]).train()
    assert_ranks_match_one_process(got, model, no_split_loss)


def assert_ranks_match_one_process(got, model, loss_of):
    """Each rank's loss and reduced gradients (`got`: the workers' "loss" and "grads") equal those of
    `model` in one process, its gradient the mean of the ranks' (`loss_of(model, rank)`)."""
    losses = []
    for rank in range(WORLD):
        loss = loss_of(model, rank)
        (loss / WORLD).backward()
        losses.append(loss.detach())
    expected = {name: p.grad for name, p in model.named_parameters()}
    assert sum(bool(g.abs().sum() > 0) for g in expected.values()) > 0.9 * len(expected)
    for rank in range(WORLD):
        torch.testing.assert_close(got[rank]["loss"], losses[rank], rtol=1e-5, atol=1e-6)
        assert got[rank]["grads"].keys() == expected.keys()
        for name, grad in expected.items():
            torch.testing.assert_close(got[rank]["grads"][name], grad, rtol=1e-4, atol=1e-7, msg=name)
