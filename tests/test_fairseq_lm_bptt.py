"""--task language_modeling_bptt (AWD-LSTM's truncated BPTT over contiguous streams): the batches cut
the token stream into contiguous streams, each rank walking its own in order; carrying the state
from chunk to chunk gives each stream the loss of one pass over it (float64), in validation and
training; models, options and world sizes it cannot serve are refused; and an interrupted fairseq-train
run, on one process and on two CPU ranks, resumes from the carried state it saved and ends with the
parameters of an uninterrupted one."""
import os
import re
import shutil
import sys

import pytest
import torch
from fairseq.data import iterators
from helpers.fairseq_cli import (
    BIN,
    REPO,
    USER_DIR,
    build_model,
    cli_env,
    preprocess_lm,
    run_cli,
    train,
    write_lm_text,
)
from helpers.launched import run_launched
from test_fairseq_training import EVERY_RANK_SAVES

import fairseq_momentum  # noqa: F401  (registers the task; allowlists fairseq's checkpoint types)
from fairseq_momentum.tasks.language_modeling_bptt import StreamDataset

TASK = ["--task", "language_modeling_bptt", "--tokens-per-sample", "5", "--batch-size", "3"]
LSTM = ["--arch", "momentum_lstm_lm", "--decoder-layers", "2", "--decoder-embed-dim", "8",
        "--decoder-hidden-size", "12", "--lstm-cell", "adam"]


@pytest.mark.parametrize("shards", [1, 2])
def test_each_rank_walks_its_own_contiguous_streams(shards):
    stream = torch.arange(100, 100 + 61, dtype=torch.int32)
    dataset = StreamDataset(stream, bptt=4, pad=1, split="train")
    batches = dataset.arrange(3, shards)
    streams = 3 * shards
    length = 60 // streams
    covered = []
    for shard in range(shards):
        itr = iterators.EpochBatchIterator(dataset, dataset.collater, batches, num_shards=shards,
                                           shard_id=shard, disable_shuffling=True)
        itr = itr.next_epoch_itr(shuffle=True)
        samples = list(itr)
        assert all(s["net_input"]["src_tokens"].shape[0] == 3 for s in samples)
        sources = torch.cat([s["net_input"]["src_tokens"] for s in samples], 1)
        targets = torch.cat([s["target"] for s in samples], 1)
        for row in range(3):
            first = (shard * 3 + row) * length
            assert torch.equal(sources[row], stream[first:first + length].long())
            assert torch.equal(targets[row], stream[first + 1:first + length + 1].long())
        covered.append(targets.reshape(-1))
    predicted = torch.cat(covered).sort().values
    assert torch.equal(predicted, stream[1:1 + streams * length].long()), "each token predicted once"
    assert 60 - streams * length < streams, "only the remainder is dropped"


def lstm_task(tmp_path, *extra):
    model, task, args = build_model(tmp_path, TASK, [*LSTM, *extra])
    torch.manual_seed(0)
    with torch.no_grad():                 # the cells start from identity recurrent matrices
        for parameter in model.parameters():
            parameter.normal_(0, 0.4)
    return model.double(), task, args


def stream_of(task, generator, length):
    words = torch.randint(task.dictionary.nspecial, len(task.dictionary), (length,), generator=generator)
    return torch.cat([torch.tensor([task.dictionary.eos()]), words]).to(torch.int32)


def one_pass_loss(model, dataset, streams):
    """Each stream's summed cross-entropy from one forward over all of it."""
    length = (dataset.stream.numel() - 1) // streams
    source = dataset.stream[:streams * length].long().view(streams, length)
    target = dataset.stream[1:streams * length + 1].long().view(streams, length)
    with torch.no_grad():
        logits = model(source)[0]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                             reduction="sum")


def test_carried_state_gives_each_stream_the_loss_of_one_pass(tmp_path, make_generator):
    model, task, args = lstm_task(tmp_path)
    criterion = task.build_criterion(args)
    dataset = StreamDataset(stream_of(task, make_generator(), 47), 5, task.dictionary.pad(), "valid")
    task.begin_valid_epoch(1, model)
    loss = sum(task.valid_step(sample, model, criterion)[0]
               for sample in task.get_batch_iterator(dataset, max_sentences=3).next_epoch_itr(shuffle=False))
    # fairseq's criterion takes log_softmax in float32 of the float64 logits
    torch.testing.assert_close(loss.double(), one_pass_loss(model, dataset, 3), rtol=1e-6, atol=0)
    task.begin_valid_epoch(2, model)
    fresh = [task.valid_step(sample, model, criterion)[0]
             for sample in task.get_batch_iterator(dataset, max_sentences=3).next_epoch_itr(shuffle=False)]
    torch.testing.assert_close(sum(fresh), loss, rtol=0, atol=1e-9), "each validation starts from zero"
    batches = task.get_batch_iterator(dataset, max_sentences=3).next_epoch_itr(shuffle=False)
    without_state = sum(criterion(model, sample)[0] for sample in batches)
    assert not torch.allclose(without_state, loss), "the state carried between chunks changes the loss"


def test_training_carries_a_detached_state_and_each_epoch_starts_afresh(tmp_path, make_generator):
    """Training batches carry the state the same way (gradients stop at each chunk's start)."""
    model, task, args = lstm_task(tmp_path, "--dropout", "0")      # train_step's losses are then comparable
    criterion = task.build_criterion(args)
    dataset = StreamDataset(stream_of(task, make_generator(), 31), 5, task.dictionary.pad(), "train")
    optimizer = type("NoOptimizer", (), {"backward": lambda self, loss: loss.backward()})()
    task.begin_epoch(1, model)
    total = 0
    for sample in task.get_batch_iterator(dataset, max_sentences=2).next_epoch_itr(shuffle=False):
        loss = task.train_step(sample, model, criterion, optimizer, 0)[0]
        total = total + loss.detach()
        assert all(t is None or t.grad_fn is None for layer in task.train_state.state for t in layer)
    model.eval()
    torch.testing.assert_close(total.double(), one_pass_loss(model, dataset, 2), rtol=1e-6, atol=0)
    task.begin_epoch(2, model)
    assert task.train_state.state is None


def test_variable_bptt_draws_awd_lengths_per_epoch_and_scales_the_rate(tmp_path, make_generator):
    """--variable-bptt: the training split's chunks are N(L, 5) long (at least 5), the same on every
    rank and when the epoch is run again, new each epoch; validation keeps L; each update's learning
    rate is scaled by its chunk's length / L, then restored."""
    model, task, args = build_model(tmp_path, [*TASK, "--tokens-per-sample", "20", "--variable-bptt"],
                                    [*LSTM, "--dropout", "0"])
    stream = stream_of(task, make_generator(), 4000)

    def chunk_lengths(training, epoch, shard=0):
        dataset = StreamDataset(stream, 20, task.dictionary.pad(), "train", training=training)
        itr = task.get_batch_iterator(dataset, max_sentences=2, num_shards=2, shard_id=shard, seed=1,
                                      epoch=epoch)
        return [sample["net_input"]["src_tokens"].shape[1] for sample in itr.next_epoch_itr(shuffle=True)]

    first = chunk_lengths(True, 1)
    assert first == chunk_lengths(True, 1) == chunk_lengths(True, 1, shard=1)
    assert first != chunk_lengths(True, 2)
    assert sum(first) == 4000 // 4 and min(first[:-1]) >= 5 and len(set(first)) > 5
    assert 15 < sum(first) / len(first) < 21
    fixed = chunk_lengths(False, 1)
    assert set(fixed[:-1]) == {20}

    class Recorder:
        def __init__(self):
            self.lr, self.seen = 0.5, []

        def get_lr(self):
            return self.lr

        def set_lr(self, lr):
            self.lr = lr

        def step(self):
            self.seen.append(self.lr)

        def backward(self, loss):
            loss.backward()

    optimizer = Recorder()
    dataset = StreamDataset(stream, 20, task.dictionary.pad(), "train", training=True)
    task.begin_epoch(1, model)
    for sample in list(task.get_batch_iterator(dataset, max_sentences=2, seed=1).next_epoch_itr())[:3]:
        task.train_step(sample, model, task.build_criterion(args), optimizer, 0)
        task.optimizer_step(optimizer, model, 0)
        length = sample["net_input"]["src_tokens"].shape[1]
        assert optimizer.seen[-1] == pytest.approx(0.5 * length / 20) and optimizer.lr == 0.5


def test_what_the_task_cannot_serve_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs a decoder that takes carried_state"):
        build_model(tmp_path, TASK, ["--arch", "momentum_transformer_lm", "--decoder-layers", "1",
                                     "--decoder-embed-dim", "8", "--decoder-ffn-embed-dim", "16",
                                     "--decoder-attention-heads", "2"])
    with pytest.raises(ValueError, match="--sample-break-mode must be none, got eos"):
        build_model(tmp_path, [*TASK, "--sample-break-mode", "eos"], LSTM)
    _, task, _ = build_model(tmp_path, TASK, LSTM)
    dataset = StreamDataset(torch.arange(4, 40, dtype=torch.int32), 5, 1, "train")
    with pytest.raises(ValueError, match="needs --batch-size"):
        task.get_batch_iterator(dataset, max_tokens=100)
    with pytest.raises(ValueError, match="35 input tokens, fewer than its 40 streams"):
        task.get_batch_iterator(dataset, max_sentences=20, num_shards=2)
    saved = {"h0": torch.zeros(1, 6, 12), "c0": torch.zeros(1, 6, 12), "step0": torch.zeros(6)}
    task.restore_train_state(saved, 1, 0, 2)
    assert task.train_state.state[0].h.shape == (1, 3, 12)
    with pytest.raises(ValueError, match="carries 6 streams, which 4 ranks cannot share"):
        task.restore_train_state({"h0": torch.zeros(1, 6, 12), "step0": torch.zeros(6)}, 1, 0, 4)


CLI = ["--task", "language_modeling_bptt", "--arch", "momentum_lstm_lm", "--decoder-layers", "2",
       "--decoder-embed-dim", "16", "--decoder-hidden-size", "24", "--share-decoder-input-output-embed",
       "--dropout", "0.2", "--weight-drop", "0.3", "--decoder-embed-dropout", "0.1",
       "--lstm-cell", "momentum", "--lstm-momentum", "0.5", "--tokens-per-sample", "8", "--batch-size", "4",
       "--batch-size-valid", "2", "--optimizer", "adam", "--lr", "0.003"]


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("bptt_lm")
    return preprocess_lm(write_lm_text(root / "text", seed=11), root / "bin")


def final_parameters(save, suffix=""):
    checkpoint = torch.load(save / f"checkpoint_last{suffix}.pt")
    return checkpoint["model"], checkpoint["optimizer_history"][-1]["num_updates"]


def assert_same_parameters(resumed, uninterrupted):
    assert resumed.keys() == uninterrupted.keys()
    for name in resumed:
        assert torch.equal(resumed[name], uninterrupted[name]), name


@pytest.mark.parametrize("bptt", [[], ["--variable-bptt"]], ids=["fixed", "variable"])
def test_an_interrupted_run_resumes_from_the_carried_state_it_saved(lm_data, tmp_path, bptt):
    """Stopped inside the first epoch (81 batches), the checkpoint keeps every stream's state; the
    resumed run continues it (and its chunk lengths), validating with the carried state on the way,
    and ends with the parameters of a run that never stopped."""
    common = [*CLI, *bptt, "--validate-interval-updates", "9", "--save-interval-updates", "100"]
    whole, interrupted = tmp_path / "whole", tmp_path / "interrupted"
    train(lm_data, whole, *common, "--max-update", "14")
    train(lm_data, interrupted, *common, "--max-update", "6")
    saved = torch.load(interrupted / "checkpoint_last.pt")["extra_state"]["train_iterator"]
    assert saved["iterations_in_epoch"] == 6
    carried = saved["carried_state"]
    assert carried["h0"].shape == (1, 4, 24) and carried["h0"].abs().sum() > 0
    log = train(lm_data, interrupted, *common, "--max-update", "14").stdout
    assert "valid on 'valid' subset" in log
    resumed, updates = final_parameters(interrupted)
    assert updates == 14
    assert_same_parameters(resumed, final_parameters(whole)[0])


def test_the_trained_model_is_scored_by_validate_with_its_state_and_by_eval_lm_in_blocks(lm_data, tmp_path):
    """fairseq-validate carries the state over the test split (AWD-LSTM's protocol at batch size 1);
    fairseq-eval-lm loads the split as --task language_modeling does and scores blocks."""
    save = tmp_path / "ckpt"
    train(lm_data, save, *CLI, "--max-update", "20")
    checkpoint = save / "checkpoint_last.pt"
    validated = run_cli("validate", lm_data, "--user-dir", USER_DIR, "--task", "language_modeling_bptt",
                        "--path", checkpoint, "--cpu", "--valid-subset", "test", "--batch-size", "1")
    output = validated.stdout + validated.stderr
    carried = float(re.search(r"valid on 'test' subset \| loss ([0-9.]+)", output).group(1))
    blocks = run_cli("eval-lm", lm_data, "--user-dir", USER_DIR, "--path", checkpoint, "--cpu",
                     "--gen-subset", "test", "--tokens-per-sample", "8", "--batch-size", "4")
    output = blocks.stdout + blocks.stderr
    assert int(re.search(r"Evaluated ([0-9,]+) tokens", output).group(1).replace(",", "")) > 0
    in_blocks = float(re.search(r"Loss \(base 2\): ([0-9.]+)", output).group(1))
    assert carried < in_blocks, "the state carried over the split helps"


def run_two_ranks(lm_data, tmp_path, save, max_update, every_rank_saves=False):
    logs = tmp_path / f"logs-{save.name}-{max_update}"
    env = cli_env(LOG_DIR=str(logs), PATH=f"{BIN}:{os.environ['PATH']}")
    if every_rank_saves:
        wrapper = tmp_path / "train_every_rank_saves.py"
        wrapper.write_text(EVERY_RANK_SAVES)
        env["FAIRSEQ_TRAIN"] = f"{sys.executable} {wrapper}"
    del env["OMP_NUM_THREADS"]
    cmd = [str(REPO / "recipes" / "launch_cpu_ddp.sh"), "2", str(lm_data), "--user-dir", USER_DIR,
           "--save-dir", str(save), *CLI, "--max-update", str(max_update), "--num-workers", "0",
           "--log-format", "simple", "--log-interval", "1", "--seed", "3", "--no-epoch-checkpoints"]
    proc = run_launched(cmd, cwd=tmp_path, env=env, timeout=400, log_dir=logs)
    assert proc.returncode == 0, proc.stderr[-3000:] + "".join(
        p.read_text()[-3000:] for p in logs.glob("*/attempt_0/*/*.log"))


def test_two_ranks_resume_every_ranks_streams(lm_data, tmp_path):
    """Rank 0 alone writes the checkpoint: it holds both ranks' streams (gathered after each update),
    and each rank resumes its own; the ranks end equal, and equal to a run that never stopped."""
    whole, interrupted = tmp_path / "whole", tmp_path / "interrupted"
    run_two_ranks(lm_data, tmp_path, whole, 8)
    run_two_ranks(lm_data, tmp_path, interrupted, 4)
    carried = torch.load(interrupted / "checkpoint_last.pt")["extra_state"]["train_iterator"]["carried_state"]
    assert carried["h0"].shape == (1, 8, 24)
    assert not torch.equal(carried["h0"][:, :4], carried["h0"][:, 4:]), "two ranks' streams"
    for rank in (0, 1):    # the ranks that all save also look for their own file to resume from
        shutil.copy(interrupted / "checkpoint_last.pt", interrupted / f"checkpoint_last-rank{rank}.pt")
    run_two_ranks(lm_data, tmp_path, interrupted, 8, every_rank_saves=True)
    ranks = [final_parameters(interrupted, f"-rank{rank}") for rank in (0, 1)]
    assert [updates for _, updates in ranks] == [8, 8]
    assert_same_parameters(ranks[1][0], ranks[0][0])
    assert_same_parameters(ranks[0][0], final_parameters(whole)[0])
