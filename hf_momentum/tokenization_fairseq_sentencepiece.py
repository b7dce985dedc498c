"""The tokenizer of a model trained with fairseq on sentencepiece pieces: the sentencepiece model
segments a text, then each piece takes its id in the fairseq dictionary (`<unk>` where the
dictionary has no such piece), as fairseq's `--bpe sentencepiece` with `encode_line` does; a
translation model's second dictionary as tokenization_fairseq_dictionary says. A model converted by
`fairseq_momentum.convert_to_hf --sentencepiece-model` saves it beside its weights; this file
travels with it (`trust_remote_code=True`), needing only sentencepiece.

Decoding joins the pieces and turns `▁` into spaces, fairseq's `--post-process sentencepiece`."""
import sentencepiece

from .tokenization_fairseq_dictionary import FairseqDictionaryTokenizer

SPACE = "\u2581"


class FairseqSentencePieceTokenizer(FairseqDictionaryTokenizer):
    """sentencepiece segmentation with a fairseq dictionary's ids. sp_model_file: the
    sentencepiece model; vocab_file (and target_vocab_file): the dictionary's symbols, one per line,
    line i = id i."""

    vocab_files_names = {"sp_model_file": "sentencepiece.model",
                         **FairseqDictionaryTokenizer.vocab_files_names}

    def __init__(self, sp_model_file, vocab_file, target_vocab_file=None, **kwargs):
        self.sp_model_file = str(sp_model_file)
        self.sp_model = sentencepiece.SentencePieceProcessor(model_file=self.sp_model_file)
        super().__init__(vocab_file, target_vocab_file, **kwargs)

    def _tokenize(self, text, **kwargs):
        """The pieces as fairseq's encode_line reads them: joined by spaces, then split on
        Python's whitespace, which also splits a piece holding a character sentencepiece keeps but
        Python counts as whitespace (U+0085, U+001C-U+001F)."""
        return " ".join(self.sp_model.encode(text, out_type=str)).split()

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens).replace(SPACE, " ").strip()
