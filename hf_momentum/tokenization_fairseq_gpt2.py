"""The tokenizer of a model trained with fairseq on GPT-2 byte-level BPE (`--bpe gpt2`, RoBERTa's
encoding): the BPE of `encoder.json` / `vocab.bpe` turns a text into GPT-2 ids, and each id takes
the index of its decimal string in the fairseq dictionary (`<unk>` where the dictionary has none),
as fairseq's `GPT2BPE.encode` followed by `encode_line` does. A model converted by
`fairseq_momentum.convert_to_hf` saves it beside its weights; this file travels with it
(`trust_remote_code=True`), needing only the tokenizers package (transformers' own).

The BPE itself is the tokenizers library's (its byte-level pre-tokenizer splits with GPT-2's
pattern, as fairseq's encoder does). Decoding maps each index back to its GPT-2 token and its bytes,
fairseq's `GPT2BPE.decode`. `wrap` says what a text is wrapped in (transformers'
special_tokens_pattern, saved with the tokenizer): "eos", "bos_eos" (a masked LM's `<s> ... </s>`) or
"none" (a language model's prompt)."""
import json
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizer


class FairseqGPT2Tokenizer(PreTrainedTokenizer):
    """GPT-2 byte-level BPE with a fairseq dictionary's ids. vocab_file: GPT-2's encoder.json
    (token → GPT-2 id); merges_file: its vocab.bpe; dictionary_file: the fairseq dictionary's
    symbols, one per line, line i = index i (GPT-2 ids as decimal strings, and the specials)."""

    vocab_files_names = {"vocab_file": "vocab.json", "merges_file": "merges.txt",
                         "dictionary_file": "fairseq_vocab.txt"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, merges_file, dictionary_file, bos_token="<s>", pad_token="<pad>",
                 eos_token="</s>", unk_token="<unk>", wrap="none", **kwargs):
        self.vocab_file, self.merges_file = str(vocab_file), str(merges_file)
        self.dictionary_file = str(dictionary_file)
        self.bpe = Tokenizer(models.BPE.from_file(self.vocab_file, self.merges_file))
        self.bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self.bpe.decoder = decoders.ByteLevel()
        self.gpt2_ids = json.loads(Path(self.vocab_file).read_text(encoding="utf-8"))
        self.gpt2_tokens = {i: token for token, i in self.gpt2_ids.items()}
        self.symbols = Path(self.dictionary_file).read_text(encoding="utf-8").split("\n")[:-1]
        self.ids = {symbol: i for i, symbol in enumerate(self.symbols)}
        kwargs.pop("special_tokens_pattern", None)          # `wrap` decides it
        super().__init__(bos_token=bos_token, pad_token=pad_token, eos_token=eos_token, unk_token=unk_token,
                         wrap=wrap, special_tokens_pattern=wrap, **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self.symbols)

    def get_vocab(self) -> dict:
        return {**self.ids, **self.added_tokens_encoder}

    def _tokenize(self, text, **kwargs):
        """GPT-2's byte-level tokens of the text."""
        return self.bpe.encode(text, add_special_tokens=False).tokens

    def _convert_token_to_id(self, token):
        symbol = str(self.gpt2_ids[token]) if token in self.gpt2_ids else token
        return self.ids.get(symbol, self.ids[str(self.unk_token)])

    def _convert_id_to_token(self, index):
        symbol = self.symbols[index]
        return self.gpt2_tokens[int(symbol)] if symbol.isdigit() else symbol

    def convert_tokens_to_string(self, tokens):
        # specials (<unk>, <mask>) are plain ASCII, which byte-level decoding keeps as they are
        return self.bpe.decoder.decode(tokens)

    def save_vocabulary(self, save_directory, filename_prefix=None):
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        paths = []
        for name in ("vocab_file", "merges_file", "dictionary_file"):
            source = getattr(self, name)
            target = Path(save_directory) / (prefix + self.vocab_files_names[name])
            if Path(source).resolve() != target.resolve():
                shutil.copyfile(source, target)
            paths.append(str(target))
        return tuple(paths)
