"""recipes/hf/train_clm.py --bptt (recipes/common/hf_bptt.py): the streams hold the tokens in order,
each rank its own; chunks run with the carried state equal each stream run whole; a resumed run
ends like an uninterrupted one, also resumed by one process from two ranks' checkpoint, and with
--variable_bptt's random chunk lengths (drawn per pass; each update's rate scaled by its length)."""
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers.hf_tiny_models import causal_lm
from helpers.train_clm import (
    ACCELERATE,
    SCRIPT,
    load_script,
    records,
    run,
    uninterrupted_and_resumed,
    word_text,
)
from ports import free_port
from safetensors.torch import load_file

from recipes.common import hf_bptt

LSTM = ["--model_type", "momentum_lstm", "--bptt", "--hidden_size", "16", "--num_layers", "2",
        "--block_size", "16", "--optimizer", "nt_asgd", "--learning_rate", "0.5"]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    return word_text(tmp_path_factory.mktemp("text") / "train.txt", 300)


def test_each_rank_holds_its_streams_in_order():
    tokens = torch.arange(1000)
    for rank in range(3):
        chunks = hf_bptt.StreamChunks(tokens, 7, rows=2, rank=rank, ranks=3, split="training")
        length = 999 // 6
        assert len(chunks) == -(-length // 7)
        inputs = torch.cat([chunks[t]["input_ids"] for t in range(len(chunks))], 1)
        targets = torch.cat([chunks[t]["targets"] for t in range(len(chunks))], 1)
        for i in range(2):
            start = (2 * rank + i) * length
            assert torch.equal(inputs[i], tokens[start:start + length])
            assert torch.equal(targets[i], tokens[start + 1:start + length + 1])
        assert [chunks[t]["chunk"] for t in range(len(chunks))] == list(range(len(chunks)))
    with pytest.raises(ValueError, match="the validation split has 5 input tokens, fewer than its 6 streams"):
        hf_bptt.StreamChunks(torch.arange(6), 7, rows=2, rank=0, ranks=3, split="validation")


def test_variable_chunks_are_drawn_per_pass_alike_on_every_rank_and_cover_the_streams():
    tokens = torch.arange(4001)

    def passes(rank, epoch):
        chunks = hf_bptt.StreamChunks(tokens, 20, rows=2, rank=rank, ranks=2, split="training", seed=3)
        chunks.set_epoch(epoch)
        return chunks, [chunks[t]["input_ids"].shape[1] for t in range(len(chunks))]

    (chunks, first), (_, other_rank), (_, again) = passes(0, 0), passes(1, 0), passes(0, 0)
    assert first == other_rank == again and first != passes(0, 1)[1]
    assert sum(first) == 1000 and min(first[:-1]) >= 5 and len(set(first)) > 5
    assert 15 < sum(first) / len(first) < 21
    inputs = torch.cat([chunks[t]["input_ids"] for t in range(len(chunks))], 1)
    assert torch.equal(inputs, tokens[:2000].view(2, 1000))
    fixed = hf_bptt.StreamChunks(tokens, 20, rows=2, rank=0, ranks=2, split="training")
    fixed.set_epoch(1)
    assert {fixed[t]["input_ids"].shape[1] for t in range(len(fixed))} == {20}


def test_rate_by_length_scales_each_update_by_its_chunks_mean_length_and_puts_it_back():
    weight = torch.nn.Parameter(torch.zeros(()))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    rate = hf_bptt.RateByLength(optimizer, 20)
    for lengths in ([10], [30, 20], [5, 5, 20]):
        for length in lengths:
            rate.add(length)
        before = weight.detach().clone()
        weight.grad = torch.ones(())
        optimizer.step()
        rate.updated()
        assert (before - weight).item() == pytest.approx(0.5 * sum(lengths) / len(lengths) / 20)
        assert optimizer.param_groups[0]["lr"] == 0.5


@pytest.mark.parametrize("cell", ["momentum", "adam"])
def test_chunks_with_the_carried_state_equal_each_stream_run_whole(cell, make_generator):
    """float64, no dropout: every target's loss from the chunks of two streams in a batch (a
    backward after each, as training runs them, which fails unless the state is detached) equals
    its loss from its stream run whole and alone; a zero state at the first chunk of a second pass."""
    model = causal_lm("lstm", **({} if cell == "momentum" else {"cell": cell})).double().train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    gen = make_generator()
    tokens = torch.randint(3, 60, (2 * 45 + 1,), generator=gen)
    chunks = hf_bptt.StreamChunks(tokens, 8, rows=2, rank=0, ranks=1, split="training")
    carried = hf_bptt.CarriedState(type(model).cache_class, model.config)
    for _ in range(2):
        losses = []
        for t in range(len(chunks)):
            loss = hf_bptt.chunk_loss(model, chunks[t], carried, "cpu", reduction="none")
            loss.sum().backward()
            losses.append(loss.detach().view(2, -1))
        got = torch.cat(losses, 1)
        alone = [model(input_ids=chunks.inputs[i:i + 1]).logits[0] for i in range(2)]
        want = torch.stack([F.cross_entropy(logits, chunks.targets[i], reduction="none")
                            for i, logits in enumerate(alone)])
        torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-12)
    with pytest.raises(RuntimeError, match="the batch is chunk 2 of the streams, but the carried state is "
                                           "the one before chunk 6"):
        carried.cache_for(2)


def test_a_carried_state_with_negative_step_counts_is_refused(tmp_path):
    """The stack does not read its carried step counters back to check them (it made them): a
    checkpoint's are checked where they come in."""
    from safetensors.torch import save_file
    carried = hf_bptt.CarriedState(None, None)
    for steps, refused in (([5, 3], False), ([5, -1], True)):
        save_file({"state_0": torch.zeros(2, 4), "state_1": torch.tensor(steps)},
                  str(tmp_path / hf_bptt.CARRIED_FILE), metadata={"chunk": "3"})
        if refused:
            with pytest.raises(ValueError, match=r"negative step counts \(state_1\)"):
                carried.load(tmp_path, rank=0, rows=2, ranks=1, device="cpu")
        else:
            carried.load(tmp_path, rank=0, rows=2, ranks=1, device="cpu")
            assert carried.chunk == 3 and carried.states[1].tolist() == steps


def test_a_resumed_run_ends_like_an_uninterrupted_one(text_file, tmp_path):
    """With dropout: the checkpoint holds the carried state, and the loader draws no random number
    from torch's generator (dropout's)."""
    common = [sys.executable, str(SCRIPT), "--train_file", str(text_file), "--max_train_steps", "6",
              "--eval_steps", "3", "--per_device_batch_size", "2", *LSTM]
    full, resumed = uninterrupted_and_resumed(common, tmp_path, 3)
    assert resumed["batches"] == full["batches"][3:]
    assert resumed["params"] == full["params"] and resumed["valid_loss"] == full["valid_loss"]
    (tmp_path / "full" / "step_3" / hf_bptt.CARRIED_FILE).unlink()
    proc = run([*common, "--output_dir", str(tmp_path / "again"),
                "--resume_from_checkpoint", str(tmp_path / "full" / "step_3")], tmp_path, check=False)
    assert proc.returncode != 0 and f"has no {hf_bptt.CARRIED_FILE}" in proc.stderr


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_a_variable_bptt_run_resumed_in_its_second_pass_ends_like_an_uninterrupted_one(tmp_path, precision):
    """Random chunk lengths, three chunks per update (each pass ending with a shorter update), two
    passes: the run resumed from a checkpoint inside the second pass skips the batches the first
    run trained on, pass by pass, and ends with its model. Under bf16 autocast the carried state
    keeps the weights' float32 (plugins/rnn/layers.py keeps the state out of autocast)."""
    text = word_text(tmp_path / "short.txt", 70)
    common = [sys.executable, str(SCRIPT), "--train_file", str(text), "--num_epochs", "2",
              "--per_device_batch_size", "2", "--gradient_accumulation_steps", "3", "--variable_bptt",
              "--mixed_precision", precision, *LSTM]
    full, resumed = uninterrupted_and_resumed(common, tmp_path, 8)
    assert 0 < len(resumed["batches"]) < len(full["batches"]) // 2
    assert resumed["batches"] == full["batches"][-len(resumed["batches"]):]
    assert resumed["params"] == full["params"] and resumed["valid_loss"] == full["valid_loss"]
    carried = load_file(str(tmp_path / "full" / "step_8" / hf_bptt.CARRIED_FILE))
    floating = [t for t in carried.values() if t.is_floating_point()]
    assert floating and all(t.dtype == torch.float32 and t.abs().sum() > 0 for t in floating)


def test_two_ranks_train_their_own_streams_and_one_process_resumes_them(text_file, tmp_path):
    """Two ranks of two streams each, without dropout; their checkpoint resumed by one process with
    the same four streams ends with the two ranks' model (DDP's mean of the ranks' losses is the
    mean over the four streams: their chunks are equally long)."""
    common = ["--train_file", str(text_file), "--max_train_steps", "4", "--dropout", "0", *LSTM]
    run([str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()),
         "--mixed_precision", "no", "--dynamo_backend", "no", str(SCRIPT), *common,
         "--per_device_batch_size", "2", "--output_dir", str(tmp_path / "two"), "--checkpointing_steps", "2",
         "--record_dir", str(tmp_path / "two_rec")], tmp_path)
    ranks = records(tmp_path / "two_rec")
    assert ranks[0]["params"] == ranks[1]["params"] and len(ranks[0]["batches"]) == 4
    assert not set(ranks[0]["batches"]) & set(ranks[1]["batches"])
    carried = load_file(str(tmp_path / "two" / "step_2" / hf_bptt.CARRIED_FILE))
    assert carried and all(t.shape[0] == 4 for t in carried.values())
    run([sys.executable, str(SCRIPT), *common, "--per_device_batch_size", "4", "--output_dir",
         str(tmp_path / "one"), "--resume_from_checkpoint", str(tmp_path / "two" / "step_2")], tmp_path)
    two, one = (load_file(str(tmp_path / name / "final" / "model.safetensors")) for name in ("two", "one"))
    assert two.keys() == one.keys()
    for name in two:
        torch.testing.assert_close(one[name], two[name], rtol=1e-5, atol=1e-6, msg=name)
    proc = run([sys.executable, str(SCRIPT), *common, "--per_device_batch_size", "3", "--output_dir",
                str(tmp_path / "three"), "--resume_from_checkpoint", str(tmp_path / "two" / "step_2")],
               tmp_path, check=False)
    assert proc.returncode != 0 and "holds the state of 4 streams; this run has 3" in proc.stderr


@pytest.mark.parametrize("extra, message", [
    (["--model_type", "momentum_transformer"], "carries the state of --model_type momentum_lstm only"),
    (["--model_type", "momentum_lstm", "--packing"], "--packing is not supported with it"),
    (["--model_name_or_path", "user/saved-lstm", "--context_parallel", "2"],
     "--context_parallel is not supported"),
])
def test_bptt_refuses_what_it_cannot_carry(extra, message, capsys):
    with pytest.raises(SystemExit):
        load_script().parse_args(["--train_file", "a.txt", "--output_dir", "out", "--bptt", *extra])
    assert f"argument --bptt: {message}" in capsys.readouterr().err


def test_variable_bptt_without_bptt_is_refused(capsys):
    with pytest.raises(SystemExit):
        load_script().parse_args(["--train_file", "a.txt", "--output_dir", "out", "--model_type",
                                  "momentum_lstm", "--variable_bptt"])
    assert "argument --variable_bptt: draws the chunk lengths of --bptt" in capsys.readouterr().err


def test_a_dataset_split_is_one_stream_of_its_rows_in_order(tmp_path):
    """Each row's tokens, then the end-of-sequence token; a dataset without a validation split gives
    the last --validation_split of the training stream."""
    import datasets
    script = load_script()
    rows = ["heavy ball", "momentum step", "a"]
    datasets.Dataset.from_dict({"text": rows}).save_to_disk(str(tmp_path / "ds"))
    args = script.parse_args(["--dataset_from_disk", str(tmp_path / "ds"), "--output_dir", "out", "--bptt",
                              "--model_type", "momentum_lstm", "--validation_split", "0.25"])
    tokenizer = script.Tokenizer("bytes")
    train, valid = script.token_streams(args, tokenizer)
    whole = [t for row in rows
             for t in tokenizer.hf(row, add_special_tokens=False)["input_ids"] + [tokenizer.eos]]
    assert torch.cat([train, valid]).tolist() == whole
    assert valid.numel() == int(len(whole) * 0.25)
