"""Tiny causal LMs of the two native families (transformer, LSTM; the LSTM also as AWD-LSTM's stack,
whose last layer has the embedding's width and whose head has a bias) and left-padded batches."""
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import hf_momentum  # noqa: F401  (registers the model types with the Auto classes)
from plugins.rnn.variants import unread_hyperparameters

PAD = 0
FAMILIES = ["transformer", "lstm", "awd_lstm"]
AWD = dict(num_hidden_layers=3, embedding_size=8, last_hidden_size=8, lm_head_bias=True)


def config(family, **kwargs):
    if family == "transformer":
        base = dict(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=64, hidden_dropout=0.0,
                    attention_momentum=0.5, connection="adaptive", pad_token_id=PAD, bos_token_id=1,
                    eos_token_id=2)
        return AutoConfig.for_model("momentum_transformer", **{**base, **kwargs})
    base = dict(vocab_size=60, hidden_size=16, num_hidden_layers=2, cell="momentum", momentum=0.5,
                pad_token_id=PAD, bos_token_id=1, eos_token_id=2, initializer_range=0.5)
    if family == "awd_lstm":
        base.update(AWD)
    if "momentum" in unread_hyperparameters(kwargs.get("cell", "momentum")):
        del base["momentum"]       # a value the cell would ignore is refused
    return AutoConfig.for_model("momentum_lstm", **{**base, **kwargs})


def causal_lm(family, **kwargs):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config(family, **kwargs)).eval()


def left_padded(generator, lengths, total):
    ids = torch.randint(3, 60, (len(lengths), total), generator=generator)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, total - n:] = 1
    ids[mask == 0] = PAD
    return ids, mask


class Logits(torch.nn.Module):
    """A causal LM's scoring forward (logits, use_cache=False) as a module of (input_ids,
    attention_mask), the form the export tests hand to torch.export."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
