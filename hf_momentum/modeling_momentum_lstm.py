"""MomentumLSTM language model and sequence classifier over `plugins.rnn.MomentumLSTM`
(MomentumRNN).

Generation keeps the recurrent state (h, c, momentum v, second moment m, step counter) in a
`RecurrentCache`, so each new token costs one LSTM step (`MomentumLSTM.step`, whatever the
prompt length), kept only in the rows where the token is real, on the device;
`StaticMomentumLSTMCache` (cache_implementation="static") keeps it in fixed buffers for a compiled
decode step. Padding: the real tokens of each row
are moved to the front and run as a packed sequence, so a padded row (left or right) gets the
outputs and the final state of its sequence alone, and NAG/SR step counters count real tokens.
Packed documents (hf_momentum.packing: position_ids that restart, or DataCollatorWithFlattening's
cu_seq_lens_q/k or seq_idx) run as one row split by `cu_seqlens`, each from a zero state as if
alone (`MomentumLSTM(..., cu_seqlens=...)`).

The stack runs as one `MomentumLSTM` call (the plain cell as one fused multi-layer kernel);
`output_hidden_states` asks it for every layer's output (`all_layers`).
"""
import contextlib
from functools import partial
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, SequenceClassifierOutput

from .cache_history import replay_accepted
from .configuration_momentum_lstm import MomentumLSTMConfig
from .modeling_common import (
    CACHE_NAME,
    QuestionAnsweringMixin,
    RecurrentCausalLMMixin,
    SequenceClassificationMixin,
    TokenClassificationMixin,
    check_attention_mask,
    given_cache,
    output_with_cache,
    refuse_packed_rows,
    resolve_cache,
    resolve_flag,
    shifted_by_trainers_label_smoothing,
    static_padding_mask,
    warn_no_attention_weights,
)
from .momentum_rnn_core import (
    MomentumLSTM,
    RecurrentState,
    Segments,
    drawn_weight_drop,
    embedding_dropout,
    front_order,
    pad_packed,
    read_hyperparameters,
    segment_ids,
    sequence_dropout,
    weight_drop,
)
from .packing import COLLATOR, has_packing_kwargs, pop_packing_kwargs, possible_document_starts
from .recurrent_cache import RecurrentCache, StaticStateMixin
from .saving import RemoteCodeMixin

AUTO_MAP = {
    "AutoConfig": "configuration_momentum_lstm.MomentumLSTMConfig",
    "AutoModel": "modeling_momentum_lstm.MomentumLSTMModel",
    "AutoModelForCausalLM": "modeling_momentum_lstm.MomentumLSTMForCausalLM",
    "AutoModelForSequenceClassification": "modeling_momentum_lstm.MomentumLSTMForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_momentum_lstm.MomentumLSTMForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_momentum_lstm.MomentumLSTMForQuestionAnswering",
}
STATE_FIELDS = ("h", "c", "v", "m", "step")


class MomentumLSTMCache(RecurrentCache):
    """The whole stack's `RecurrentState`, batch-first so that beam reordering selects rows;
    fields the cell does not have are stored as (batch, 0) placeholders. A subclass may hold
    `extra_states` more batch-first tensors after it (`get_extra` / `set_lstm_state(state, *extra)`)."""

    extra_states: tuple = ()

    def __init__(self, config):
        super().__init__(1, len(STATE_FIELDS) + len(self.extra_states))

    def get_lstm_state(self) -> Optional[RecurrentState]:
        states = self.get_states(0)
        if states is None:
            return None
        fields = [None if t.dim() == 2 and t.shape[1] == 0 else t for t in states]
        return RecurrentState(*(t if t is None or name == "step" else t.transpose(0, 1).contiguous()
                                for name, t in zip(STATE_FIELDS, fields)))

    def get_extra(self) -> Optional[tuple]:
        """The `extra_states` tensors, or None before the first update."""
        states = self.get_states(0)
        return None if states is None else tuple(states[len(STATE_FIELDS):])

    def set_lstm_state(self, state: RecurrentState, *extra: torch.Tensor) -> None:
        if len(extra) != len(self.extra_states):
            raise ValueError(f"expected the extra states {self.extra_states}, got {len(extra)} tensors")
        batch = state.step.shape[0]
        self.set_states(0, [state.step.new_zeros(batch, 0) if t is None else
                            (t if name == "step" else t.transpose(0, 1))
                            for name, t in zip(STATE_FIELDS, state)] + list(extra))


class StaticMomentumLSTMCache(StaticStateMixin, MomentumLSTMCache):
    """A `MomentumLSTMCache` for a compiled decode step (generate's cache_implementation="static"):
    the stack's state in buffers allocated by the first forward (the prompt, run eagerly) and
    overwritten in place by every later one, and the token counts as tensors, so that a forward may
    pass the attention mask of the new tokens only. Holding one sequence per row, it refuses packed
    documents (the collator's kwargs, or position_ids that restart in a prompt)."""


class MomentumLSTMPreTrainedModel(RemoteCodeMixin, PreTrainedModel):
    config_class = MomentumLSTMConfig
    config: MomentumLSTMConfig
    base_model_prefix = "model"
    # the stack is one unit for FSDP (accelerate wraps these classes) and for device_map; AWD's last layer
    # (`MomentumLSTMStackTop`) stays inside its stack's unit: the stack draws that layer's weight-drop
    # masks before any layer runs, when a unit of its own would still hold its weights sharded
    _no_split_modules = ["MomentumLSTMStack", "MomentumLSTMStackWithTop"]
    supports_gradient_checkpointing = True
    _skip_keys_device_placement = ["cache", "past_key_values"]
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


class MomentumLSTMStack(MomentumLSTM):
    """The model's LSTM stack. Every computation the model makes with it is a call of this
    module, so a wrapper around it sees each one: PEFT's `ParamWrapper` (LoRA on the recurrent
    weights through `LoraConfig(target_parameters=...)`) puts the adapted weights in place only
    while its forward runs, and passes no other method through. forward(..., one_step=True) is
    `step` (input: one token, (batch, features)); it returns a tuple of every layer's output
    with all_layers, else a one-tuple of the last. In training, `weight_drop` (AWD-LSTM's DropConnect)
    drops entries of every hidden-to-hidden matrix, one mask per call for the whole stack."""

    _drawn_weight_drop = None       # the masks drawn_weight_drop_masks holds, while it does

    def __init__(self, *args, weight_drop=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.weight_drop = weight_drop

    def forward(self, input, state=None, *, cu_seqlens=None, cu_seqlens_cpu=None, padding_mask=None,
                one_step=False, all_layers=False):
        with self.weight_drop_masks(), self.trusted_states():     # the model's own states
            return self._forward(input, state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                                 padding_mask=padding_mask, one_step=one_step, all_layers=all_layers)

    def weight_drop_masks(self) -> contextlib.AbstractContextManager:
        """In training with weight_drop: every hidden-to-hidden matrix replaced by a dropped copy for
        the call (one mask each, drawn first layer to last), which the layers' fused recurrence and
        cell step read unchanged; gradients reach the parameters (or a LoRA adapter's factors)
        through the masks."""
        drawn = self._drawn_weight_drop
        return self.substituted_recurrent_weights(
            drawn if drawn is not None else weight_drop(self.weight_drop, self.training))

    @contextlib.contextmanager
    def drawn_weight_drop_masks(self, device: torch.device):
        """Within the block, this stack's weight-drop masks are the ones drawn on entry (on `device`),
        which its forward applies to the matrices it then holds: a stack above draws every layer's
        mask before any layer runs, while a wrapper around this one (PEFT's ParamWrapper, or
        accelerate's offload hook) puts its weights in place only inside its own forward."""
        weights = [self.layer_parameters(k)[1] for k in range(self.num_layers * self.directions)]
        self._drawn_weight_drop = drawn_weight_drop(self.weight_drop, self.training, weights, device)
        try:
            yield
        finally:
            self._drawn_weight_drop = None

    def _forward(self, input, state, *, cu_seqlens, cu_seqlens_cpu, padding_mask, one_step, all_layers):
        if one_step:
            out, state = self.step(input, state, all_layers=all_layers)
        else:
            out, state = MomentumLSTM.forward(self, input, state, cu_seqlens=cu_seqlens,
                                              cu_seqlens_cpu=cu_seqlens_cpu, padding_mask=padding_mask,
                                              all_layers=all_layers)
        return (out if all_layers else (out,)), state

    def recurrent_weight_names(self) -> list[str]:
        """The hidden-to-hidden matrices' names, first layer to last (the order weight drop draws in)."""
        return [f"weight_hh_l{k}" for k in range(self.num_layers)]


class MomentumLSTMStackTop(MomentumLSTMStack):
    """AWD's last layer (`MomentumLSTMStackWithTop.top`): a stack of one layer under a name of its own, so
    that FSDP's wrapping by class (`_no_split_modules`) leaves it in its stack's unit."""


class MomentumLSTMStackWithTop(MomentumLSTMStack):
    """AWD-LSTM's stack (Merity et al.; MomentumRNN's PTB model): a last layer of another width
    (`last_hidden_size`) than the layers below it. Those layers are this module's own, named as a
    uniform stack's (`weight_ih_l0`, ...); the last is `top`, a stack of one layer. nn.LSTM's dropout
    sits between them as between the others. The state is one `RecurrentState`, as a uniform
    stack's: each layer's rows are zero-padded to the widest, so the cache, beam reordering,
    speculative decoding's crop and the exported step hold it as they hold any other."""

    dropout_after_last_layer = True   # the dropout between these layers and `top`

    def __init__(self, input_size, hidden_size, num_layers, *, top_size, dropout=0.0, weight_drop=0.0,
                 **kwargs):
        super().__init__(input_size, hidden_size, num_layers, dropout=dropout, weight_drop=weight_drop,
                         **kwargs)
        self.top = MomentumLSTMStackTop(hidden_size, top_size, 1, weight_drop=weight_drop, **kwargs)

    def weight_drop_masks(self) -> contextlib.AbstractContextManager:
        # every mask before any layer runs, the lower layers' then top's (fairseq's order); top's
        # forward applies its own, so that an adapter wrapped around top has its weights in place
        masks = contextlib.ExitStack()
        masks.enter_context(super().weight_drop_masks())
        masks.enter_context(self._top().drawn_weight_drop_masks(self.layer_parameters(0)[1].device))
        return masks

    def _top(self) -> MomentumLSTMStack:
        """`top` itself, under the wrappers that PEFT nests around it (one ParamWrapper per matrix that
        LoRA's `target_parameters` names in `lstm.top.*`), which pass only its forward through."""
        top = self.top
        while not isinstance(top, MomentumLSTMStack):
            top = top.base_layer
        return top

    def _forward(self, input, state, *, cu_seqlens, cu_seqlens_cpu, padding_mask, one_step, all_layers):
        below, top = self._split(state)
        segments = dict(cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, padding_mask=padding_mask,
                        one_step=one_step)
        outputs, below = super()._forward(input, below, all_layers=all_layers, **segments)
        between = self._between(outputs[-1], cu_seqlens_cpu if cu_seqlens is not None else None, one_step)
        (out,), top = self.top(between, top, **segments)
        return (outputs + (out,) if all_layers else (out,)), self._join(below, top)

    def recurrent_weight_names(self) -> list[str]:
        return super().recurrent_weight_names() + ["top.weight_hh_l0"]

    def _between(self, x, offsets_cpu, one_step):
        """The dropout between the layers below and `top` (training only), of a tensor, a packed row
        of segments (offsets_cpu: their host offsets) or a PackedSequence: nn.LSTM's, or locked."""
        segments = {}
        if self.locked_dropout and self.training and self.dropout > 0 and offsets_cpu is not None:
            segments = dict(sequence_ids=segment_ids(offsets_cpu, x.device),
                            sequences=offsets_cpu.numel() - 1)
        return sequence_dropout(x, self.dropout, self.training, self.locked_dropout,
                                time_dim=None if one_step else 1, **segments)

    def _split(self, state):
        """(the layers' below state, top's state) of a joined state (or None)."""
        if state is None:
            return None, None
        n = self.num_layers
        part = lambda layers, stack: RecurrentState(
            *(None if t is None else t[layers, ..., :width]
              for t, width in zip(state[:4], state_widths(stack))), state.step)
        return part(slice(None, n), self), part(slice(n, None), self._top())

    @staticmethod
    def _join(below, top) -> RecurrentState:
        """One state of the two parts' (layer rows of each field zero-padded to the wider part)."""
        def join(a, b):
            if a is None:
                return None
            width = max(a.shape[-1], b.shape[-1])
            return torch.cat([F.pad(a, (0, width - a.shape[-1])), F.pad(b, (0, width - b.shape[-1]))])
        return RecurrentState(*(join(a, b) for a, b in zip(below[:4], top[:4])), top.step)


def state_widths(stack: MomentumLSTM):
    """The last dimension of h, c, v, m in a stack's state (v and m are gate pre-activations)."""
    return (stack.hidden_size, stack.hidden_size, 4 * stack.hidden_size, 4 * stack.hidden_size)


def lstm_stack(config: MomentumLSTMConfig) -> MomentumLSTMStack:
    """The model's LSTM stack: one uniform stack, or one with a last layer of its own width."""
    # the config holds every hyperparameter (the unread ones at their defaults); the layer takes
    # only those its cell reads
    hyper = read_hyperparameters(config.cell, momentum=config.momentum, step_size=config.step_size,
                                 beta=config.beta, eps=config.eps)
    kwargs = dict(cell=config.cell, restart=config.restart, batch_first=True,
                  locked_dropout=config.locked_dropout, weight_drop=config.weight_drop, **hyper)
    if config.last_hidden_size == config.hidden_size:
        return MomentumLSTMStack(config.embedding_size, config.hidden_size, config.num_hidden_layers,
                                 dropout=config.dropout, **kwargs)
    return MomentumLSTMStackWithTop(config.embedding_size, config.hidden_size, config.num_hidden_layers - 1,
                                    top_size=config.last_hidden_size, dropout=config.dropout, **kwargs)


class CheckpointedRun(GradientCheckpointingLayer):
    """The unit that gradient checkpointing recomputes: `run(*tensors)`, tensors in (positionally:
    the reentrant checkpoint passes gradients to positional tensors only) and a flat tuple of
    tensors out (what both checkpoint implementations track). It holds no parameters, so the
    stacks stay where they are (saved models keep their parameter names); the caller passes its
    run function in: the causal model its stack from a zero state, the encoder-decoder its
    encoder's stack and each decoder step."""

    def forward(self, *tensors, run):
        return run(*tensors)


class MomentumLSTMModel(MomentumLSTMPreTrainedModel):
    def __init__(self, config: MomentumLSTMConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, config.pad_token_id)
        self.lstm = lstm_stack(config)
        self.stack_run = CheckpointedRun()
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, cache=None, inputs_embeds=None,
                use_cache=None, output_hidden_states=None, output_attentions=None, return_dict=None,
                position_ids=None, past_key_values=None, **kwargs):
        """attention_mask: (batch, past + length), 1 for real tokens; padded tokens leave the
        state unchanged and get zero outputs. A given `cache` (`past_key_values` before
        transformers 5.24) is continued even with use_cache=False. position_ids serve only to
        find packed documents (hf_momentum.packing; also from the collator's cu_seq_lens_q/k or
        seq_idx in kwargs): each then runs from a zero state as if alone, without a cache (asking
        for one raises), and draws its own locked-dropout masks. hidden_states: the (dropped-out)
        embeddings, then each layer's output (the last one after the output dropout, i.e.
        last_hidden_state)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        given = given_cache(cache, past_key_values)
        replay_accepted(self, given, input_ids, inputs_embeds, attention_mask, position_ids)
        x = self._embed(input_ids) if inputs_embeds is None else inputs_embeds
        batch, length = x.shape[:2]
        output_hidden_states = resolve_flag(output_hidden_states, self.config, "output_hidden_states")
        warn_no_attention_weights(self, output_attentions, "an LSTM has none")
        cache = resolve_cache(self, given, use_cache, MomentumLSTMCache)
        packing = pop_packing_kwargs(kwargs)
        packed = None
        if isinstance(cache, StaticStateMixin):
            # no count of cached tokens is read (a compiled decode step would be traced again for it)
            mask = static_padding_mask(cache, attention_mask, batch, length, x.device, packing,
                                       position_ids)[1]
        else:
            mask, packed, cache = self._layout(cache, given, use_cache, attention_mask, position_ids, batch,
                                               length, x.device, packing)
        x = self._sequence_dropout(x, self.config.embedding_dropout, packed)
        if length == 0:
            outputs = self._zero_outputs(x, 0, output_hidden_states)
        elif packed is not None:
            outputs = self.stack_run(x, mask, run=partial(self._documents, packed=packed,
                                                          all_layers=output_hidden_states))
        elif cache is None:
            # no state in or out: what gradient checkpointing may recompute
            outputs = self.stack_run(x, mask, run=partial(self._outputs, all_layers=output_hidden_states))
        else:
            outputs, state = self._run(x, mask, cache.get_lstm_state(), output_hidden_states)
            if state is not None:                           # None: no real token yet, none here
                cache.set_lstm_state(state)
        if cache is not None:
            cache.advance(length)
        out = self._sequence_dropout(outputs[-1], self.config.output_dropout, packed)
        hidden_states = (x, *outputs[:-1], out) if output_hidden_states else None
        result = output_with_cache(BaseModelOutputWithPast, cache, last_hidden_state=out,
                                   hidden_states=hidden_states)
        return result if return_dict is not False else result.to_tuple()

    def _embed(self, input_ids):
        """The embeddings of input_ids, with AWD-LSTM's word dropout in training."""
        return embedding_dropout(self.embed_tokens, input_ids, self.config.word_dropout, self.training)

    def _sequence_dropout(self, x, p, packed: Optional[Segments]):
        """Dropout p of x (batch, length, features) in training: per element, or with locked_dropout
        one mask per sequence (a row, or each packed document)."""
        locked = self.config.locked_dropout
        documents = {}
        if locked and self.training and p > 0 and packed is not None:
            documents = dict(sequence_ids=packed.document_ids(), sequences=packed.cu_seqlens.numel() - 1)
        return sequence_dropout(x, p, self.training, locked, time_dim=1, **documents)

    def _layout(self, cache, given, use_cache, attention_mask, position_ids, batch, length, device, packing):
        """(new tokens' padding mask, packed documents or None, the cache to use) with a dynamic cache
        or none. Packed documents are found in a batch that starts from no state; they run without a
        cache (asking for one raises)."""
        past = cache.get_seq_length() if cache is not None else 0
        mask = check_attention_mask(attention_mask, batch, past, length)
        mask = None if mask is None else mask.to(device)
        if past > 0 or length == 0:
            if has_packing_kwargs(**packing):
                raise ValueError(f"packed documents (cu_seq_lens_q / seq_idx from {COLLATOR}) cannot "
                                 f"continue a cache that holds {past} tokens")
            return mask, None, cache
        starts = possible_document_starts(batch, length, device, padding_mask=mask, position_ids=position_ids,
                                          **packing)
        # the one host copy of the batch's layout (plugins.packing.Segments): packed documents, or
        # padded rows of one document each, which run as an unpacked batch
        described = None if starts is None else Segments.from_starts_or_padding(starts, mask)
        if described is None or not described.packed:
            return mask, None, cache
        if given is not None or use_cache:
            raise ValueError("packed documents (position_ids that restart, or cu_seq_lens_q / seq_idx from "
                             f"{COLLATOR}) cannot fill one cache; pass use_cache=False and no {CACHE_NAME}, "
                             "and generate from each document separately")
        return mask, described, None

    def _documents(self, x, mask, packed: Segments, all_layers=False):
        """Outputs of packed documents: the real tokens as one row split by cu_seqlens, each
        document from a zero state; zeros at padding."""
        return self._segments(x, packed, None, all_layers)[0]

    def _segments(self, x, packed: Segments, state, all_layers):
        """(outputs, state) of the stack over the packed row of `packed`'s segments, each from its
        row of `state` (None: zero); zeros at the tokens left out."""
        outputs, state = self.lstm(packed.pack_tokens(x), state, cu_seqlens=packed.cu_seqlens,
                                   cu_seqlens_cpu=packed.cu_seqlens_cpu, all_layers=all_layers)
        return tuple(packed.unpack_tokens(out) for out in outputs), state

    def _outputs(self, x, mask, all_layers=False):
        """Outputs without a state in or out. Padded rows run whole, their real tokens moved to
        the front: the stack is causal, so the outputs at real tokens never see the padding behind
        them. No row length is read to the host, and no shape depends on the mask's values
        (torch.export with a dynamic batch and length, ONNX)."""
        if mask is None:
            return self._run(x, None, None, all_layers)[0]
        order, back = front_order(mask)
        outputs, _ = self._stack(x.gather(1, order[..., None].expand_as(x)), None, all_layers)
        return tuple(out.gather(1, back[..., None].expand_as(out)) * mask[..., None].to(out.dtype)
                     for out in outputs)

    def _run(self, x, mask, state, all_layers=False):
        """(outputs, final state): a tuple of the last layer's output or, with all_layers,
        of every layer's, each (batch, length, hidden)."""
        if x.shape[1] == 1:  # one generated token: a cell step, kept by the rows where it is real
            outputs, new = self._stack(x[:, 0], state, all_layers, one_step=True)
            if mask is not None:
                outputs, new = where_real(mask[:, 0], outputs, new, state)
            return tuple(out[:, None] for out in outputs), new
        if mask is not None:
            # the one host copy of a padded batch: each row's number of real tokens
            lengths = mask.sum(-1).cpu()
            if lengths.tolist() != [x.shape[1]] * x.shape[0]:
                return self._packed(x, mask, lengths, state, all_layers)
        return self._stack(x, state, all_layers)

    def _stack(self, inputs, state, all_layers, one_step=False):
        """The stack in one call: every layer's output with all_layers, else the last's."""
        return self.lstm(inputs, state, one_step=one_step, all_layers=all_layers)

    def _packed(self, x, mask, lengths, state, all_layers):
        """Padded rows (lengths: real tokens per row, on the host) as a PackedSequence."""
        if 0 in lengths.tolist():
            return self._rows_as_segments(x, mask, lengths, state, all_layers)
        return packed_run(self.lstm, x, mask, lengths, state, all_layers)

    def _rows_as_segments(self, x, mask, lengths, state, all_layers):
        """Padded rows of which some hold no real token, as a chunk of a left-padded prompt does
        (generate's prefill_chunk_size; a PackedSequence takes no length 0): the real tokens as
        one packed row, one segment per batch row, where an empty segment keeps its state (the
        stack's cu_seqlens form). Zero outputs at padding; no real token at all runs nothing."""
        batch, length = mask.shape
        if not any(lengths.tolist()):
            return self._zero_outputs(x, length, all_layers), state
        offsets = nn.functional.pad(lengths.cumsum(0), (1, 0))
        # each row's real tokens are the first `lengths` of its front order: their flat positions
        first = torch.cat([torch.arange(n) + row * length for row, n in enumerate(lengths.tolist())])
        order = front_order(mask)[0] + torch.arange(batch, device=x.device)[:, None] * length
        rows = Segments(batch=batch, length=length, cu_seqlens=offsets.to(x.device), cu_seqlens_cpu=offsets,
                        index=order.reshape(-1).index_select(0, first.to(x.device)))
        return self._segments(x, rows, state, all_layers)


    def _zero_outputs(self, x, length, all_layers):
        """Zero outputs of `length` positions: every layer's with all_layers, else the last's."""
        sizes = self.config.layer_sizes()
        return tuple(x.new_zeros(x.shape[0], length, size) for size in (sizes if all_layers else sizes[-1:]))


def where_real(real, outputs, new: RecurrentState, old: Optional[RecurrentState]):
    """A one-token step's outputs and state in the rows whose token is real (`real` (batch,) bool);
    in the others zero outputs and the state before the step (zeros where there was none, or where it
    had no such part yet: a fresh momentum or step counter), as a padded token leaves it. Selected on
    the device: a decode step reads nothing back to the host."""
    old = RecurrentState(None, None, None, None, None) if old is None else old

    def kept(a, b, dims):
        return None if a is None else torch.where(real.view(dims), a, torch.zeros_like(a) if b is None else b)
    outputs = tuple(torch.where(real[:, None], out, 0) for out in outputs)
    return outputs, RecurrentState(*(kept(a, b, (1, -1, 1)) for a, b in zip(new[:4], old[:4])),
                                   kept(new.step, old.step, (-1,)))


def packed_run(stack, x, mask, lengths, state=None, all_layers=False):
    """(outputs, final state) of `stack` over padded rows (x (batch, length, features), mask (batch,
    length) bool, lengths: each row's real tokens, on the host, none 0) as a PackedSequence: each row's
    real tokens moved to the front, so a row gets its sequence's outputs and state alone; the outputs
    back in the input's positions, zero at padding."""
    order, back = front_order(mask)
    front = x.gather(1, order[..., None].expand_as(x))
    packed = pack_padded_sequence(front, lengths, batch_first=True, enforce_sorted=False)
    outputs, state = stack(packed, state, all_layers=all_layers)
    return tuple(unpack(out, back, mask) for out in outputs), state


def unpack(packed, back, mask):
    """A packed output of `_packed` in the input's positions, zero at padded tokens."""
    out, _ = pad_packed(packed, batch_first=True, total_length=mask.shape[1])
    out = out.gather(1, back[..., None].expand_as(out))
    return out * mask[..., None].to(out.dtype)


@shifted_by_trainers_label_smoothing
class MomentumLSTMForCausalLM(RecurrentCausalLMMixin, MomentumLSTMPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    cache_class = MomentumLSTMCache
    static_cache_class = StaticMomentumLSTMCache

    def __init__(self, config: MomentumLSTMConfig):
        super().__init__(config)
        self.model = MomentumLSTMModel(config)
        self.lm_head = nn.Linear(config.last_hidden_size, config.vocab_size, bias=config.lm_head_bias)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, cache=None, inputs_embeds=None,
                labels=None, use_cache=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, logits_to_keep=0, past_key_values=None, **kwargs):
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             cache=cache, past_key_values=past_key_values, inputs_embeds=inputs_embeds,
                             use_cache=use_cache, output_hidden_states=output_hidden_states,
                             output_attentions=output_attentions, return_dict=True,
                             position_ids=kwargs.pop("position_ids", None), **pop_packing_kwargs(kwargs))
        return self.causal_lm_output(outputs, labels, logits_to_keep, return_dict, **kwargs)


def last_real_positions(attention_mask, input_ids, pad_token_id, batch: int, length: int, device):
    """(batch,) position of each row's last real token: the last 1 of attention_mask (left or
    right padding); without a mask the last token that is not pad_token_id (as
    LlamaForSequenceClassification does), else the last position."""
    if attention_mask is not None:
        real = attention_mask.to(device).bool()
    elif input_ids is not None and pad_token_id is not None:
        real = input_ids.to(device) != pad_token_id
    else:
        return torch.full((batch,), length - 1, device=device)
    return (torch.arange(length, device=device) * real).argmax(-1)


class MomentumLSTMForSequenceClassification(SequenceClassificationMixin, MomentumLSTMPreTrainedModel):
    """The output at each row's last real token (`last_real_positions`), then a linear
    classifier: a unidirectional LSTM's summary of the whole sequence (the bidirectional
    MomentumTransformer classifier averages over real tokens instead, which here would weigh
    outputs that saw only a prefix)."""

    def __init__(self, config: MomentumLSTMConfig):
        super().__init__(config)
        self.model = MomentumLSTMModel(config)
        self.add_classifier(config, config.last_hidden_size)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, labels=None,
                output_hidden_states=None, output_attentions=None, return_dict=None, position_ids=None,
                **kwargs):
        refuse_packed_rows(type(self).__name__, position_ids, attention_mask, kwargs)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                             use_cache=False, output_hidden_states=output_hidden_states,
                             output_attentions=output_attentions, return_dict=True)
        hidden = outputs.last_hidden_state
        batch, length = hidden.shape[:2]
        if length == 0:
            raise ValueError("sequence classification needs at least one token per row")
        last = last_real_positions(attention_mask, input_ids, self.config.pad_token_id, batch, length,
                                   hidden.device)
        logits = self.score(self.dropout(hidden[torch.arange(batch, device=hidden.device), last]))
        loss = self.sequence_loss(logits, labels)
        out = SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
        return out if return_dict is not False else out.to_tuple()


class MomentumLSTMForTokenClassification(TokenClassificationMixin, MomentumLSTMPreTrainedModel):
    """A linear classifier on every output of the stack (TokenClassificationMixin): each token's
    label reads the tokens up to it."""

    def __init__(self, config: MomentumLSTMConfig):
        super().__init__(config)
        self.model = MomentumLSTMModel(config)
        self.add_classifier(config, config.last_hidden_size)
        self.post_init()


class MomentumLSTMForQuestionAnswering(QuestionAnsweringMixin, MomentumLSTMPreTrainedModel):
    """Start and end logits of an answer span from every output of the stack
    (QuestionAnsweringMixin): each position reads the tokens up to it, so put the question first."""

    def __init__(self, config: MomentumLSTMConfig):
        super().__init__(config)
        self.model = MomentumLSTMModel(config)
        self.qa_outputs = nn.Linear(config.last_hidden_size, 2)
        self.post_init()
