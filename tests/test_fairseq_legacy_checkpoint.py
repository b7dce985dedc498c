"""A checkpoint saved by fairseq-train before fairseq's attention became glue over
plugins.transformer.MultiHeadAttention (tests/data/fairseq_legacy_checkpoint, written by its make.py
with the code of that time) loads through fairseq's own loader and gives the outputs that code
gave: its `out_proj` weights are renamed on load, and its --connection-* values, which
--connection none never reads, are unset."""
from pathlib import Path

import torch

import fairseq_momentum  # noqa: F401  (registers the architectures, allowlists the checkpoint types)

FIXTURE = Path(__file__).parent / "data" / "fairseq_legacy_checkpoint"


def test_the_fixture_holds_the_old_names_and_the_unread_values():
    state = torch.load(FIXTURE / "checkpoint.pt", weights_only=True)
    names = set(state["model"])
    assert "decoder.layers.0.encoder_attn.out_proj.weight" in names
    assert not any(".o_proj." in name for name in names)
    model = state["cfg"]["model"]
    assert (model.connection, model.connection_momentum, model.connection_step_size,
            model.connection_delta) == ("none", 0.3, 0.9, 0.001)


def test_legacy_checkpoint_loads_and_gives_its_outputs():
    from fairseq import checkpoint_utils

    [model], cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(FIXTURE / "checkpoint.pt")], arg_overrides={"data": str(FIXTURE)})
    model = model.double().eval()
    expected = torch.load(FIXTURE / "expected.pt", weights_only=True)
    with torch.no_grad():
        logits = model(expected["src_tokens"], expected["src_lengths"], expected["prev_output_tokens"])[0]
    torch.testing.assert_close(logits, expected["logits"], rtol=1e-10, atol=1e-10)
    assert (cfg.model.connection_momentum, cfg.model.connection_step_size, cfg.model.connection_delta) == (
        None, None, None)
    attn = model.decoder.layers[0].encoder_attn
    assert (attn.momentum, attn.step_size, attn.causal) == (0.5, 0.8, False)
    assert attn.out_proj is attn.o_proj           # fairseq's attribute name still reads the projection
    assert not any(".out_proj." in name for name in model.state_dict())
