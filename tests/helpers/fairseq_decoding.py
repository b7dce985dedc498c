"""Batches and the incremental-decoding check shared by the fairseq model tests."""
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
