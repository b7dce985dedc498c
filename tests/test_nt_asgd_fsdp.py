"""NT-ASGD (`plugins.nt_asgd.NTASGD`) under FSDP2 (torch's `fully_shard`, as hf_momentum/README.md shards
the models), on two gloo ranks with AWD-LSTM's stack: each rank keeps the average of its shards, so the
iterates and their average equal one process that averages both ranks' gradients; and a sharded
checkpoint written through torch.distributed.checkpoint's optimizer state dict (what accelerate's FSDP
saving calls) keeps the switch, so a run resumed from it, the average in the parameters or not, ends as
the uninterrupted one."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from gloo_ranks import spawn_gloo
from helpers.hf_tiny_models import causal_lm

from plugins.nt_asgd import NTASGD

WORLD, STEPS, SWITCH_AT, RATES = 2, 6, 2, (0.5, 0.3, 0.4, 0.2, 0.5, 0.3)


def rank_batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(3, 60, (2, 9), generator=g)


def train(model, optimizer, start, stop, backward):
    """Steps start..stop-1: before step SWITCH_AT the optimizer sees losses that switch it;
    `backward(model, step)` leaves the step's gradients."""
    for step in range(start, stop):
        optimizer.use_average(False)
        if step == SWITCH_AT:
            for loss in (1.0, 1.0, 2.0):
                optimizer.observe(loss)
            assert optimizer.averaging
        for group in optimizer.param_groups:
            group["lr"] = RATES[step]
        optimizer.zero_grad()
        backward(model, step)
        optimizer.step()


def sharded(world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    model = causal_lm("awd_lstm").train()
    mesh = init_device_mesh("cpu", (world,))
    fully_shard(model.model.lstm, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, NTASGD(model.parameters(), lr=RATES[0], weight_decay=0.01, nonmono=1)


def full(model, optimizer):
    """The parameters and their averages, gathered."""
    named = list(model.named_parameters())
    return ({name: p.full_tensor().detach().clone() for name, p in named},
            {name: optimizer.state[p]["average"].full_tensor().clone() for name, p in named})


def _worker(rank, world, out_dir, stop, swapped):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    def backward(model, step):
        ids = rank_batch(step, rank)
        model(input_ids=ids, labels=ids).loss.backward()

    model, optimizer = sharded(world)
    train(model, optimizer, 0, stop, backward)
    optimizer.use_average(swapped)
    dcp.save({"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)},
             checkpoint_id=f"{out_dir}/checkpoint")
    train(model, optimizer, stop, STEPS, backward)
    uninterrupted = full(model, optimizer)

    model, optimizer = sharded(world)
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=f"{out_dir}/checkpoint")
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    resumed_switch = dict(optimizer.switch)
    train(model, optimizer, stop, STEPS, backward)
    torch.save({"uninterrupted": uninterrupted, "resumed": full(model, optimizer),
                "switch": optimizer.switch, "resumed_switch": resumed_switch}, f"{out_dir}/rank{rank}.pt")


@pytest.mark.parametrize("stop, swapped", [(1, False), (4, False), (4, True)],
                         ids=["before-the-switch", "averaging", "averaging-average-in-params"])
def test_sharded_nt_asgd_averages_and_resumes_from_a_distributed_checkpoint(stop, swapped, tmp_path):
    spawn_gloo(_worker, WORLD, str(tmp_path), stop, swapped)
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]

    def backward(model, step):
        for rank in range(WORLD):
            ids = rank_batch(step, rank)
            (model(input_ids=ids, labels=ids).loss / WORLD).backward()

    model = causal_lm("awd_lstm").train()
    optimizer = NTASGD(model.parameters(), lr=RATES[0], weight_decay=0.01, nonmono=1)
    train(model, optimizer, 0, STEPS, backward)
    assert optimizer.averaged_steps == STEPS - SWITCH_AT
    params = {name: p.detach() for name, p in model.named_parameters()}
    averages = {name: optimizer.state[p]["average"] for name, p in model.named_parameters()}
    start = dict(causal_lm("awd_lstm").named_parameters())
    assert sum(not torch.allclose(averages[n], params[n]) for n in params) > len(params) // 2
    for rank in range(WORLD):
        uninterrupted_params, uninterrupted_averages = got[rank]["uninterrupted"]
        assert uninterrupted_params.keys() == params.keys()
        for name in params:
            assert not torch.equal(params[name], start[name].detach()), name
            torch.testing.assert_close(uninterrupted_params[name], params[name], rtol=1e-5, atol=1e-6,
                                       msg=name)
            torch.testing.assert_close(uninterrupted_averages[name], averages[name], rtol=1e-5, atol=1e-6,
                                       msg=name)
        resumed_switch = got[rank]["resumed_switch"]
        assert resumed_switch["averaged_steps"] == (stop - SWITCH_AT if stop > SWITCH_AT else None)
        assert resumed_switch["average_in_params"] == swapped
        assert got[rank]["switch"] == optimizer.switch
        for kept, resumed in zip(got[rank]["uninterrupted"], got[rank]["resumed"]):
            for name in kept:
                assert torch.equal(resumed[name], kept[name]), name
