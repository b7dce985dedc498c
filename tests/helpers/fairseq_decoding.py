"""Batches, the incremental-decoding check and the converted translation model's check shared by the
fairseq model tests."""
import torch


def padded_sentences(dictionary, lengths, generator, left_pad):
    """A padded batch of random sentences ending in EOS, and the sentences alone."""
    width = max(lengths)
    batch = torch.full((len(lengths), width), dictionary.pad())
    seqs = []
    for i, n in enumerate(lengths):
        s = torch.randint(dictionary.nspecial, len(dictionary), (n,), generator=generator)
        s[-1] = dictionary.eos()
        seqs.append(s)
        if left_pad:
            batch[i, width - n:] = s
        else:
            batch[i, :n] = s
    return batch, seqs


def check_incremental_decoding(model, tgt, reorders, *, encoder_out=None, **tolerance):
    """Decodes tgt one position at a time through fairseq's incremental state, reordering the rows
    as beam search does at the steps of `reorders` ({step: new_order}), and asserts that every step
    equals the full forward's output at that position."""
    with torch.no_grad():
        extra = {} if encoder_out is None else {"encoder_out": encoder_out}
        full = model.decoder(tgt, **extra)[0]
        state, rows = {}, torch.arange(tgt.size(0))
        for t in range(tgt.size(1)):
            if t in reorders:
                model.decoder.reorder_incremental_state_scripting(state, reorders[t])
                if encoder_out is not None:
                    encoder_out = model.encoder.reorder_encoder_out(encoder_out, reorders[t])
                    extra["encoder_out"] = encoder_out
                rows = rows[reorders[t]]
            step = model.decoder(tgt[rows, : t + 1], incremental_state=state, **extra)[0]
            torch.testing.assert_close(step[:, -1], full[rows, t], **tolerance)


def translation_checkpoint(checkpoint):
    """(the fairseq model in eval mode, the task's source dictionary) of a translation checkpoint."""
    from fairseq import checkpoint_utils
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    return model.eval(), task.source_dictionary


def greedy_hypothesis(model, dictionary, ids, max_len=8):
    """fairseq's greedy hypothesis (beam 1, at most `max_len` tokens) of the source `ids` under a
    translation model (`translation_checkpoint`)."""
    from fairseq.sequence_generator import SequenceGenerator
    generator = SequenceGenerator([model], dictionary, beam_size=1, max_len_a=0, max_len_b=max_len)
    with torch.no_grad():
        hypothesis = generator.generate([model], {"net_input": {
            "src_tokens": torch.tensor([ids]), "src_lengths": torch.tensor([len(ids)])}})[0][0]["tokens"]
    return hypothesis


def assert_translates_alone(folder, line, ids, translation, tmp_path, max_len=8):
    """The converted folder, in a process without this project's packages (its code comes from the
    folder), encodes `line` to `ids` and greedily translates it to `translation`."""
    from helpers.clean_process import run_clean
    proc = run_clean(f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True)
        model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        ids = tokenizer({line!r}, return_tensors="pt")["input_ids"]
        assert ids[0].tolist() == {ids!r}, ids
        with torch.no_grad():
            tokens = model.generate(input_ids=ids, do_sample=False, num_beams=1, max_new_tokens={max_len},
                                    min_new_tokens=1, suppress_tokens=[tokenizer.pad_token_id])
        text = tokenizer.decode(tokens[0], skip_special_tokens=True)
        assert text == {translation!r}, (text, {translation!r})
        print("OK", type(tokenizer).__module__)
    """, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert "OK transformers_modules" in proc.stdout


def assert_two_dictionaries(tokenizer, folder, lines, encode, decode):
    """A converted translation model's tokenizer of two dictionaries, saved to `folder` and loaded
    again: sources take `encode("source", line)`'s ids, `text_target=` `encode("target", line)`'s,
    decoding a target without `<unk>` gives `decode(ids)`, and a later call is in source mode again."""
    tokenizer.save_pretrained(folder)
    tokenizer = type(tokenizer).from_pretrained(folder)
    batch = tokenizer(lines, text_target=lines)
    decoded = 0
    for line, ids, labels in zip(lines, batch["input_ids"], batch["labels"]):
        assert ids == encode("source", line)
        assert labels == encode("target", line)
        if tokenizer.unk_token_id not in labels:
            assert tokenizer.decode(labels, skip_special_tokens=True) == decode(labels)
            decoded += 1
    assert decoded, "every target holds <unk>: decoding was not compared"
    assert tokenizer(lines[0])["input_ids"] == batch["input_ids"][0]
