"""Models loaded with accelerate's offload (`from_pretrained(device_map=..., offload_folder=...)`,
`accelerate.cpu_offload`): the weights of an offloaded module are on the meta device until its own
forward, where accelerate's hook brings them in. The native transformer handed its final norm to
the layer stack as an argument, which that hook moved (`Cannot copy out of meta tensor`); the AWD
stack drew its last layer's weight-drop masks from that layer's weights before the layer ran
(`Tensor on device meta`). Each is compared with the model loaded plainly: logits and hidden
states, or the training loss under one seed."""
import pytest
import torch
from accelerate import cpu_offload
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

from hf_momentum import (
    MomentumLSTMConfig,
    MomentumLSTMForCausalLM,
    MomentumSeq2SeqConfig,
    MomentumTransformerConfig,
)

VOCAB = 40
# "auto" under this budget keeps the embeddings in memory and offloads the layers and the final norm
MAPS = {"all-on-disk": dict(device_map={"": "disk"}),
        "auto": dict(device_map="auto", max_memory={"cpu": 20_000})}


def transformer(seq2seq):
    torch.manual_seed(0)
    sizes = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=24, max_position_embeddings=32, connection="momentum")
    if seq2seq:
        config = MomentumSeq2SeqConfig(**sizes, encoder_layers=2, pad_token_id=1, decoder_start_token_id=2)
        return AutoModelForSeq2SeqLM.from_config(config).eval()
    return AutoModelForCausalLM.from_config(MomentumTransformerConfig(**sizes)).eval()


@pytest.mark.parametrize("layout", MAPS)
@pytest.mark.parametrize("seq2seq", [False, True], ids=["causal", "seq2seq"])
def test_an_offloaded_transformer_computes_what_it_computes_in_memory(seq2seq, layout, tmp_path):
    model = transformer(seq2seq)
    model.save_pretrained(tmp_path / "model")
    loaded = type(model).from_pretrained(tmp_path / "model", offload_folder=tmp_path / "offload",
                                         **MAPS[layout]).eval()
    assert "disk" in set(loaded.hf_device_map.values())
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
    if seq2seq:
        inputs.update(decoder_input_ids=ids[:, :5])
    with torch.no_grad():
        got, expected = loaded(**inputs), model(**inputs)
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-6, atol=1e-6)
    hidden = "decoder_hidden_states" if seq2seq else "hidden_states"
    assert len(getattr(got, hidden)) == len(getattr(expected, hidden))
    for a, b in zip(getattr(got, hidden), getattr(expected, hidden)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def awd_lstm():
    torch.manual_seed(0)
    config = MomentumLSTMConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=3, cell="adam",
                                embedding_size=8, last_hidden_size=8, weight_drop=0.3)
    return MomentumLSTMForCausalLM(config)


@pytest.mark.parametrize("offload", ["device_map", "cpu_offload"])
def test_an_offloaded_awd_stack_trains_with_the_masks_it_draws_in_memory(offload, tmp_path):
    model = awd_lstm()
    model.save_pretrained(tmp_path / "model")
    if offload == "device_map":
        loaded = MomentumLSTMForCausalLM.from_pretrained(tmp_path / "model", device_map={"": "disk"},
                                                         offload_folder=tmp_path / "offload")
    else:
        loaded = cpu_offload(MomentumLSTMForCausalLM.from_pretrained(tmp_path / "model"),
                             execution_device="cpu")
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    losses = []
    for m in (model.train(), loaded.train()):
        torch.manual_seed(7)
        losses.append(m(input_ids=ids, labels=ids).loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=0)
    model.eval()
    with torch.no_grad():
        assert (model(input_ids=ids, labels=ids).loss - losses[0]).abs() > 1e-4   # the masks matter
