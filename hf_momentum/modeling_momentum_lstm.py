"""MomentumLSTM language model over `plugins.rnn.MomentumLSTM` (momentum_rnn.md).

Generation keeps the recurrent state (h, c, momentum v, second moment m, step counter) in a
`RecurrentCache`, so each new token costs one LSTM step (`MomentumLSTM.step`, whatever the
prompt length). Padding: the real tokens of each row
are moved to the front and run as a packed sequence, so a padded row (left or right) gets the
outputs and the final state of its sequence alone, and NAG/SR step counters count real tokens.
"""
from typing import Optional

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_momentum_lstm import MomentumLSTMConfig
from .momentum_rnn_core import MomentumLSTM, RecurrentState
from .recurrent_cache import RecurrentCache
from .saving import RemoteCodeMixin

AUTO_MAP = {
    "AutoConfig": "configuration_momentum_lstm.MomentumLSTMConfig",
    "AutoModel": "modeling_momentum_lstm.MomentumLSTMModel",
    "AutoModelForCausalLM": "modeling_momentum_lstm.MomentumLSTMForCausalLM",
}
STATE_FIELDS = ("h", "c", "v", "m", "step")


class MomentumLSTMCache(RecurrentCache):
    """The whole stack's `RecurrentState`, batch-first so that beam reordering selects rows;
    fields the cell does not have are stored as (batch, 0) placeholders."""

    def __init__(self, config: MomentumLSTMConfig):
        super().__init__(1, len(STATE_FIELDS))

    def get_lstm_state(self) -> Optional[RecurrentState]:
        states = self.get_states(0)
        if states is None:
            return None
        fields = [None if t.dim() == 2 and t.shape[1] == 0 else t for t in states]
        return RecurrentState(*(t if t is None or name == "step" else t.transpose(0, 1).contiguous()
                                for name, t in zip(STATE_FIELDS, fields)))

    def set_lstm_state(self, state: RecurrentState) -> None:
        batch = state.step.shape[0]
        self.set_states(0, [state.step.new_zeros(batch, 0) if t is None else
                            (t if name == "step" else t.transpose(0, 1))
                            for name, t in zip(STATE_FIELDS, state)])


class MomentumLSTMPreTrainedModel(RemoteCodeMixin, PreTrainedModel):
    config_class = MomentumLSTMConfig
    config: MomentumLSTMConfig
    base_model_prefix = "model"
    _no_split_modules = ["MomentumLSTM"]
    _skip_keys_device_placement = ["past_key_values"]
    auto_map = AUTO_MAP
    card_hyperparameters = ("cell", "momentum", "step_size", "beta", "eps", "restart", "num_hidden_layers")
    card_papers = ("momentum_rnn",)

    def _init_weights(self, module):
        if isinstance(module, MomentumLSTM):
            module.reset_parameters()
        else:
            super()._init_weights(module)


class MomentumLSTMModel(MomentumLSTMPreTrainedModel):
    def __init__(self, config: MomentumLSTMConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, config.pad_token_id)
        self.dropout = nn.Dropout(config.embedding_dropout)
        self.lstm = MomentumLSTM(config.embedding_size, config.hidden_size, config.num_hidden_layers,
                                 cell=config.cell, momentum=config.momentum, step_size=config.step_size,
                                 beta=config.beta, eps=config.eps, restart=config.restart,
                                 batch_first=True, dropout=config.dropout)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, inputs_embeds=None,
                use_cache=None, return_dict=None, **kwargs):
        """attention_mask: (batch, past + length), 1 for real tokens; padded tokens leave the
        state unchanged and get zero outputs."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.dropout(self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds)
        length = x.shape[1]
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if past_key_values is not None and not isinstance(past_key_values, MomentumLSTMCache):
            raise ValueError(f"past_key_values must be a MomentumLSTMCache, got {type(past_key_values).__name__}")
        cache = past_key_values if use_cache else None
        if use_cache and cache is None:
            cache = MomentumLSTMCache(self.config)
        state = cache.get_lstm_state() if cache is not None else None
        mask = None if attention_mask is None else attention_mask[:, -length:].to(x.device).bool()
        if length == 1 and (mask is None or bool(mask.all())):
            h, state = self.lstm.step(x[:, 0], state)  # one generated token: a cell step
            out = h[:, None]
        elif mask is None or bool(mask.all()):
            out, state = self.lstm(x, state)
        else:
            out, state = self._packed(x, mask, state)
        if cache is not None:
            cache.set_lstm_state(state)
            cache.advance(length)
        out = self.dropout(out)
        result = BaseModelOutputWithPast(last_hidden_state=out, past_key_values=cache)
        return result if return_dict is not False else result.to_tuple()

    def _packed(self, x, mask, state):
        lengths = mask.sum(-1)
        if bool((lengths == 0).any()):
            raise ValueError("every row needs at least one real token in attention_mask")
        order = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True)
        front = x.gather(1, order[..., None].expand_as(x))
        packed = pack_padded_sequence(front, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, state = self.lstm(packed, state)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        back = torch.argsort(order, dim=-1)
        out = out.gather(1, back[..., None].expand_as(out))
        return out * mask[..., None].to(out.dtype), state


class MomentumLSTMForCausalLM(MomentumLSTMPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: MomentumLSTMConfig):
        super().__init__(config)
        self.model = MomentumLSTMModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, inputs_embeds=None, labels=None,
                use_cache=None, return_dict=None, logits_to_keep=0, **kwargs):
        kwargs.pop("position_ids", None)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=past_key_values,
                             inputs_embeds=inputs_embeds, use_cache=use_cache, return_dict=True)
        hidden = outputs.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        out = CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=outputs.past_key_values)
        return out if return_dict is not False else out.to_tuple()

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        """generate() would build a DynamicCache; install the recurrent MomentumLSTMCache instead."""
        cache = model_kwargs.get("past_key_values")
        if cache is not None:
            if not isinstance(cache, MomentumLSTMCache):
                raise ValueError(f"past_key_values must be a MomentumLSTMCache, got {type(cache).__name__}")
            cache._is_user_defined = True
            return
        if generation_config.use_cache is False:
            return
        model_kwargs["past_key_values"] = MomentumLSTMCache(self.config)
