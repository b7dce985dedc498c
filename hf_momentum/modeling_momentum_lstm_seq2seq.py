"""Attentional MomentumLSTM encoder-decoder (MomentumRNN's cells in fairseq's `--arch momentum_lstm`
translation model): `AutoModelForSeq2SeqLM`, `generate()` with greedy, sampling and beam search,
Seq2SeqTrainer.

The encoder runs a `plugins.rnn.MomentumLSTM` stack (bidirectional or not) over the real tokens of
each source, so a padded row (left or right) gets the outputs and final states of its source alone.
The decoder steps a MomentumLSTM stack one target token at a time (a call of the stack module with
`one_step=True`, i.e. `MomentumLSTM.step`): its first
layer reads the token's embedding and the previous step's output (input feeding), its initial h and
c are the encoder's final ones, and the last layer's output attends to the encoder's outputs (global
dot-product attention over the real source tokens). Generation keeps the decoder's state (h, c,
momentum v, second moment m, step counter), the fed-back output and the encoder's outputs in a
`MomentumLSTMSeq2SeqCache` (fixed buffers in `StaticMomentumLSTMSeq2SeqCache`, for a compiled decode
step), so each new token costs one step of the stack and one attention over the source; beam search
reorders it. A padded target token (`decoder_attention_mask` 0) leaves the state
as it was and gets a zero output.
"""
from dataclasses import dataclass
from functools import partial
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqModelOutput

from .cache_history import replay_accepted
from .configuration_momentum_lstm_seq2seq import MomentumLSTMSeq2SeqConfig
from .modeling_common import (
    RecurrentCausalLMMixin,
    Seq2SeqEmbeddingsMixin,
    Seq2SeqLMMixin,
    check_attention_mask,
    given_cache,
    output_with_cache,
    resolve_cache,
    resolve_flag,
    static_padding_mask,
    warn_no_attention_weights,
)
from .modeling_momentum_lstm import (
    CheckpointedRun,
    MomentumLSTMCache,
    MomentumLSTMStack,
    packed_run,
    where_real,
)
from .momentum_rnn_core import (
    MomentumLSTM,
    RecurrentState,
    exported_scan,
    exports_a_symbolic,
    is_exporting,
    onnx_exporting,
    read_hyperparameters,
)
from .packing import has_packing_kwargs
from .recurrent_cache import StaticStateMixin
from .saving import RemoteCodeMixin

AUTO_MAP = {
    "AutoConfig": "configuration_momentum_lstm_seq2seq.MomentumLSTMSeq2SeqConfig",
    "AutoModel": "modeling_momentum_lstm_seq2seq.MomentumLSTMSeq2SeqModel",
    "AutoModelForSeq2SeqLM": "modeling_momentum_lstm_seq2seq.MomentumLSTMSeq2SeqForConditionalGeneration",
}


@dataclass
class MomentumLSTMEncoderOutput(BaseModelOutput):
    """The encoder's outputs (batch, source length, encoder_output_size), zero at padding, and its
    final h and c (batch, layers, encoder_output_size), which start the decoder."""

    final_hidden_state: Optional[torch.FloatTensor] = None
    final_cell_state: Optional[torch.FloatTensor] = None


class MomentumLSTMSeq2SeqCache(MomentumLSTMCache):
    """The decoder stack's `RecurrentState` and its last output (`input_feed`, which the next step
    reads), and from the first decoding step on the encoder's outputs the attention reads (`memory`:
    (outputs, real-token mask or None)), so later steps need no source; beam search reorders all of
    them. Speculative decoding's crop restores the states and keeps the memory."""

    extra_states = ("input_feed",)
    memory: Optional[tuple] = None

    def set_memory(self, source: torch.Tensor, real: Optional[torch.Tensor]) -> None:
        self.memory = (source, real)

    def reset(self) -> None:
        super().reset()
        self.memory = None

    def _map(self, fn) -> None:
        super()._map(fn)
        if self.memory is not None:
            self.memory = tuple(None if t is None else fn(t) for t in self.memory)


class StaticMomentumLSTMSeq2SeqCache(StaticStateMixin, MomentumLSTMSeq2SeqCache):
    """A `MomentumLSTMSeq2SeqCache` for a compiled decode step (generate's
    cache_implementation="static"): the states in fixed buffers updated in place
    (`StaticStateMixin`), and the memory, written by the first (eager) step, kept at its addresses
    when beam search reorders it."""

    def set_memory(self, source: torch.Tensor, real: Optional[torch.Tensor]) -> None:
        if not torch.compiler.is_compiling():
            for t in (source, real):
                if t is not None:
                    torch._dynamo.mark_static_address(t)
        super().set_memory(source, real)

    def _map(self, fn) -> None:
        held = self.memory
        super()._map(fn)
        if held is not None and all(a is None or (a.shape, a.dtype) == (b.shape, b.dtype)
                                    for a, b in zip(held, self.memory)):
            for a, b in zip(held, self.memory):
                if a is not None:
                    a.copy_(b)
            self.memory = held


class MomentumLSTMSeq2SeqPreTrainedModel(Seq2SeqEmbeddingsMixin, RemoteCodeMixin, PreTrainedModel):
    config_class = MomentumLSTMSeq2SeqConfig
    config: MomentumLSTMSeq2SeqConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    # FSDP's units (accelerate wraps these classes): the encoder's stack, called once a forward. The
    # decoder's stack steps once per target token, so as a unit of its own it would gather its weights
    # at every token; the decoder stays in the root unit, whole for the step, with the embeddings the
    # LM head may share (tied weights in two units are refused by FSDP2)
    _no_split_modules = ["MomentumLSTMSeq2SeqEncoderStack"]
    supports_gradient_checkpointing = True
    _skip_keys_device_placement = ["cache", "past_key_values"]
    auto_map = AUTO_MAP
    card_hyperparameters = ("cell", "momentum", "step_size", "beta", "eps", "restart", "num_hidden_layers",
                            "encoder_bidirectional", "attention")
    card_papers = ("momentum_rnn",)

    def __init__(self, config: MomentumLSTMSeq2SeqConfig, *inputs, **kwargs):
        config.validate()
        super().__init__(config, *inputs, **kwargs)

    def _init_weights(self, module):
        """fairseq's LSTM translation model's initialisation (a normal of std 0.02 leaves the attention's
        scores too flat to start learning): embeddings and linear maps, biases included, uniform in
        ±`initializer_range`, the padding row zero; each MomentumLSTM stack its own (MomentumRNN,
        Appendix F)."""
        bound = self.config.initializer_range
        if isinstance(module, MomentumLSTM):
            module.reset_parameters()
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            init.uniform_(module.weight, -bound, bound)
            if isinstance(module, nn.Linear) and module.bias is not None:
                init.uniform_(module.bias, -bound, bound)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None and \
                    not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        else:
            super()._init_weights(module)


class MomentumLSTMSeq2SeqEncoderStack(MomentumLSTMStack):
    """The encoder's stack: a `MomentumLSTMStack` under a name of its own, so that FSDP's wrapping by
    class (`_no_split_modules`) can shard it apart from the decoder's."""


def lstm_stack(config: MomentumLSTMSeq2SeqConfig, input_size: int, hidden_size: int, dropout: float,
               bidirectional: bool = False, stack_class=MomentumLSTMStack) -> MomentumLSTMStack:
    """A stack of `config.num_hidden_layers` layers of the config's cell; `dropout` between layers.
    Every use is a call of the module (a decoding step too: one_step=True), so a wrapper around it sees
    each one: PEFT's LoRA on the recurrent weights (`target_parameters`) puts the adapted weights in
    place only while the module's forward runs."""
    hyper = read_hyperparameters(config.cell, momentum=config.momentum, step_size=config.step_size,
                                 beta=config.beta, eps=config.eps)
    layers = config.num_hidden_layers
    return stack_class(input_size, hidden_size, layers, cell=config.cell, restart=config.restart,
                       dropout=dropout if layers > 1 else 0.0, bidirectional=bidirectional, batch_first=True,
                       **hyper)


def source_lengths(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The host copy of each source's number of real tokens (the one read of a padded batch), or None
    where every row is full."""
    if mask is None:
        return None
    lengths = mask.sum(-1).cpu()
    counts = lengths.tolist()
    if 0 in counts:
        rows = [row for row, count in enumerate(counts) if count == 0]
        raise ValueError(f"attention_mask: source rows {rows} hold no real token; every source needs one "
                         "(fairseq's appends </s>)")
    return None if min(counts) == mask.shape[1] else lengths


class MomentumLSTMSeq2SeqEncoder(nn.Module):
    """Embedding, dropout, the MomentumLSTM stack over each source's real tokens, dropout."""

    def __init__(self, config: MomentumLSTMSeq2SeqConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.encoder_embedding_size,
                                         config.pad_token_id)
        self.lstm = lstm_stack(config, config.encoder_embedding_size, config.encoder_hidden_size,
                               config.encoder_dropout_out, config.encoder_bidirectional,
                               MomentumLSTMSeq2SeqEncoderStack)
        self.stack_run = CheckpointedRun()

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, output_hidden_states=None,
                output_attentions=None, return_dict=None, **kwargs):
        """input_ids / inputs_embeds (batch, length) and attention_mask (1 = real token; either side
        may be padded). hidden_states: the (dropped-out) embeddings, then each layer's outputs."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds (the source)")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        batch, length = x.shape[:2]
        if length == 0:
            raise ValueError("the source must hold at least one token (fairseq's sources end with </s>)")
        output_hidden_states = resolve_flag(output_hidden_states, self.config, "output_hidden_states")
        mask = check_attention_mask(attention_mask, batch, 0, length)
        mask = None if mask is None else mask.to(x.device)
        x = F.dropout(x, self.config.encoder_dropout_in, self.training)
        if mask is not None and is_exporting():
            run = self._masked_stack            # torch.export cannot trace the lengths' host read
        else:
            run = partial(self._stack, lengths=source_lengths(mask))
        *outputs, final_h, final_c = self.stack_run(x, mask, run=run)
        out = F.dropout(outputs[-1], self.config.encoder_dropout_out, self.training)
        result = MomentumLSTMEncoderOutput(
            last_hidden_state=out, hidden_states=(x, *outputs[:-1], out) if output_hidden_states else None,
            final_hidden_state=self._per_row(final_h, batch), final_cell_state=self._per_row(final_c, batch))
        return result if return_dict is not False else result.to_tuple()

    def _stack(self, x, mask, lengths):
        """(each layer's outputs ..., final h, final c) of the stack over each source's real tokens (lengths:
        their host copy, None where every row is full): what gradient checkpointing recomputes."""
        if lengths is None:
            outputs, state = self.lstm(x, all_layers=True)
        else:
            outputs, state = packed_run(self.lstm, x, mask, lengths, all_layers=True)
        return (*outputs, state.h, state.c)

    def _masked_stack(self, x, mask):
        """`_stack` without reading the lengths: each padded step keeps its row's state (the
        layers' `padding_mask`, a scan of the cells' steps), so every row, each direction too, gets
        its real tokens' outputs and final state alone. Zero outputs at padding."""
        outputs, state = self.lstm(x, padding_mask=mask, all_layers=True)
        return (*outputs, state.h, state.c)

    def _per_row(self, final: torch.Tensor, batch: int) -> torch.Tensor:
        """nn.LSTM's final-state layout (layers · directions, batch, hidden) as (batch, layers,
        directions · hidden), the two directions of a layer side by side (fairseq's combine_bidir)."""
        layers = self.config.num_hidden_layers
        if self.config.encoder_bidirectional:
            return final.view(layers, 2, batch, -1).permute(2, 0, 1, 3).reshape(batch, layers, -1)
        return final.transpose(0, 1)


class GlobalAttention(nn.Module):
    """Dot-product attention of the decoder's output h over the encoder's outputs (Luong et al.'s
    "general" score; fairseq's lstm AttentionLayer): scores s_j = e_j · W_in h over the real source
    tokens, softmax, context c = Σ a_j e_j, output tanh(W_out [c; h]). No biases."""

    def __init__(self, hidden_size: int, source_size: int):
        super().__init__()
        self.input_proj = nn.Linear(hidden_size, source_size, bias=False)
        self.output_proj = nn.Linear(hidden_size + source_size, hidden_size, bias=False)

    def forward(self, h, source, real):
        """h (batch, hidden), source (batch, length, source_size), real (batch, length) bool or None.
        Returns (output (batch, hidden), weights (batch, length))."""
        scores = torch.einsum("bsc,bc->bs", source, self.input_proj(h))
        # the softmax in float32 at least: fp16/bf16 scores would round the weights
        scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
        if real is not None:
            scores = scores.masked_fill(~real, float("-inf"))
        weights = scores.softmax(-1).to(source.dtype)
        context = torch.einsum("bs,bsc->bc", weights, source)
        return torch.tanh(self.output_proj(torch.cat([context, h], dim=-1))), weights


class MomentumLSTMSeq2SeqDecoder(nn.Module):
    """Embedding, then per target token: the MomentumLSTM stack's step on [embedding; previous
    output], attention of its output to the encoder's outputs, dropout; then the projection to
    `decoder_output_size` where it differs (fairseq's additional_fc)."""

    def __init__(self, config: MomentumLSTMSeq2SeqConfig):
        super().__init__()
        self.config = config
        hidden, source = config.hidden_size, config.encoder_output_size
        self.embed_tokens = nn.Embedding(config.decoder_vocab_size, config.decoder_embedding_size,
                                         config.pad_token_id)
        # None where a part is absent, as in fairseq's decoder
        self.encoder_hidden_proj = nn.Linear(source, hidden) if source != hidden else None
        self.encoder_cell_proj = nn.Linear(source, hidden) if source != hidden else None
        self.lstm = lstm_stack(config, config.decoder_embedding_size + hidden, hidden,
                               config.decoder_dropout_out)
        self.attention = GlobalAttention(hidden, source) if config.attention else None
        output = config.decoder_output_size
        self.additional_fc = nn.Linear(hidden, output) if output != hidden else None
        self.token_run = CheckpointedRun()

    def initial_state(self, final_hidden, final_cell) -> RecurrentState:
        """The stack's state before the first target token: h and c of layer k from the encoder's
        final ones of layer k (batch, layers, encoder_output_size), mapped where the widths differ;
        momentum, second moment and step counter fresh."""
        h, c = final_hidden.transpose(0, 1), final_cell.transpose(0, 1)
        if self.encoder_hidden_proj is not None:
            h, c = self.encoder_hidden_proj(h), self.encoder_cell_proj(c)
        return RecurrentState(h.contiguous(), c.contiguous(), None, None, None)

    def forward(self, input_ids, attention_mask, inputs_embeds, encoder_outputs, encoder_real,
                cache: Optional[MomentumLSTMSeq2SeqCache], output_hidden_states: bool,
                output_attentions: bool):
        """(last hidden state, hidden states or None, attention weights or None) of the target tokens
        `input_ids` / `inputs_embeds` (batch, length); `attention_mask` (batch, cached + length) or
        None; the state comes from `cache` where it holds one, else from `encoder_outputs`' final
        states."""
        static = isinstance(cache, StaticStateMixin)
        if not static:        # a static cache is never cropped: nothing to replay
            replay_accepted(AcceptedTokens(self, encoder_outputs, encoder_real), cache, input_ids,
                            inputs_embeds, attention_mask)
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        batch, length = x.shape[:2]
        if static:            # no count of cached tokens is read (a compiled step would be traced again)
            real = static_padding_mask(cache, attention_mask, batch, length, x.device, {})[1]
        else:
            past = 0 if cache is None else cache.get_seq_length()
            mask = check_attention_mask(attention_mask, batch, past, length)
            real = None if mask is None else mask.to(x.device)
        x = F.dropout(x, self.config.decoder_dropout_in, self.training)
        held = None if cache is None else cache.get_lstm_state()
        if held is not None:
            state, (feed,) = held, cache.get_extra()
        else:
            if encoder_outputs is None or encoder_outputs.final_hidden_state is None:
                raise ValueError("the decoder starts from the encoder's final states: pass the source, or "
                                 "encoder_outputs as the encoder returns them (MomentumLSTMEncoderOutput)")
            state = self.initial_state(encoder_outputs.final_hidden_state, encoder_outputs.final_cell_state)
            feed = x.new_zeros(batch, self.config.hidden_size)
        memory = None if cache is None else cache.memory
        if memory is None:
            memory = (None if encoder_outputs is None else encoder_outputs.last_hidden_state, encoder_real)
            if cache is not None and memory[0] is not None:
                cache.set_memory(*memory)
        source, encoder_real = memory
        if self.config.attention and source is None:
            raise ValueError("encoder_outputs: every decoder step attends to the encoder's outputs; pass the "
                             "source, encoder_outputs or a cache that holds them")
        # a decoding step calls the step itself (no wrapper's work per token); training with gradient
        # checkpointing recomputes each token's step in the backward, one at a time
        step = self._token_step
        if self.token_run.gradient_checkpointing and self.training:
            step = partial(self.token_run, run=self._token_step)
        if self._scans_tokens(cache, length):
            hidden, per_layer, weights = self._scanned_tokens(x, feed, source, encoder_real, real, state,
                                                              output_hidden_states, output_attentions)
        else:
            hidden, per_layer, weights, state, feed = self._token_loop(step, x, feed, source, encoder_real,
                                                                       real, state)
        if cache is not None:
            if length > 0:
                cache.set_lstm_state(state, feed)
            cache.advance(length)
        if self.additional_fc is not None:
            hidden = F.dropout(self.additional_fc(hidden), self.config.decoder_dropout_out, self.training)
            if real is not None:
                hidden = hidden * real[..., None].to(hidden.dtype)
        hidden_states = (x, *per_layer, hidden) if output_hidden_states else None
        attentions = (weights,) if output_attentions and self.config.attention else None
        return hidden, hidden_states, attentions

    def _scans_tokens(self, cache, length) -> bool:
        """Whether the target tokens run as a scan (`_scanned_tokens`): under torch.export where the
        target length may be symbolic, without a cache, on the stack itself (a wrapper, PEFT's LoRA,
        passes only its module call through). Not under strict export with gradients enabled, where
        torch's scan cannot form the backward of a step that reads the source's symbolic length (a
        size saved for the backward, torch 2.13): the loop then fixes the target length, and
        torch.no_grad() around the export gives the scan."""
        if cache is not None or type(self.lstm) is not MomentumLSTMStack or not exports_a_symbolic(length):
            return False
        if onnx_exporting() and torch.is_grad_enabled():
            raise ValueError("torch.onnx.export of the LSTM encoder-decoder with a dynamic target length: "
                             "call it under torch.no_grad() (an ONNX graph has no gradients, and torch's "
                             "ONNX decompositions cannot take the target tokens' scan with them)")
        return not (torch.compiler.is_dynamo_compiling() and torch.is_grad_enabled())

    def _token_loop(self, step, x, feed, source, encoder_real, real, state):
        """`step` (`_token_step`, or its checkpointed run) token by token: (outputs (batch, length,
        hidden), each layer's outputs, attention weights (batch, length, source length) or None, the
        final state, the final fed-back output)."""
        batch, length, layer_count = x.shape[0], x.shape[1], self.config.num_hidden_layers
        outs, layers, weights = [], [], []
        for t in range(length):
            out, feed, step_weights, *rest = step(x[:, t], feed, source, encoder_real,
                                                  None if real is None else real[:, t], *state)
            hiddens, state = rest[:layer_count], RecurrentState(*rest[layer_count:])
            weights.append(step_weights)
            outs.append(out)
            layers.append(hiddens)
        empty = lambda width: x.new_zeros(batch, 0, width)
        stacked = lambda rows: torch.stack(rows, 1) if rows else empty(self.config.hidden_size)
        per_layer = [stacked([hiddens[k] for hiddens in layers]) for k in range(layer_count)]
        attended = None
        if self.config.attention:
            attended = torch.stack(weights, 1) if weights else empty(source.shape[1])
        return stacked(outs), per_layer, attended, state, feed

    def _scanned_tokens(self, x, feed, source, encoder_real, real, state, keep_layers, keep_weights):
        """`_token_loop` as torch's scan of `_token_step` over the target tokens, for torch.export with
        a symbolic target length, which a Python loop would fix: (outputs, each layer's outputs,
        attention weights or None); each layer's outputs and the weights only where kept (a step's
        output the scan does not need to stack). The scan carries the fed-back output and the state's
        tensors.
        The stack's step runs inside the scan without its module call, whose context managers
        write to the module (torch's scan traces its body with dynamo, which refuses that): they are
        entered once around the scan."""
        layer_count = self.config.num_hidden_layers
        stack_step = partial(self.lstm.step, all_layers=True)
        with self.lstm.trusted_states():          # every part the steps carry, zero where fresh
            state = self.lstm._state(state, x.shape[0], x, x.shape[1])
        present = [i for i in range(4) if state[i] is not None]             # h, c, v, m
        # each token's step count before it, an input of the step rather than a carry (torch's scan
        # differentiates float carries only): padded tokens do not count
        taken = torch.ones_like(x[..., 0], dtype=torch.long) if real is None else real.long()
        before = state.step[:, None] + taken.cumsum(1) - taken

        def token(carried, inputs):
            fields = [None] * 4
            for i, part in zip(present, carried[1:]):
                fields[i] = part
            x_t, count, *real_t = inputs
            out, fed, weights, *rest = self._token_step(x_t, carried[0], source, encoder_real,
                                                        real_t[0] if real_t else None, *fields, count,
                                                        stack_step=stack_step)
            # scan's outputs must not alias its carry (the fed-back output is the output)
            ys = tuple(t.clone() for t in (out, *(rest[:layer_count] if keep_layers else ())))
            ys += (weights,) if keep_weights and weights is not None else ()
            return (fed, *(rest[layer_count + i] for i in present)), ys

        xs = (x.transpose(0, 1), before.transpose(0, 1)) + (() if real is None else (real.transpose(0, 1),))
        with self.lstm.weight_drop_masks(), self.lstm.trusted_states():
            _, ys = exported_scan(token, (feed, *(state[i] for i in present)), xs)
        ys = [y.transpose(0, 1) for y in ys]
        per_layer = ys[1:1 + layer_count] if keep_layers else []
        return ys[0], per_layer, ys[-1] if keep_weights and self.config.attention else None

    def _token_step(self, x, feed, source, encoder_real, real, h, c, v, m, step, stack_step=None):
        """One target token: the stack's step on [embedding x; fed-back output], the attention of its
        output to the encoder's outputs `source`, dropout; a padded token (`real` False) keeps the
        state and the fed-back output and gets zero outputs. Returns (output, next fed-back output,
        attention weights or None, each layer's output ..., the new state's fields h, c, v, m, step):
        tensors in and out, positionally, as gradient checkpointing recomputes it. stack_step: the stack's
        step called directly (`_scanned_tokens`); None: the stack's module call."""
        state = RecurrentState(h, c, v, m, step)
        inputs = torch.cat([x, feed], dim=-1)
        if stack_step is None:
            hiddens, new = self.lstm(inputs, state, one_step=True, all_layers=True)
        else:
            hiddens, new = stack_step(inputs, state)
        out, weights = hiddens[-1], None
        if self.config.attention:
            out, weights = self.attention(out, source, encoder_real)
        out = F.dropout(out, self.config.decoder_dropout_out, self.training)
        if real is None:
            feed = out
        else:
            (out, *hiddens), new = where_real(real, (out, *hiddens), new, state)
            feed = torch.where(real[:, None], out, feed)
        return (out, feed, weights, *hiddens, *new)


class AcceptedTokens:
    """What `replay_accepted` runs after speculative decoding's crop: the decoder over the accepted
    tokens, into the cache, attending to this forward's encoder outputs (the same source rows)."""

    def __init__(self, decoder: MomentumLSTMSeq2SeqDecoder, encoder_outputs, encoder_real):
        self.decoder, self.encoder_outputs, self.encoder_real = decoder, encoder_outputs, encoder_real

    def get_input_embeddings(self):
        return self.decoder.embed_tokens

    def __call__(self, input_ids=None, inputs_embeds=None, attention_mask=None, position_ids=None, cache=None,
                 use_cache=True):
        self.decoder(input_ids, attention_mask, inputs_embeds, self.encoder_outputs, self.encoder_real, cache,
                     False, False)


def encoder_output(encoder_outputs) -> MomentumLSTMEncoderOutput:
    """generate() and users pass the encoder's output as it returned it (or its tuple: outputs,
    [hidden states,] final h, final c)."""
    if isinstance(encoder_outputs, MomentumLSTMEncoderOutput):
        return encoder_outputs
    if isinstance(encoder_outputs, (tuple, list)) and len(encoder_outputs) in (3, 4):
        hidden = encoder_outputs[1] if len(encoder_outputs) == 4 else None
        return MomentumLSTMEncoderOutput(last_hidden_state=encoder_outputs[0], hidden_states=hidden,
                                         final_hidden_state=encoder_outputs[-2],
                                         final_cell_state=encoder_outputs[-1])
    raise ValueError("encoder_outputs must be the encoder's output (a MomentumLSTMEncoderOutput, with the "
                     f"final states that start the decoder), got {type(encoder_outputs).__name__}")


class MomentumLSTMSeq2SeqModel(MomentumLSTMSeq2SeqPreTrainedModel):
    """Encoder and decoder; their token embeddings are one matrix with
    `share_encoder_decoder_embeddings` (fairseq's --share-all-embeddings)."""

    def __init__(self, config: MomentumLSTMSeq2SeqConfig):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:
            self._tied_weights_keys = {"decoder.embed_tokens.weight": "encoder.embed_tokens.weight"}
        self.encoder = MomentumLSTMSeq2SeqEncoder(config)
        self.decoder = MomentumLSTMSeq2SeqDecoder(config)
        self.gradient_checkpointing = False       # set by activation_checkpointing_enable; no cache then
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None,
                decoder_attention_mask=None, encoder_outputs=None, cache=None, inputs_embeds=None,
                decoder_inputs_embeds=None, use_cache=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, past_key_values=None, **kwargs):
        """input_ids / inputs_embeds and attention_mask: the source (rows padded on either side), or
        encoder_outputs already computed (generate() passes them) with the source's attention_mask;
        decoder_*: the target so far, continued from `cache` where it holds a state."""
        if has_packing_kwargs(**kwargs) or kwargs.get("position_ids") is not None or \
                kwargs.get("decoder_position_ids") is not None:
            raise ValueError("position_ids / cu_seq_lens_q / seq_idx: an LSTM reads no positions, and packed "
                             "documents are not supported by an encoder-decoder; pad the sources and targets "
                             "instead (DataCollatorForSeq2Seq)")
        if (decoder_input_ids is None) == (decoder_inputs_embeds is None):
            raise ValueError("pass exactly one of decoder_input_ids and decoder_inputs_embeds (or labels to "
                             "the ForConditionalGeneration model)")
        output_hidden_states = resolve_flag(output_hidden_states, self.config, "output_hidden_states")
        output_attentions = resolve_flag(output_attentions, self.config, "output_attentions")
        if not self.config.attention:
            warn_no_attention_weights(self, output_attentions, "a decoder without attention has none")
        cache = resolve_cache(self, given_cache(cache, past_key_values), use_cache, MomentumLSTMSeq2SeqCache)
        if encoder_outputs is None and (input_ids is not None or inputs_embeds is not None):
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                           inputs_embeds=inputs_embeds,
                                           output_hidden_states=output_hidden_states, return_dict=True)
        encoder_outputs = None if encoder_outputs is None else encoder_output(encoder_outputs)
        real = None
        if encoder_outputs is not None and attention_mask is not None:
            source = encoder_outputs.last_hidden_state
            real = check_attention_mask(attention_mask, source.shape[0], 0, source.shape[1]).to(source.device)
        hidden, hidden_states, attentions = self.decoder(
            decoder_input_ids, decoder_attention_mask, decoder_inputs_embeds, encoder_outputs, real, cache,
            output_hidden_states, output_attentions)
        out = output_with_cache(Seq2SeqModelOutput, cache, last_hidden_state=hidden,
                                decoder_hidden_states=hidden_states, cross_attentions=attentions,
                                encoder_last_hidden_state=None if encoder_outputs is None else
                                encoder_outputs.last_hidden_state,
                                encoder_hidden_states=None if encoder_outputs is None else
                                encoder_outputs.hidden_states)
        return out if return_dict is not False else out.to_tuple()



class MomentumLSTMSeq2SeqForConditionalGeneration(Seq2SeqLMMixin, RecurrentCausalLMMixin,
                                                  MomentumLSTMSeq2SeqPreTrainedModel, GenerationMixin):
    """`MomentumLSTMSeq2SeqModel` and the vocabulary projection `lm_head` (the decoder's embedding
    with `tie_word_embeddings`, else a linear map with a bias, as fairseq's fc_out). With `labels`
    and no decoder inputs, the decoder reads the labels shifted right after
    `decoder_start_token_id`; the loss is the cross-entropy of every label not -100
    (`num_items_in_batch` honoured). generate() keeps the decoder's state in a
    `MomentumLSTMSeq2SeqCache`."""

    cache_class = MomentumLSTMSeq2SeqCache
    static_cache_class = StaticMomentumLSTMSeq2SeqCache

    def __init__(self, config: MomentumLSTMSeq2SeqConfig):
        super().__init__(config)
        self._tied_weights_keys = config.tied_embeddings()
        self.model = MomentumLSTMSeq2SeqModel(config)
        self.lm_head = nn.Linear(config.decoder_output_size, config.decoder_vocab_size,
                                 bias=not config.tie_word_embeddings)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None,
                decoder_attention_mask=None, encoder_outputs=None, cache=None, inputs_embeds=None,
                decoder_inputs_embeds=None, labels=None,
                use_cache=None, output_hidden_states=None, output_attentions=None, return_dict=None,
                past_key_values=None, logits_to_keep=0, **kwargs):
        decoder_input_ids = self.decoder_inputs_for(labels, decoder_input_ids, decoder_inputs_embeds)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             decoder_input_ids=decoder_input_ids,
                             decoder_attention_mask=decoder_attention_mask,
                             encoder_outputs=encoder_outputs, cache=cache, past_key_values=past_key_values,
                             inputs_embeds=inputs_embeds, decoder_inputs_embeds=decoder_inputs_embeds,
                             use_cache=use_cache, output_hidden_states=output_hidden_states,
                             output_attentions=output_attentions, return_dict=True, **kwargs)
        return self.seq2seq_lm_output(outputs, labels, logits_to_keep, num_items_in_batch, return_dict)
