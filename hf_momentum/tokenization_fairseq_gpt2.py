"""The tokenizer of a model trained with fairseq on GPT-2 byte-level BPE (`--bpe gpt2`, RoBERTa's
encoding): the BPE of `encoder.json` / `vocab.bpe` turns a text into GPT-2 ids, and each id takes
the index of its decimal string in the fairseq dictionary (`<unk>` where the dictionary has none),
as fairseq's `GPT2BPE.encode` followed by `encode_line` does; a translation model's second dictionary
as tokenization_fairseq_dictionary says. A model converted by `fairseq_momentum.convert_to_hf` saves
it beside its weights; this file travels with it (`trust_remote_code=True`), needing only the
tokenizers package (transformers' own).

The BPE itself is the tokenizers library's (its byte-level pre-tokenizer splits with GPT-2's
pattern, as fairseq's encoder does). Decoding maps each index back to its GPT-2 token and its bytes,
fairseq's `GPT2BPE.decode`.

Where one dictionary holds every GPT-2 token (RoBERTa's dict.txt), the converter saves
`FairseqGPT2TokenizerFast` instead, the same BPE with the dictionary's ids in its vocabulary (HF's
RoBERTa vocab.json is built so): offsets and word ids, as transformers' QA and token-classification
scripts need."""
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from .tokenization_fairseq_dictionary import FairseqDictionaryTokenizer


def refuse_words_without_prefix_space(tokenizer, is_split_into_words: bool):
    """Words given one by one are each read as a text's first word, without the leading space they
    have inside a sentence, unless the tokenizer adds one."""
    if is_split_into_words and not tokenizer.add_prefix_space:
        raise ValueError("is_split_into_words=True: load the tokenizer with add_prefix_space=True (as for "
                         "RoBERTa), so that each word is encoded as it is inside a sentence")


class FairseqGPT2Tokenizer(FairseqDictionaryTokenizer):
    """GPT-2 byte-level BPE with a fairseq dictionary's ids. encoder_json_file: GPT-2's encoder.json
    (token → GPT-2 id); vocab_bpe_file: its vocab.bpe (the merges); vocab_file (and
    target_vocab_file): the fairseq dictionary's symbols, one per line, line i = index i (GPT-2 ids as
    decimal strings, and the specials)."""

    vocab_files_names = {"encoder_json_file": "encoder.json", "vocab_bpe_file": "vocab.bpe",
                         **FairseqDictionaryTokenizer.vocab_files_names}

    def __init__(self, encoder_json_file, vocab_bpe_file, vocab_file, target_vocab_file=None,
                 add_prefix_space=False, **kwargs):
        self.encoder_json_file, self.vocab_bpe_file = str(encoder_json_file), str(vocab_bpe_file)
        self.add_prefix_space = add_prefix_space
        self.bpe = Tokenizer(models.BPE.from_file(self.encoder_json_file, self.vocab_bpe_file))
        self.bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self.bpe.decoder = decoders.ByteLevel()
        self.gpt2_ids = json.loads(Path(self.encoder_json_file).read_text(encoding="utf-8"))
        self.gpt2_tokens = {i: token for token, i in self.gpt2_ids.items()}
        super().__init__(vocab_file, target_vocab_file, add_prefix_space=add_prefix_space, **kwargs)

    def _encode_plus(self, *args, is_split_into_words=False, **kwargs):
        refuse_words_without_prefix_space(self, is_split_into_words)
        return super()._encode_plus(*args, is_split_into_words=is_split_into_words, **kwargs)

    def prepare_for_tokenization(self, text, is_split_into_words=False, **kwargs):
        # as the byte-level pre-tokenizer's add_prefix_space: a space where the text has none
        if self.add_prefix_space and text and not text.startswith(" "):
            text = " " + text
        return super().prepare_for_tokenization(text, is_split_into_words, **kwargs)

    def _tokenize(self, text, **kwargs):
        """GPT-2's byte-level tokens of the text."""
        return self.bpe.encode(text, add_special_tokens=False).tokens

    def symbol_of(self, token):
        return str(self.gpt2_ids[token]) if token in self.gpt2_ids else token

    def token_of(self, symbol):
        return self.gpt2_tokens[int(symbol)] if symbol.isdigit() else symbol

    def convert_tokens_to_string(self, tokens):
        # specials (<unk>, <mask>) are plain ASCII, which byte-level decoding keeps as they are
        return self.bpe.decoder.decode(tokens)


class FairseqGPT2TokenizerFast(TokenizersBackend):
    """GPT-2 byte-level BPE whose vocabulary holds the fairseq dictionary's ids (tokenizer.json).
    As fairseq encodes a line, a text's first word has no leading space; `add_prefix_space=True`
    gives it one, as transformers' RoBERTa tokenizer does, which words given one by one
    (`is_split_into_words=True`) need: without it each word would be read as a text's first, and
    its pieces would differ from those of the same word inside a sentence."""

    slow_tokenizer_class = FairseqGPT2Tokenizer

    @property
    def add_prefix_space(self) -> bool:
        return self._add_prefix_space

    @add_prefix_space.setter
    def add_prefix_space(self, value: bool):
        # set by TokenizersBackend's __init__ once its backend is loaded (no __init__ here, so that
        # transformers loads tokenizer.json itself): the byte-level pre-tokenizer adds the space, and
        # the offsets' post-processor must know it did
        self._add_prefix_space = bool(value)
        if self._tokenizer is None or self._tokenizer.pre_tokenizer.add_prefix_space == value:
            return          # as saved: no rebuild of the whole vocabulary and merges
        state = json.loads(self._tokenizer.to_str())
        processor = state["post_processor"] or {}
        for part in (state["pre_tokenizer"], *processor.get("processors", [processor])):
            if part.get("type") == "ByteLevel":
                part["add_prefix_space"] = self._add_prefix_space
        self._tokenizer = Tokenizer.from_str(json.dumps(state))

    def _encode_plus(self, *args, is_split_into_words=False, **kwargs):
        refuse_words_without_prefix_space(self, is_split_into_words)
        return super()._encode_plus(*args, is_split_into_words=is_split_into_words, **kwargs)
