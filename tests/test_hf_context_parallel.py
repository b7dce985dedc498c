"""Context parallelism for the native momentum transformer (hf_momentum.context_parallel): a batch
split along the sequence over 2 and 3 gloo ranks must give, on each rank's slice, the float64
logits of one process on the whole batch; the ranks' losses must add up to its loss and their
parameter gradients (summed over ranks, as data-parallel training sums them) to its gradients;
for the causal LM and for the per-token heads (token classification, causal or bidirectional, and
the masked LM, whose eq. 14 attention spans every rank).
One spawn per world size runs every case; each rank writes its errors to a file and the
assertions run here."""
import json

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import spawn_gloo
from helpers.launched import run_launched
from ports import free_port

from hf_momentum import (
    MomentumLSTMConfig,
    MomentumLSTMForCausalLM,
    MomentumTransformerConfig,
    MomentumTransformerForCausalLM,
    MomentumTransformerForMaskedLM,
    MomentumTransformerForQuestionAnswering,
    MomentumTransformerForSequenceClassification,
    MomentumTransformerForTokenClassification,
)
from hf_momentum.context_parallel import enable_context_parallel, shard_batch, whole_sequence_loss
from plugins.attention.context_parallel import slice_bounds

TOL = 1e-10
# transformers' causal-LM loss casts the logits to float32: the loss agrees to float32 rounding
LOSS_TOL = 2e-6
VOCAB = 13

# name: sequence length, config overrides, padding
CASES = {
    2: {
        "uneven slices, momentum connection": dict(length=7, config=dict(connection="momentum")),
        "left padding, a row all padding on rank 0": dict(length=8, padding=True),
    },
    3: {
        "uneven slices, adaptive connection, post-LN": dict(length=8, config=dict(connection="adaptive",
                                                                                  layer_norm="post")),
        "left padding over two ranks": dict(length=10, padding=True, config=dict(attention_momentum=0.9)),
        "fewer tokens than ranks: an empty slice": dict(length=2),
    },
}


def _model(overrides, seed):
    torch.manual_seed(seed)
    settings = dict(vocab_size=VOCAB, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=16, max_position_embeddings=16, attention_momentum=0.6,
                    hidden_dropout=0.0, attention_dropout=0.0, embedding_dropout=0.0, initializer_range=0.5)
    config = MomentumTransformerConfig(**dict(settings, **overrides))
    return MomentumTransformerForCausalLM(config).double()


def _batch(case, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, case["length"]), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone()}
    if case.get("padding"):
        mask = torch.ones_like(ids)
        mask[0, :3] = 0
        mask[1, :case["length"] // 2 + 1] = 0      # more than rank 0's slice
        batch["attention_mask"] = mask
        batch["labels"][mask == 0] = -100
    return batch


def _max_err(a, b):
    return float((a - b).detach().abs().max()) if a.numel() else 0.0


def _run_case(case, seed, group, use_group=True):
    """Errors of this rank against the whole batch in one process."""
    ref_model = _model(case.get("config", {}), seed)
    batch = _batch(case, seed)
    ref = ref_model(**batch, use_cache=False)
    ref.loss.backward()

    model = enable_context_parallel(_model(case.get("config", {}), seed), group)
    inputs = shard_batch(batch, group)
    if not use_group:
        enable_context_parallel(model, None)
    out = model(**inputs)
    out.loss.backward()
    start, stop = slice_bounds(case["length"], dist.get_world_size(group), dist.get_rank(group))
    errors = {"input_ids": _max_err(inputs["input_ids"], batch["input_ids"][:, start:stop]),
              "logits": _max_err(out.logits, ref.logits[:, start:stop]),
              "loss": abs(float(whole_sequence_loss(out.loss, group) - ref.loss.detach()))}
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(grads, group=group)
    errors["gradients"] = _max_err(grads, torch.cat([p.grad.flatten() for p in ref_model.parameters()]))
    return errors


# per-token heads (shard_batch(..., shift_labels=False)): the token classifier causal and
# bidirectional, the masked LM bidirectional (eq. 14 over every rank)
HEADS = {"token classification": (MomentumTransformerForTokenClassification, True),
         "token classification, bidirectional": (MomentumTransformerForTokenClassification, False),
         "masked LM": (MomentumTransformerForMaskedLM, False)}
LABELS = 3


def _head(name, overrides, seed):
    head, causal = HEADS[name]
    torch.manual_seed(seed)
    settings = dict(vocab_size=VOCAB, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=16, max_position_embeddings=16, attention_momentum=0.6,
                    hidden_dropout=0.0, attention_dropout=0.0, embedding_dropout=0.0, initializer_range=0.5,
                    is_causal=causal, num_labels=LABELS)
    return head(MomentumTransformerConfig(**dict(settings, **overrides))).double()


def _head_batch(name, case, seed):
    """The case's batch with a label per token: a class, or for the masked LM the token at a third
    of the positions (the others -100); -100 at padding."""
    batch = _batch(case, seed)
    g = torch.Generator().manual_seed(seed + 1)
    if HEADS[name][0] is MomentumTransformerForTokenClassification:
        labels = torch.randint(0, LABELS, batch["input_ids"].shape, generator=g)
    else:
        masked = torch.rand(batch["input_ids"].shape, generator=g) < 1 / 3
        labels = torch.where(masked, batch["input_ids"], -100)
    if "attention_mask" in batch:
        labels[batch["attention_mask"] == 0] = -100
    return dict(batch, labels=labels)


def _run_head_case(name, case, seed, group):
    """Errors of this rank's per-token head against the whole batch in one process."""
    ref_model = _head(name, case.get("config", {}), seed)
    batch = _head_batch(name, case, seed)
    ref = ref_model(**batch)
    ref.loss.backward()
    model = enable_context_parallel(_head(name, case.get("config", {}), seed), group)
    out = model(**shard_batch(batch, group, shift_labels=False))
    out.loss.backward()
    start, stop = slice_bounds(case["length"], dist.get_world_size(group), dist.get_rank(group))
    errors = {"logits": _max_err(out.logits, ref.logits[:, start:stop]),
              "loss": abs(float(whole_sequence_loss(out.loss, group) - ref.loss.detach()))}
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(grads, group=group)
    errors["gradients"] = _max_err(grads, torch.cat([p.grad.flatten() for p in ref_model.parameters()]))
    return errors


def _error_cases(group):
    """The ValueError message each bad call raised on this rank (None if it raised nothing)."""
    model = enable_context_parallel(_model({}, 0), group)
    ids = torch.randint(0, VOCAB, (1, 6))
    calls = {
        "no position_ids": lambda: model(input_ids=shard_batch({"input_ids": ids}, group)["input_ids"],
                                         use_cache=False),
        "a cache": lambda: model(**dict(shard_batch({"input_ids": ids}, group), use_cache=True)),
        "position_ids in the batch": lambda: shard_batch({"input_ids": ids, "position_ids": ids}, group),
        "labels of another shape": lambda: shard_batch({"input_ids": ids, "labels": ids[:, :3]}, group),
        "a stock model": lambda: enable_context_parallel(MomentumLSTMForCausalLM(MomentumLSTMConfig(
            vocab_size=VOCAB, hidden_size=4, num_hidden_layers=1)), group),
        "a hybrid": lambda: enable_context_parallel(MomentumTransformerForCausalLM(MomentumTransformerConfig(
            vocab_size=VOCAB, hidden_size=4, num_hidden_layers=2, num_attention_heads=1,
            layer_types=["linear_attention", "full_attention"])), group),
    }
    for name, head in (("sequence classification", MomentumTransformerForSequenceClassification),
                       ("question answering", MomentumTransformerForQuestionAnswering)):
        calls[name] = lambda head=head: enable_context_parallel(head(MomentumTransformerConfig(
            vocab_size=VOCAB, hidden_size=4, num_hidden_layers=1, num_attention_heads=1)), group)
    tagger = enable_context_parallel(_head("token classification", {}, 0), group)
    labelled = {"input_ids": ids, "labels": ids % LABELS}
    calls["a causal LM's shifted labels for a token classifier"] = \
        lambda: tagger(**shard_batch(labelled, group))
    messages = {}
    for name, call in calls.items():
        try:
            call()
            messages[name] = None
        except ValueError as error:
            messages[name] = str(error)
    return messages


def _worker(rank, world, out_dir, seed):
    group = dist.group.WORLD
    results = {name: _run_case(case, seed + i, group)
               for i, (name, case) in enumerate(CASES[world].items())}
    first = next(iter(CASES[world].values()))
    results["without the process group"] = _run_case(first, seed, group, use_group=False)
    results["heads"] = {f"{head}, {name}": _run_head_case(head, case, seed + i, group)
                        for head in HEADS for i, (name, case) in enumerate(CASES[world].items())}
    results["errors"] = _error_cases(group)
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(results, f)


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def ranks(request, tmp_path_factory):
    world = request.param
    out_dir = tmp_path_factory.mktemp(f"hfcp{world}")
    spawn_gloo(_worker, world, str(out_dir), 100 * world)
    return world, [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def test_each_rank_equals_the_whole_batch_logits_loss_and_gradients(ranks):
    world, results = ranks
    for name in CASES[world]:
        for rank, result in enumerate(results):
            for what, err in result[name].items():
                tol = LOSS_TOL if what == "loss" else TOL
                assert err < tol, f"{name}: rank {rank} {what} differs by {err:.3g} from one process"


def test_per_token_heads_equal_the_whole_batch_logits_loss_and_gradients(ranks):
    """Token classification (causal and bidirectional) and the masked LM, with their labels sliced
    unshifted: each rank's logits are one process's on its slice, and the losses and gradients
    summed over the ranks are one process's."""
    world, results = ranks
    for rank, result in enumerate(results):
        assert len(result["heads"]) == len(HEADS) * len(CASES[world])
        for name, errors in result["heads"].items():
            for what, err in errors.items():
                tol = LOSS_TOL if what == "loss" else TOL
                assert err < tol, f"{name}: rank {rank} {what} differs by {err:.3g} from one process"


def test_without_the_process_group_the_check_fails(ranks):
    """Global positions and labels alone are not enough: each slice attending only to itself
    differs from one process on every rank but the first, and so do the loss and gradients."""
    world, results = ranks
    errors = [result["without the process group"] for result in results]
    assert errors[0]["logits"] < TOL
    assert all(e["logits"] > 1e-3 for e in errors[1:])
    assert all(e["loss"] > 100 * LOSS_TOL and e["gradients"] > 1e-3 for e in errors)


def test_bad_inputs_raise_value_errors_naming_the_argument(ranks):
    expected = {"no position_ids": "position_ids", "a cache": "use_cache",
                "position_ids in the batch": "position_ids", "labels of another shape": "batch['labels']",
                "a stock model": "native momentum_transformer", "sequence classification": "pools",
                "question answering": "one answer span",
                "a causal LM's shifted labels for a token classifier": "shift_labels=False",
                "a hybrid": "layer_types has softmax layers ([1])"}
    for result in ranks[1]:
        for name, word in expected.items():
            message = result["errors"][name]
            assert message is not None and word in message, f"{name}: got {message!r}"


def test_enable_context_parallel_needs_a_process_group():
    model = _model({}, 0)
    with pytest.raises(ValueError, match="group"):
        enable_context_parallel(model, "world")


def test_train_clm_context_parallel_under_torchrun(tmp_path):
    """Two CPU ranks, one context group: both ranks train on the same batches (each on half of
    every sequence) and end with the same parameters."""
    import os
    import random
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    words = ["momentum", "attention", "linear", "state", "token", "heavy", "ball", "step"]
    text = tmp_path / "train.txt"
    text.write_text(" ".join(random.Random(0).choice(words) for _ in range(400)))
    cmd = [str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", "2", "--master-port",
           str(free_port()), str(repo / "recipes" / "hf" / "train_clm.py"), "--train_file", str(text),
           "--output_dir", str(tmp_path / "out"), "--record_dir", str(tmp_path / "rec"),
           "--context-parallel", "2", "--max_train_steps", "3", "--hidden_size", "16", "--num_layers", "1",
           "--num_heads", "2", "--block_size", "33", "--per_device_batch_size", "2", "--dropout", "0"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               ACCELERATE_USE_CPU="1", PYTHONPATH=str(repo))     # this checkout's hf_momentum
    proc = run_launched(cmd, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = [json.loads((tmp_path / "rec" / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["step"] == ranks[1]["step"] == 3
    assert len(ranks[0]["batches"]) == 3 and ranks[0]["batches"] == ranks[1]["batches"]
    assert ranks[0]["params"] == ranks[1]["params"]
    assert (tmp_path / "out" / "final" / "model.safetensors").exists()


@pytest.mark.parametrize("extra, word", [(["--model_type", "llama"], "momentum_transformer only"),
                                         (["--resume_from_checkpoint", "latest"], "not supported")])
def test_train_clm_context_parallel_arguments(extra, word, capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "recipes" / "hf" / "train_clm.py"
    spec = importlib.util.spec_from_file_location("train_clm_cp", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit):
        script.parse_args(["--train_file", "a.txt", "--output_dir", "o", "--context-parallel", "2", *extra])
    err = capsys.readouterr().err
    assert "--context_parallel" in err and word in err
    with pytest.raises(SystemExit):
        script.parse_args(["--train_file", "a.txt", "--output_dir", "o", "--context_parallel", "0"])
    assert "--context_parallel: expected an integer >= 1" in capsys.readouterr().err
