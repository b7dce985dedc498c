"""Random cases of generation, export and fairseq's LSTM models for
tests/test_random_configurations.py, on the causal LMs that helpers/random_cases.py draws (float64):
speculative decoding gives greedy decoding's tokens (a draft of the same family, either of which may
hold softmax layers only); beam search on a left-padded batch gives each prompt's beams alone; a
continued cache, the static cache and generate without a cache give one cached call's tokens and
scores; torch.export's program equals eager at other batches (and lengths); fairseq's LSTM translation
and language models decode incrementally, beams reordered, as their full forward. A failure names
the drawn case."""
import tempfile
from pathlib import Path

import torch

from .hf_tiny_models import Logits
from .random_cases import F64_TOL, assert_close, case_error, lstm_causal_lm, native_causal_lm, padded_ids


def causal_lm(rng, layers=None):
    """A native or LSTM causal LM that never stops early, and the function that drew it."""
    draw = rng.choice([native_causal_lm, lstm_causal_lm])
    model, case = draw(rng, layers)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model, case, draw


def prompts(rng, vocab, count):
    return [torch.randint(3, vocab, (rng.randint(1, 9),)) for _ in range(count)]


def generated(model, ids, mask, **kwargs):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, return_dict_in_generate=True, output_scores=True,
                              **kwargs)


def assert_same_generation(got, want, case, what, tol=F64_TOL):
    assert torch.equal(got.sequences, want.sequences), \
        case_error(case, f"{what}: {got.sequences.tolist()}, expected {want.sequences.tolist()}")
    for step, (a, b) in enumerate(zip(got.scores, want.scores)):
        finite = torch.isfinite(b)
        assert torch.equal(finite, torch.isfinite(a)), case_error(case, f"{what}: step {step}'s -inf scores")
        assert_close(a[finite], b[finite], case, f"{what}: step {step}'s scores", tol)


def check_speculative(rng):
    """Assisted decoding (a 1-layer draft of the target's family, native ones possibly of softmax
    layers only) and prompt lookup give greedy decoding's tokens, on a prompt that may repeat a
    phrase and may be left-padded (batch 1, as transformers requires)."""
    model, case, draw = causal_lm(rng)
    vocab = model.config.vocab_size
    prompt = torch.randint(3, vocab, (rng.randint(1, 5),)).repeat(rng.randint(1, 3))
    padding = rng.choice([0, 2])
    ids = torch.cat([torch.zeros(padding, dtype=torch.long), prompt])[None]
    mask = (torch.arange(ids.shape[1]) >= padding).long()[None]
    new = rng.randint(1, 16)
    draft, draft_case = draw(rng, 1)
    draft.generation_config.eos_token_id, draft.generation_config.pad_token_id = None, 0
    lookahead = rng.randint(1, 5)
    case.update(prompt=len(prompt), padding=padding, new=new, draft=draft_case,
                lookahead=lookahead)
    with torch.no_grad():
        greedy = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False)
        for option in (dict(assistant_model=draft, num_assistant_tokens=lookahead),
                       dict(prompt_lookup_num_tokens=lookahead)):
            got = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, **option)
            assert torch.equal(got, greedy), \
                case_error(case, f"{next(iter(option))}: {got.tolist()}, greedy {greedy.tolist()}")


def check_generation(rng):
    """One of: beam search on a left-padded batch equals each prompt's beams alone (sequences and
    their scores); generate continued from the cache it returned equals one call; the static cache
    (all-momentum models) equals the dynamic one; generate without a cache equals it (greedy,
    sampling under one seed, beams)."""
    model, case, _ = causal_lm(rng)
    sequences = prompts(rng, model.config.vocab_size, rng.randint(1, 3))
    ids, mask = padded_ids(sequences, "left")
    kinds = ["beams", "continued", "uncached"] + \
        (["static"] if set(case.get("layer_types", ["linear_attention"])) == {"linear_attention"} else [])
    kind = rng.choice(kinds)
    case.update(kind=kind, lengths=[len(s) for s in sequences])
    if kind == "beams":
        beams = rng.randint(2, 3)
        kwargs = dict(num_beams=beams, num_return_sequences=rng.randint(1, beams), do_sample=False,
                      max_new_tokens=rng.randint(1, 5), length_penalty=rng.choice([0.5, 1.0, 2.0]))
        batch, returned = generated(model, ids, mask, **kwargs), kwargs["num_return_sequences"]
        for row, s in enumerate(sequences):
            alone = generated(model, s[None], torch.ones(1, len(s), dtype=torch.long), **kwargs)
            rows = slice(row * returned, (row + 1) * returned)
            got = batch.sequences[rows, ids.shape[1] - len(s):]
            assert torch.equal(got, alone.sequences), \
                case_error(case, f"beams of prompt {row}: {got.tolist()}, alone {alone.sequences.tolist()}")
            assert_close(batch.sequences_scores[rows], alone.sequences_scores, case,
                         f"beam scores, prompt {row}")
    elif kind == "continued":
        first, second = rng.randint(1, 4), rng.randint(1, 4)
        whole = generated(model, ids, mask, max_new_tokens=first + second, do_sample=False)
        head = generated(model, ids, mask, max_new_tokens=first, do_sample=False)
        longer = torch.cat([mask, torch.ones(len(sequences), first, dtype=torch.long)], 1)
        tail = generated(model, head.sequences, longer, past_key_values=head.past_key_values,
                         max_new_tokens=second, do_sample=False)
        whole.scores = whole.scores[first:]
        assert_same_generation(tail, whole, case, f"{first} tokens, then {second} from the returned cache")
    else:
        kwargs = dict(max_new_tokens=rng.randint(1, 5))
        if kind == "static":
            kwargs.update(do_sample=False, num_beams=rng.choice([1, 2]))
            other = dict(cache_implementation="static")
        else:
            kwargs.update(rng.choice([dict(do_sample=False), dict(do_sample=True, top_k=rng.choice([0, 5])),
                                      dict(do_sample=False, num_beams=2)]))
            other = dict(use_cache=False)
        case.update(kwargs=kwargs)
        torch.manual_seed(case["lengths"][0])
        want = generated(model, ids, mask, **kwargs)
        torch.manual_seed(case["lengths"][0])
        got = generated(model, ids, mask, **kwargs, **other)
        assert_same_generation(got, want, case, f"{other}", tol=1e-7)


def padded_rows(rng, vocab, rows, length):
    """A batch whose rows are left-padded, right-padded or full, pad id 0."""
    mask = torch.ones(rows, length, dtype=torch.long)
    for row in range(rows):
        pad = rng.randint(0, length - 1)
        if rng.random() < 0.3:
            mask[row, :pad] = 0
        elif rng.random() < 0.3:
            mask[row, length - pad:] = 0
    return torch.randint(3, vocab, (rows, length)).masked_fill(mask == 0, 0), mask


def check_export(rng):
    """torch.export (non-strict, or strict at a fixed length) of the scoring forward with a dynamic
    batch, and a dynamic length or not: the program equals eager at the real tokens of other padded
    batches."""
    from torch.export import Dim, export
    model, case, _ = causal_lm(rng)
    vocab, length = model.config.vocab_size, rng.randint(2, 12)
    dynamic_length = rng.random() < 0.5
    strict = not dynamic_length and rng.random() < 0.3
    case.update(length=length, dynamic_length=dynamic_length, strict=strict)
    rows = Dim("batch", min=1, max=64)
    dims = {0: rows, 1: Dim("length", min=2, max=64)} if dynamic_length else {0: rows}
    scores = Logits(model)
    program = export(scores, padded_rows(rng, vocab, rng.randint(2, 3), length), dynamic_shapes=(dims, dims),
                     strict=strict).module()
    for _ in range(2):
        other_length = rng.randint(2, 20) if dynamic_length else length
        ids, mask = padded_rows(rng, vocab, rng.randint(1, 4), other_length)
        real = mask.bool()
        with torch.no_grad():
            assert_close(program(ids, mask)[real], scores(ids, mask)[real], case,
                         f"exported program at batch {tuple(ids.shape)}")


def fairseq_cell_args(rng):
    """`--lstm-*` flags of a random cell with random hyperparameters (nag with a restart or none)."""
    from .fairseq_cli import cell_flags
    cell = rng.choice(["lstm", "momentum", "adam", "rmsprop", "nag", "sr"])
    values = {"momentum": rng.choice([0.0, 0.5, 0.9]), "step_size": rng.choice([1.0, 0.6]),
              "beta": rng.choice([0.5, 0.9])}
    restart = None if cell == "nag" and rng.random() < 0.5 else rng.randint(1, 4)
    return cell_flags(cell, values, restart)


def beam_reorders(rng, steps, sentences, beams):
    """{step: new row order} at random steps, each sentence's rows kept to its own beams."""
    def reorder():
        return torch.tensor([s * beams + rng.randrange(beams)
                             for s in range(sentences) for _ in range(beams)])
    return {t: reorder() for t in range(1, steps) if rng.random() < 0.4}


def check_fairseq_lstm(rng):
    """fairseq's momentum_lstm (translation: its encoder's left-padded batch, sorted by length as
    fairseq batches it, equals each sentence alone) or momentum_lstm_lm: incremental decoding with
    random beam reorderings equals the full forward."""
    from .fairseq_cli import build_model, lm_args
    from .fairseq_decoding import check_incremental_decoding, padded_sentences
    translation = rng.random() < 0.5
    layers = str(rng.randint(1, 2))
    sizes = ["--decoder-layers", layers, "--decoder-embed-dim", "8", "--decoder-hidden-size",
             str(rng.choice([8, 12])), "--decoder-out-embed-dim", "8", "--dropout", "0",
             *fairseq_cell_args(rng)]
    if translation:
        task_args = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt"]
        arch_args = ["--arch", "momentum_lstm", "--encoder-layers", layers, "--encoder-embed-dim", "8",
                     "--encoder-hidden-size", str(rng.choice([8, 12])),
                     "--decoder-attention", rng.choice(["1", "0"]), *sizes]
        if rng.random() < 0.5:
            arch_args.append("--encoder-bidirectional")
    else:
        task_args, arch_args = lm_args("momentum_lstm_lm", *sizes)
    case = {"args": " ".join(arch_args)}
    with tempfile.TemporaryDirectory() as tmp:
        model, task, _ = build_model(Path(tmp), task_args, arch_args)
    model = model.double()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    beams, sentences = 2, rng.randint(1, 2)
    encoded = None
    if translation:
        lengths = sorted((rng.randint(1, 9) for _ in range(rng.randint(1, 3))), reverse=True)
        batch, alone = padded_sentences(task.source_dictionary, lengths, gen, left_pad=True)
        case.update(lengths=lengths)
        with torch.no_grad():
            outputs = model.encoder(batch, torch.tensor(lengths))[0]
            for i, s in enumerate(alone):      # the encoder's outputs are right-padded
                assert_close(outputs[:len(s), i], model.encoder(s[None], torch.tensor([len(s)]))[0][:, 0],
                             case, f"encoder, sentence {i}")
            sources = sorted((rng.randint(2, 8) for _ in range(sentences)), reverse=True)
            src, _ = padded_sentences(task.source_dictionary, sources, gen, left_pad=True)
            encoded = model.encoder(src.repeat_interleave(beams, 0),
                                    torch.tensor(sources).repeat_interleave(beams))
    steps = rng.randint(2, 8)
    tgt, _ = padded_sentences(task.target_dictionary, [steps] * (sentences * beams), gen, left_pad=False)
    reorders = beam_reorders(rng, steps, sentences, beams)
    case.update(steps=steps, reorders={t: r.tolist() for t, r in reorders.items()})
    try:
        check_incremental_decoding(model, tgt, reorders, encoder_out=encoded, rtol=F64_TOL, atol=F64_TOL)
    except AssertionError as error:
        raise AssertionError(case_error(case, f"incremental decoding: {error}")) from None
