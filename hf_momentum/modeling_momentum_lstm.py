"""MomentumLSTM language model over `plugins.rnn.MomentumLSTM` (MomentumRNN).

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
from transformers.modeling_outputs import BaseModelOutputWithPast

from .configuration_momentum_lstm import MomentumLSTMConfig
from .modeling_common import (
    RecurrentCausalLMMixin,
    check_attention_mask,
    resolve_cache,
    resolve_flag,
    warn_no_attention_weights,
)
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
    supports_gradient_checkpointing = True
    _skip_keys_device_placement = ["past_key_values"]
    auto_map = AUTO_MAP
    card_hyperparameters = ("cell", "momentum", "step_size", "beta", "eps", "restart", "num_hidden_layers")
    card_papers = ("momentum_rnn",)

    def __init__(self, config: MomentumLSTMConfig, *inputs, **kwargs):
        config.validate()
        super().__init__(config, *inputs, **kwargs)

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
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, inputs_embeds=None,
                use_cache=None, output_hidden_states=None, output_attentions=None, return_dict=None,
                **kwargs):
        """attention_mask: (batch, past + length), 1 for real tokens; padded tokens leave the
        state unchanged and get zero outputs. A given `past_key_values` is continued even with
        use_cache=False. hidden_states: the (dropped-out) embeddings, then the output of the
        LSTM stack (`plugins.rnn.MomentumLSTM` runs its layers as one fused stack, so the
        outputs of the inner layers are not exposed)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.dropout(self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds)
        batch, length = x.shape[:2]
        output_hidden_states = resolve_flag(output_hidden_states, self.config, "output_hidden_states")
        warn_no_attention_weights(self, output_attentions, "an LSTM")
        cache = resolve_cache(self, past_key_values, use_cache, MomentumLSTMCache)
        past = cache.get_seq_length() if cache is not None else 0
        mask = check_attention_mask(attention_mask, batch, past, length)
        mask = None if mask is None else mask[:, past:].to(x.device)
        state = cache.get_lstm_state() if cache is not None else None
        if length == 0:
            out = x.new_zeros(batch, 0, self.config.hidden_size)
        elif self.gradient_checkpointing and self.training:
            out = self._gradient_checkpointing_func(self._run_without_state, x, mask)
        else:
            out, state = self._run(x, mask, state)
            if cache is not None:
                cache.set_lstm_state(state)
        if cache is not None:
            cache.advance(length)
        out = self.dropout(out)
        hidden_states = (x, out) if output_hidden_states else None
        result = BaseModelOutputWithPast(last_hidden_state=out, past_key_values=cache,
                                         hidden_states=hidden_states)
        return result if return_dict is not False else result.to_tuple()

    def _run(self, x, mask, state):
        if mask is None or bool(mask.all()):
            if x.shape[1] == 1:
                h, state = self.lstm.step(x[:, 0], state)  # one generated token: a cell step
                return h[:, None], state
            return self.lstm(x, state)
        return self._packed(x, mask, state)

    def _run_without_state(self, x, mask):
        """The stack from a zero state, outputs only: what gradient checkpointing recomputes
        (tensors in, one tensor out, so either checkpoint implementation tracks it)."""
        return self._run(x, mask, None)[0]

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


class MomentumLSTMForCausalLM(RecurrentCausalLMMixin, MomentumLSTMPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    cache_class = MomentumLSTMCache

    def __init__(self, config: MomentumLSTMConfig):
        super().__init__(config)
        self.model = MomentumLSTMModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, inputs_embeds=None,
                labels=None, use_cache=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, logits_to_keep=0, **kwargs):
        kwargs.pop("position_ids", None)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             past_key_values=past_key_values, inputs_embeds=inputs_embeds,
                             use_cache=use_cache, output_hidden_states=output_hidden_states,
                             output_attentions=output_attentions, return_dict=True)
        return self.causal_lm_output(outputs, labels, logits_to_keep, return_dict, **kwargs)
