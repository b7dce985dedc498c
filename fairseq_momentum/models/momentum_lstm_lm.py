"""AWD-style MomentumLSTM language model for `--task language_modeling`
(MomentumRNN, eq. 9, 15, Section 2.4; PTB setup of Appendix A.3, Tables 6-7;
docs/equations.md, D6).

Argument names follow fairseq's lstm_lm where they exist; the AWD-LSTM regularisers and
the `--lstm-*` cell options are added. `--lstm-cell lstm` is the AWD-LSTM baseline.
"""
from typing import List, Optional

from fairseq.models import FairseqIncrementalDecoder, FairseqLanguageModel
from fairseq.models.lstm import DEFAULT_MAX_TARGET_POSITIONS
from torch import Tensor, nn

from plugins.rnn import RecurrentState
from plugins.rnn.awd import embedding_dropout, locked_dropout

from ..modules.awd_lstm import AWDMomentumLSTM
from ..modules.recurrent_state import buffer_to_states, reorder_buffer, states_to_buffer
from ..options import (
    add_lstm_cell_args,
    check_lstm_cell_args,
    fill_unset,
    lstm_cell_defaults,
    lstm_cell_kwargs,
    positive_int,
    probability,
)
from ..registry import architecture, model


class MomentumLSTMLMDecoder(FairseqIncrementalDecoder):
    """Embedding -> AWDMomentumLSTM -> (tied) output projection.

    `forward_with_state(tokens, state)` runs a chunk from a carried state (truncated
    BPTT across batches, as in AWD-LSTM); incremental decoding keeps the same state in
    `incremental_state` and reorders it for beam search. A single token in eval mode takes
    the step-wise path (modules/momentum_lstm_step.py).
    """

    carries_state = True    # forward(..., carried_state=CarriedState): --task language_modeling_bptt
    retain_dropout = False  # decoders pickled before the option existed

    def __init__(self, args, dictionary):
        super().__init__(dictionary)
        self.embed_tokens = nn.Embedding(len(dictionary), args.decoder_embed_dim, dictionary.pad())
        nn.init.uniform_(self.embed_tokens.weight, -0.1, 0.1)
        sizes = ([args.decoder_embed_dim] + [args.decoder_hidden_size] * (args.decoder_layers - 1)
                 + [args.decoder_out_embed_dim])
        self.rnn = AWDMomentumLSTM(sizes, weight_drop=args.weight_drop,
                                   dropout_hidden=args.decoder_dropout_hidden,
                                   **lstm_cell_kwargs(args))
        self.dropout_in, self.dropout_out = args.decoder_dropout_in, args.decoder_dropout_out
        self.embed_dropout = args.decoder_embed_dropout
        self.num_layers = args.decoder_layers
        self.output_projection = nn.Linear(args.decoder_out_embed_dim, len(dictionary))
        nn.init.zeros_(self.output_projection.bias)
        if args.share_decoder_input_output_embed:
            self.output_projection.weight = self.embed_tokens.weight
        else:
            nn.init.uniform_(self.output_projection.weight, -0.1, 0.1)
        self.max_target_positions = DEFAULT_MAX_TARGET_POSITIONS

    def forward_with_state(self, tokens: Tensor, state: Optional[List[RecurrentState]] = None):
        """tokens (B, T) -> (features (B, T, out_embed_dim), state after the chunk)."""
        dropping = self.training or self.retain_dropout
        if not dropping and tokens.size(1) == 1:
            x, state = self.rnn.step(self.embed_tokens(tokens[:, 0]), state)
            return x[:, None], state
        x = embedding_dropout(self.embed_tokens, tokens, self.embed_dropout, dropping)
        x = locked_dropout(x.transpose(0, 1), self.dropout_in, dropping)
        x, state = self.rnn(x, state, dropping=dropping)
        x = locked_dropout(x, self.dropout_out, dropping)
        return x.transpose(0, 1), state

    def make_generation_fast_(self, name=None, retain_dropout=False, retain_dropout_modules=None, **kwargs):
        """fairseq's --retain-dropout (prepare_for_inference_): the AWD dropouts, which are not
        FairseqDropout modules, stay on at inference, every one of them or, with
        --retain-dropout-modules, where the list names this decoder's class (FairseqDropout's
        module_name in fairseq's own decoders). Decoding then runs each step as a chunk of one token,
        the steps' own path having no dropout."""
        named = retain_dropout_modules is None or type(self).__name__ in retain_dropout_modules
        if retain_dropout and named:
            self.retain_dropout = True

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                         carried_state=None, **kwargs):
        if carried_state is not None:
            # truncated BPTT over streams (--task language_modeling_bptt): start from the state the
            # previous chunk ended with, hand this chunk's on without its graph
            x, state = self.forward_with_state(prev_output_tokens, carried_state.state)
            carried_state.state = [RecurrentState(*(None if t is None else t.detach() for t in layer))
                                   for layer in state]
            return x, None
        buffer = self.get_incremental_state(incremental_state, "lstm_state")
        state = None
        if buffer:
            prev_output_tokens = prev_output_tokens[:, -1:]
            state = buffer_to_states(buffer, self.num_layers)
        x, state = self.forward_with_state(prev_output_tokens, state)
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "lstm_state", states_to_buffer(state))
        return x, None

    def output_layer(self, features, **kwargs):
        return self.output_projection(features)

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                features_only=False, carried_state=None, **kwargs):
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state, carried_state)
        return (x if features_only else self.output_layer(x)), extra

    def reorder_incremental_state(self, incremental_state, new_order):
        buffer = self.get_incremental_state(incremental_state, "lstm_state")
        if buffer:
            self.set_incremental_state(incremental_state, "lstm_state",
                                       reorder_buffer(buffer, new_order))

    def max_positions(self):
        return self.max_target_positions


@model("momentum_lstm_lm")
class MomentumLSTMLanguageModel(FairseqLanguageModel):
    @staticmethod
    def add_args(parser):
        parser.add_argument("--dropout", type=probability, metavar="D",
                            help="default of every dropout below")
        parser.add_argument("--decoder-embed-dim", type=positive_int, metavar="N",
                            help="word embedding dimension")
        parser.add_argument("--decoder-hidden-size", type=positive_int, metavar="N",
                            help="hidden size of every LSTM layer but the last")
        parser.add_argument("--decoder-layers", type=positive_int, metavar="N",
                            help="number of LSTM layers")
        parser.add_argument("--decoder-out-embed-dim", type=positive_int, metavar="N",
                            help="hidden size of the last LSTM layer (the output embedding); "
                                 "must equal --decoder-embed-dim when embeddings are shared")
        parser.add_argument("--decoder-dropout-in", type=probability, metavar="D",
                            help="locked dropout on the word embeddings (AWD-LSTM dropouti)")
        parser.add_argument("--decoder-dropout-hidden", type=probability, metavar="D",
                            help="locked dropout between LSTM layers (AWD-LSTM dropouth)")
        parser.add_argument("--decoder-dropout-out", type=probability, metavar="D",
                            help="locked dropout on the last layer's output (AWD-LSTM dropout)")
        parser.add_argument("--decoder-embed-dropout", type=probability, metavar="D",
                            help="fraction of words dropped from the embedding matrix "
                                 "(AWD-LSTM dropoute)")
        parser.add_argument("--weight-drop", type=probability, metavar="D",
                            help="DropConnect on hidden-to-hidden weights (AWD-LSTM wdrop)")
        parser.add_argument("--share-decoder-input-output-embed", action="store_true",
                            default=None, help="tie input and output embeddings")
        add_lstm_cell_args(parser)

    @classmethod
    def build_model(cls, args, task):
        base_architecture(args)
        check_lstm_cell_args(args)
        if args.share_decoder_input_output_embed and args.decoder_out_embed_dim != args.decoder_embed_dim:
            raise ValueError(
                "--share-decoder-input-output-embed needs --decoder-out-embed-dim "
                f"({args.decoder_out_embed_dim}) equal to --decoder-embed-dim ({args.decoder_embed_dim})")
        return cls(MomentumLSTMLMDecoder(args, task.target_dictionary))


@architecture("momentum_lstm_lm", "momentum_lstm_lm")
def base_architecture(args):
    fill_unset(args, dropout=0.1, decoder_embed_dim=512, decoder_layers=1,
               share_decoder_input_output_embed=False)
    fill_unset(args, decoder_hidden_size=args.decoder_embed_dim)
    fill_unset(args, decoder_out_embed_dim=(args.decoder_embed_dim if args.share_decoder_input_output_embed
                                            else args.decoder_hidden_size),
               decoder_dropout_in=args.dropout, decoder_dropout_hidden=args.dropout,
               decoder_dropout_out=args.dropout, decoder_embed_dropout=0.0, weight_drop=0.0)
    lstm_cell_defaults(args)


@architecture("momentum_lstm_lm", "momentum_lstm_lm_ptb")
def momentum_lstm_lm_ptb(args):
    """PTB (MomentumRNN, Appendix A.3, Tables 6-7): 3 layers, 1150 hidden, 400-dim tied
    embeddings, AWD-LSTM's PTB regularisation, MomentumLSTM with mu = 0, s = 0.6."""
    fill_unset(args, decoder_embed_dim=400, decoder_hidden_size=1150, decoder_layers=3,
               share_decoder_input_output_embed=True, decoder_dropout_in=0.4, decoder_dropout_hidden=0.25,
               decoder_dropout_out=0.4, decoder_embed_dropout=0.1, weight_drop=0.5)
    lstm_cell_defaults(args, momentum=0.0, step_size=0.6)
    base_architecture(args)
