"""Context parallelism (`process_group=`): the sequence split over 2 and 3 gloo ranks in rank
order must give, on each rank's slice, the single-process float64 result on the whole sequence —
outputs, the returned states, and the gradients of q, k, v (and of rank 0's initial_state) when
each rank back-propagates its own part of the loss. One spawn per world size runs every case;
each rank writes its errors to a file and the assertions run here."""
import json

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import spawn_gloo

from plugins.attention import MomentumAttentionState, linear_attention, momentum_attention
from plugins.attention.context_parallel import shard_sequence, slice_bounds

B, H, DK, DV = 2, 2, 3, 4
TOL = 1e-10

# name: slices (tokens per rank), momentum, step_size, mask kind, initial_state, causal, chunk_size
CASES = {
    2: {
        "uneven beta>0": dict(slices=[5, 7], momentum=0.6, step_size=0.7),
        "one-token slice, beta=0 (linear_attention)": dict(slices=[1, 9], momentum=0.0, linear=True),
        "left padding, a row all padding on rank 0": dict(slices=[6, 5], momentum=0.5, mask="left"),
        "initial_state on rank 0, return_state": dict(slices=[4, 6], momentum=0.9, step_size=1.3,
                                                      initial=True),
        "non-causal eq. 14 with padding": dict(slices=[5, 4], momentum=0.7, causal=False, mask="left"),
        "packed: a segment across the ranks, an empty one": dict(slices=[7, 6], momentum=0.6,
                                                                 cu=[0, 3, 10, 10, 11, 13]),
    },
    3: {
        "uneven with a 1-token slice": dict(slices=[3, 1, 6], momentum=0.8, step_size=0.5),
        "empty middle slice, initial_state, padding": dict(slices=[4, 0, 5], momentum=0.4, initial=True,
                                                           mask="scattered"),
        "beta=0 with padding": dict(slices=[2, 5, 3], momentum=0.0, mask="scattered"),
        "non-causal eq. 14": dict(slices=[2, 3, 4], momentum=0.3, causal=False),
        "packed: a segment over all three ranks": dict(slices=[4, 1, 6], momentum=0.7, step_size=0.6,
                                                       cu=[0, 2, 9, 11]),
        "packed: boundaries at the slice ends, beta=0": dict(slices=[4, 1, 6], momentum=0.0,
                                                             cu=[0, 1, 4, 5, 6, 11]),
        "packed: an empty rank inside a segment": dict(slices=[3, 0, 5], momentum=0.5, cu=[0, 2, 7, 8]),
        "packed: a segment starting inside the middle rank": dict(slices=[3, 4, 4], momentum=0.8,
                                                                  cu=[0, 5, 11]),
    },
}


def _case_inputs(case, seed):
    """The whole sequence's inputs, the same on every rank (seeded)."""
    g = torch.Generator().manual_seed(seed)
    N = sum(case["slices"])
    batch = 1 if "cu" in case else B           # packed rows are one row
    q, k = (torch.randn(batch, H, N, DK, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(batch, H, N, DV, generator=g, dtype=torch.float64)
    weight = torch.randn(batch, H, N, DV, generator=g, dtype=torch.float64)
    mask = None
    if case.get("mask") == "left":
        mask = torch.ones(batch, N, dtype=torch.bool)
        mask[0, :3] = False                          # left padding inside rank 0's slice
        mask[1, :case["slices"][0]] = False          # row 1: rank 0's slice all padding
    elif case.get("mask") == "scattered":
        mask = torch.rand(batch, N, generator=g) > 0.3
        mask[:, -1] = True
    initial = None
    if case.get("initial"):
        initial = MomentumAttentionState(s=torch.randn(batch, H, DK, DV, generator=g, dtype=torch.float64),
                                         z=torch.rand(batch, H, DK, generator=g, dtype=torch.float64),
                                         m=torch.randn(batch, H, DK, DV, generator=g, dtype=torch.float64))
    return q, k, v, weight, mask, initial


def _attention(case, q, k, v, mask, initial, group, return_state=False):
    kwargs = dict(causal=case.get("causal", True), padding_mask=mask, chunk_size=4, process_group=group,
                  backend="torch")
    if "cu" in case:                    # the global offsets, the same on every rank
        kwargs["cu_seqlens"] = torch.tensor(case["cu"])
    if case.get("linear"):
        return linear_attention(q, k, v, **kwargs)
    return momentum_attention(q, k, v, momentum=case["momentum"], step_size=case.get("step_size", 1.0),
                              initial_state=initial, return_state=return_state, **kwargs)


def _leaf(t):
    return None if t is None else t.detach().clone().requires_grad_(True)


def _leaf_state(state):
    return None if state is None else MomentumAttentionState(*(_leaf(t) for t in (state.s, state.z, state.m)))


def _max_err(a, b):
    return float((a - b).abs().max()) if a.numel() else 0.0


def _run_case(case, seed, rank, group, ignore_earlier_ranks=False):
    """Errors of this rank's slice against the whole sequence run in one process."""
    q, k, v, weight, mask, initial = _case_inputs(case, seed)
    start = sum(case["slices"][:rank])
    end = start + case["slices"][rank]
    want_state = case.get("initial", False)

    ref = [_leaf(t) for t in (q, k, v)]
    ref_init = _leaf_state(initial)
    ref_out = _attention(case, *ref, mask, ref_init, None)
    (ref_out * weight).sum().backward()
    ref_prefix_state = None
    if want_state:      # the state after this rank's slice = the state after the prefix [0, end)
        cut = [t[:, :, :end].detach() for t in (q, k, v)]
        _, ref_prefix_state = _attention(case, *cut, None if mask is None else mask[:, :end], initial,
                                         None, return_state=True)

    mine = [_leaf(t[:, :, start:end]) for t in (q, k, v)]
    my_init = _leaf_state(initial) if rank == 0 else None
    my_mask = None if mask is None else mask[:, start:end]
    out = _attention(case, *mine, my_mask, my_init, None if ignore_earlier_ranks else group,
                     return_state=want_state)
    if want_state:
        out, state = out
    (out * weight[:, :, start:end]).sum().backward()

    errors = {"out": _max_err(out, ref_out[:, :, start:end])}
    for name, got, full in zip("qkv", mine, ref):
        errors[f"grad {name}"] = _max_err(got.grad, full.grad[:, :, start:end])
    if want_state:
        for part in ("s", "z", "m"):
            errors[f"state {part}"] = _max_err(getattr(state, part), getattr(ref_prefix_state, part))
    if my_init is not None:
        for part in ("s", "z", "m"):
            errors[f"grad initial_state.{part}"] = _max_err(getattr(my_init, part).grad,
                                                            getattr(ref_init, part).grad)
    return errors


def _error_cases(rank, group):
    """Each entry: the ValueError message this rank got (or None) for one bad call."""
    q = torch.randn(B, H, 3, DK, dtype=torch.float64)
    v = torch.randn(B, H, 3, DV, dtype=torch.float64)
    messages = {}

    def attempt(name, heads=H, batch=B, override=()):
        args = dict(momentum=0.5, process_group=group)
        args.update(override)
        try:
            momentum_attention(q[:batch, :heads], q[:batch, :heads], v[:batch, :heads], **args)
            messages[name] = None
        except ValueError as error:
            messages[name] = str(error)

    attempt("momentum differs", override=dict(momentum=0.5 if rank == 0 else 0.6))
    attempt("heads differ", heads=H if rank == 0 else 1)
    attempt("feature_map differs", override=dict(feature_map="elu" if rank == 0 else "relu"))
    attempt("causal differs", override=dict(causal=rank == 0))
    attempt("initial_state on rank 1", override=dict(
        initial_state=MomentumAttentionState.zeros(B, H, DK, DV, dtype=torch.float64, device="cpu")
        if rank == 1 else None))
    attempt("invalid eps on rank 1", override=dict(eps=-1.0 if rank == 1 else 1e-6))
    world = dist.get_world_size(group)
    attempt("cu_seqlens differs", batch=1, override=dict(
        cu_seqlens=torch.tensor([0, 1 + (rank == 1), 3 * world])))
    attempt("cu_seqlens over the slice only", batch=1, override=dict(cu_seqlens=torch.tensor([0, 1, 3])))
    attempt("cu_seqlens non-causal", batch=1, override=dict(cu_seqlens=torch.tensor([0, 3 * world]),
                                                            causal=False))
    return messages


def _worker(rank, world, out_dir, seed):
    group = dist.group.WORLD
    results = {name: _run_case(case, seed + i, rank, group)
               for i, (name, case) in enumerate(CASES[world].items())}
    results["ignoring earlier ranks"] = _run_case(CASES[world][next(iter(CASES[world]))], seed, rank,
                                                  group, ignore_earlier_ranks=True)
    results["errors"] = _error_cases(rank, group)
    piece, offset = shard_sequence(torch.arange(2 * 10).reshape(2, 10), group, dim=-1)
    results["shard"] = {"offset": offset, "piece": piece.tolist()}
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(results, f)


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def ranks(request, tmp_path_factory):
    """Spawns `world` gloo ranks once; returns (world, [results of each rank])."""
    world = request.param
    out_dir = tmp_path_factory.mktemp(f"cp{world}")
    spawn_gloo(_worker, world, str(out_dir), 1000 * world)
    return world, [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def test_each_rank_equals_the_whole_sequence_forward_and_backward(ranks):
    world, results = ranks
    for name in CASES[world]:
        for rank, result in enumerate(results):
            for what, err in result[name].items():
                assert err < TOL, f"{name}: rank {rank} {what} differs by {err:.3g} from the whole sequence"


def test_a_rank_that_ignores_the_earlier_ranks_is_caught(ranks):
    """The check above can fail: each slice alone (no process_group) differs on every rank but the
    first, in outputs and in gradients."""
    world, results = ranks
    for rank, result in enumerate(results):
        errors = result["ignoring earlier ranks"]
        if rank == 0:
            assert errors["out"] < TOL          # rank 0's output needs no earlier rank ...
            assert errors["grad k"] > 1e-3      # ... but its keys' gradients come from the later ranks
        else:
            assert errors["out"] > 1e-3 and errors["grad q"] > 1e-3


def test_disagreeing_ranks_raise_the_same_value_error_naming_the_argument(ranks):
    world, results = ranks
    expected = {"momentum differs": "momentum", "heads differ": "head count",
                "feature_map differs": "feature_map", "causal differs": "causal",
                "initial_state on rank 1": "initial_state", "cu_seqlens differs": "cu_seqlens",
                "cu_seqlens over the slice only": "whole row"}
    for name, word in expected.items():
        messages = [result["errors"][name] for result in results]
        for rank, message in enumerate(messages):
            assert message is not None and word in message, f"{name}: rank {rank} got {message!r}"
    good, bad = (result["errors"]["invalid eps on rank 1"] for result in results[:2])
    assert bad is not None and "eps" in bad
    assert good is not None and "rank(s) [1]" in good
    assert all("causal" in result["errors"]["cu_seqlens non-causal"] for result in results)


def test_shard_sequence_splits_in_rank_order_with_global_offsets(ranks):
    world, results = ranks
    whole = torch.arange(2 * 10).reshape(2, 10)
    pieces = [torch.tensor(result["shard"]["piece"]).reshape(2, -1) for result in results]
    assert torch.equal(torch.cat(pieces, dim=1), whole)
    offsets = [result["shard"]["offset"] for result in results]
    assert offsets == [sum(p.shape[1] for p in pieces[:r]) for r in range(world)]
    assert max(p.shape[1] for p in pieces) - min(p.shape[1] for p in pieces) <= 1


@pytest.mark.parametrize("length, world", [(10, 3), (2, 4), (0, 2), (7, 1)])
def test_slice_bounds_cover_the_sequence_contiguously(length, world):
    bounds = [slice_bounds(length, world, r) for r in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(bounds[r][1] == bounds[r + 1][0] for r in range(world - 1))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_process_group_must_be_a_process_group():
    q = torch.randn(1, 1, 2, 2)
    with pytest.raises(ValueError, match="process_group"):
        momentum_attention(q, q, q, momentum=0.5, process_group="world")
