"""The fast tokenizer `fairseq_momentum.convert_to_hf` saves for a model trained on sentencepiece
pieces when its dictionary holds every piece: the sentencepiece model rebuilt in the tokenizers
library (tokenizer.json), with the dictionary's ids. This file travels with it
(`trust_remote_code=True`) and needs no sentencepiece; what it adds to transformers' fast tokenizer
is fairseq's decoding, `--post-process sentencepiece`, which strips the text's ends."""
from transformers.tokenization_utils_tokenizers import TokenizersBackend


class FairseqSentencePieceTokenizerFast(TokenizersBackend):
    """sentencepiece segmentation with a fairseq dictionary's ids, in the tokenizers library."""

    def _decode(self, *args, **kwargs) -> str:
        # a text's first or last piece may be a lone ▁ (its space), which fairseq strips
        return super()._decode(*args, **kwargs).strip()
