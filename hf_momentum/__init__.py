"""HuggingFace transformers integration of momentum-plugins.

`import hf_momentum` registers
- attention implementations "momentum" and "linear_attention" (with mask functions) for stock
  models: `AutoModel.from_config(cfg, attn_implementation="momentum")` after
  `hf_momentum.set_momentum_attention(cfg, momentum=..., step_size=..., feature_map=...)`;
  a model running them records the implementation and its β, γ, φ in its saved config.json, so
  `from_pretrained` restores it here and refuses (naming this package) where it is not imported;
- model_type "momentum_transformer" (MomentumTransformerConfig, ...Model, ...ForCausalLM,
  ...ForSequenceClassification, ...ForTokenClassification, ...ForQuestionAnswering,
  ...ForMaskedLM; StaticMomentumCache for a compiled decode step) with AutoConfig / AutoModel /
  AutoModelForCausalLM / AutoModelForSequenceClassification / AutoModelForTokenClassification /
  AutoModelForQuestionAnswering / AutoModelForMaskedLM;
- model_type "momentum_lstm" (MomentumLSTMConfig, MomentumLSTMModel, MomentumLSTMForCausalLM,
  MomentumLSTMForSequenceClassification, MomentumLSTMForTokenClassification,
  MomentumLSTMForQuestionAnswering; StaticMomentumLSTMCache for a compiled decode step) with the
  same Auto classes but AutoModelForMaskedLM (an LSTM reads one direction);
- model_type "momentum_seq2seq" (MomentumSeq2SeqConfig, MomentumSeq2SeqModel,
  MomentumSeq2SeqForConditionalGeneration, MomentumSeq2SeqCache, StaticMomentumSeq2SeqCache): the
  encoder-decoder, with AutoConfig / AutoModel / AutoModelForSeq2SeqLM;
- model_type "momentum_lstm_seq2seq" (MomentumLSTMSeq2SeqConfig, MomentumLSTMSeq2SeqModel,
  MomentumLSTMSeq2SeqForConditionalGeneration, MomentumLSTMSeq2SeqCache,
  StaticMomentumLSTMSeq2SeqCache): the attentional
  MomentumLSTM encoder-decoder (fairseq's momentum_lstm), with the same Auto classes.
`FairseqLengthLimit` is fairseq's length limit for generate() (a converted translation model's beam
search then finds fairseq-generate's hypotheses).
Saved models carry their code and load with `trust_remote_code=True` without this package.
"""
from . import requirements  # noqa: F401,I001  (first: refuses a transformers below the floor)
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .attention_interface import (
    IGNORING_MODEL_TYPES,
    LINEAR,
    MOMENTUM,
    REJECTING_MODEL_TYPES,
    SMOKE_TESTED_MODEL_TYPES,
    SUPPORTED_MODEL_TYPES,
    TESTED_MODEL_TYPES,
    check_model,
    linear_attention_forward,
    momentum_attention_forward,
    register,
    set_momentum_attention,
)
from .configuration_momentum_lstm import MomentumLSTMConfig
from .configuration_momentum_lstm_seq2seq import MomentumLSTMSeq2SeqConfig
from .configuration_momentum_seq2seq import MomentumSeq2SeqConfig
from .configuration_momentum_transformer import MomentumTransformerConfig
from .modeling_momentum_lstm import (
    MomentumLSTMCache,
    MomentumLSTMForCausalLM,
    MomentumLSTMForQuestionAnswering,
    MomentumLSTMForSequenceClassification,
    MomentumLSTMForTokenClassification,
    MomentumLSTMModel,
    MomentumLSTMPreTrainedModel,
    StaticMomentumLSTMCache,
)
from .modeling_momentum_lstm_seq2seq import (
    MomentumLSTMEncoderOutput,
    MomentumLSTMSeq2SeqCache,
    MomentumLSTMSeq2SeqForConditionalGeneration,
    MomentumLSTMSeq2SeqModel,
    MomentumLSTMSeq2SeqPreTrainedModel,
    StaticMomentumLSTMSeq2SeqCache,
)
from .modeling_momentum_seq2seq import (
    MomentumSeq2SeqCache,
    MomentumSeq2SeqForConditionalGeneration,
    MomentumSeq2SeqModel,
    MomentumSeq2SeqPreTrainedModel,
    StaticMomentumSeq2SeqCache,
)
from .modeling_momentum_transformer import (
    MomentumCache,
    MomentumTransformerForCausalLM,
    MomentumTransformerForMaskedLM,
    MomentumTransformerForQuestionAnswering,
    MomentumTransformerForSequenceClassification,
    MomentumTransformerForTokenClassification,
    MomentumTransformerModel,
    MomentumTransformerPreTrainedModel,
    StaticMomentumCache,
)
from .fairseq_generation import FairseqLengthLimit
from .recurrent_cache import RecurrentCache, StaticStateMixin

register()
AutoConfig.register(MomentumTransformerConfig.model_type, MomentumTransformerConfig, exist_ok=True)
AutoModel.register(MomentumTransformerConfig, MomentumTransformerModel, exist_ok=True)
AutoModelForCausalLM.register(MomentumTransformerConfig, MomentumTransformerForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(MomentumTransformerConfig,
                                            MomentumTransformerForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(MomentumTransformerConfig, MomentumTransformerForTokenClassification,
                                         exist_ok=True)
AutoModelForQuestionAnswering.register(MomentumTransformerConfig, MomentumTransformerForQuestionAnswering,
                                       exist_ok=True)
AutoModelForMaskedLM.register(MomentumTransformerConfig, MomentumTransformerForMaskedLM, exist_ok=True)
AutoConfig.register(MomentumSeq2SeqConfig.model_type, MomentumSeq2SeqConfig, exist_ok=True)
AutoModel.register(MomentumSeq2SeqConfig, MomentumSeq2SeqModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(MomentumSeq2SeqConfig, MomentumSeq2SeqForConditionalGeneration, exist_ok=True)
AutoConfig.register(MomentumLSTMConfig.model_type, MomentumLSTMConfig, exist_ok=True)
AutoModel.register(MomentumLSTMConfig, MomentumLSTMModel, exist_ok=True)
AutoModelForCausalLM.register(MomentumLSTMConfig, MomentumLSTMForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(MomentumLSTMConfig, MomentumLSTMForSequenceClassification,
                                            exist_ok=True)
AutoModelForTokenClassification.register(MomentumLSTMConfig, MomentumLSTMForTokenClassification,
                                         exist_ok=True)
AutoModelForQuestionAnswering.register(MomentumLSTMConfig, MomentumLSTMForQuestionAnswering, exist_ok=True)
AutoConfig.register(MomentumLSTMSeq2SeqConfig.model_type, MomentumLSTMSeq2SeqConfig, exist_ok=True)
AutoModel.register(MomentumLSTMSeq2SeqConfig, MomentumLSTMSeq2SeqModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(MomentumLSTMSeq2SeqConfig, MomentumLSTMSeq2SeqForConditionalGeneration,
                               exist_ok=True)

__all__ = [
    "MOMENTUM", "LINEAR", "TESTED_MODEL_TYPES", "SMOKE_TESTED_MODEL_TYPES", "SUPPORTED_MODEL_TYPES",
    "REJECTING_MODEL_TYPES", "IGNORING_MODEL_TYPES",
    "set_momentum_attention", "check_model", "momentum_attention_forward", "linear_attention_forward",
    "register",
    "MomentumTransformerConfig", "MomentumTransformerPreTrainedModel", "MomentumTransformerModel",
    "MomentumTransformerForCausalLM", "MomentumTransformerForSequenceClassification",
    "MomentumTransformerForTokenClassification", "MomentumTransformerForQuestionAnswering",
    "MomentumTransformerForMaskedLM", "MomentumCache",
    "StaticMomentumCache", "RecurrentCache", "StaticStateMixin", "MomentumLSTMConfig",
    "MomentumLSTMPreTrainedModel", "MomentumLSTMModel",
    "MomentumLSTMForCausalLM", "MomentumLSTMForSequenceClassification", "MomentumLSTMForTokenClassification",
    "MomentumLSTMForQuestionAnswering", "MomentumLSTMCache", "StaticMomentumLSTMCache", "FairseqLengthLimit",
    "MomentumSeq2SeqConfig",
    "MomentumSeq2SeqPreTrainedModel", "MomentumSeq2SeqModel", "MomentumSeq2SeqForConditionalGeneration",
    "MomentumSeq2SeqCache", "StaticMomentumSeq2SeqCache",
    "MomentumLSTMSeq2SeqConfig", "MomentumLSTMSeq2SeqPreTrainedModel", "MomentumLSTMSeq2SeqModel",
    "MomentumLSTMSeq2SeqForConditionalGeneration", "MomentumLSTMSeq2SeqCache", "MomentumLSTMEncoderOutput",
    "StaticMomentumLSTMSeq2SeqCache",
]
