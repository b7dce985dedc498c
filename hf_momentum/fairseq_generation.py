"""fairseq's SequenceGenerator rules that transformers' generation_config cannot hold, as a logits
processor for generate(). A converted translation model's generation_config already holds the rest
of fairseq-generate's defaults (fairseq_momentum.convert_to_hf)."""
import torch
from transformers import LogitsProcessor

from .validation import check_int


class FairseqLengthLimit(LogitsProcessor):
    """fairseq's length limit: at the step that reaches `max_length` only `</s>` may follow, and it
    keeps its own log-probability, so a hypothesis cut there is scored as fairseq scores it.
    transformers' `forced_eos_token_id` gives `</s>` a log-probability of 0 there instead, and without
    it a beam that reaches max_length ends without `</s>`; either ranks such hypotheses differently.
    With the converted defaults, beam search then finds fairseq-generate's hypotheses and scores:

        generate(input_ids, max_length=n, logits_processor=[FairseqLengthLimit(n, eos_token_id)])

    max_length: generate()'s, counting the decoder's start token."""

    def __init__(self, max_length: int, eos_token_id: int):
        self.max_length = check_int(max_length, "max_length", low=2)
        self.eos_token_id = check_int(eos_token_id, "eos_token_id", low=0)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[-1] != self.max_length - 1:
            return scores
        only_eos = torch.arange(scores.shape[-1], device=scores.device) == self.eos_token_id
        return torch.where(only_eos, scores, -torch.inf)
