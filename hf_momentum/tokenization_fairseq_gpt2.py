"""The tokenizer of a model trained with fairseq on GPT-2 byte-level BPE (`--bpe gpt2`, RoBERTa's
encoding): the BPE of `encoder.json` / `vocab.bpe` turns a text into GPT-2 ids, and each id takes
the index of its decimal string in the fairseq dictionary (`<unk>` where the dictionary has none),
as fairseq's `GPT2BPE.encode` followed by `encode_line` does; a translation model's second dictionary
as tokenization_fairseq_dictionary says. A model converted by `fairseq_momentum.convert_to_hf` saves
it beside its weights; this file travels with it (`trust_remote_code=True`), needing only the
tokenizers package (transformers' own).

The BPE itself is the tokenizers library's (its byte-level pre-tokenizer splits with GPT-2's
pattern, as fairseq's encoder does). Decoding maps each index back to its GPT-2 token and its bytes,
fairseq's `GPT2BPE.decode`."""
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from .tokenization_fairseq_dictionary import FairseqDictionaryTokenizer


class FairseqGPT2Tokenizer(FairseqDictionaryTokenizer):
    """GPT-2 byte-level BPE with a fairseq dictionary's ids. encoder_json_file: GPT-2's encoder.json
    (token → GPT-2 id); vocab_bpe_file: its vocab.bpe (the merges); vocab_file (and
    target_vocab_file): the fairseq dictionary's symbols, one per line, line i = index i (GPT-2 ids as
    decimal strings, and the specials)."""

    vocab_files_names = {"encoder_json_file": "encoder.json", "vocab_bpe_file": "vocab.bpe",
                         **FairseqDictionaryTokenizer.vocab_files_names}

    def __init__(self, encoder_json_file, vocab_bpe_file, vocab_file, target_vocab_file=None, **kwargs):
        self.encoder_json_file, self.vocab_bpe_file = str(encoder_json_file), str(vocab_bpe_file)
        self.bpe = Tokenizer(models.BPE.from_file(self.encoder_json_file, self.vocab_bpe_file))
        self.bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self.bpe.decoder = decoders.ByteLevel()
        self.gpt2_ids = json.loads(Path(self.encoder_json_file).read_text(encoding="utf-8"))
        self.gpt2_tokens = {i: token for token, i in self.gpt2_ids.items()}
        super().__init__(vocab_file, target_vocab_file, **kwargs)

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
