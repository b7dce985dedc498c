"""Tokenizers whose ids are a fairseq dictionary's (`fairseq_vocab.txt`, one symbol per line, line
i = index i), as fairseq's `Dictionary.encode_line` gives them after its BPE: a symbol the dictionary
lacks is `<unk>`. A translation model trained on two dictionaries (fairseq-preprocess without
--joined-dictionary) has a second one, `fairseq_target_vocab.txt`: as transformers' MarianTokenizer
with separate vocabularies does, `text_target=` (the labels) is encoded with it, and decoding (of
generated ids) always reads it.

A subclass says how a text becomes the dictionary's symbols (`_tokenize`, then `symbol_of`) and how
symbols become text again (`token_of`, `convert_tokens_to_string`). `FairseqWordTokenizer` here is
fairseq's default, whitespace-separated words, for data without BPE. `wrap` says what a text is
wrapped in (saved with the tokenizer; `build_inputs_with_special_tokens` lays it out): "eos" (a translation
source or target: text, then `</s>`), "bos_eos" (a masked LM's `<s> ... </s>`), "none" (a language
model's prompt), or, for a sentence_prediction classifier, "eos_sep" / "bos_eos_sep": "eos" / "bos_eos"
with a pair's second text after a separator `</s>` (RoBERTa's `<s> a </s> </s> b </s>`, fairseq's
--init-token 0 --separator-token 2). Files of this module travel with a converted model
(`trust_remote_code=True`)."""
import shutil
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from transformers import PreTrainedTokenizer


def wrap_layout(wrap: str) -> Tuple[bool, bool, bool]:
    """(whether a text follows `<s>`, whether each text ends with `</s>`, whether a pair's second
    text follows a separator `</s>`) of a `wrap`."""
    return wrap.startswith("bos_eos"), wrap != "none", wrap.endswith("_sep")


class Vocabulary:
    """A fairseq dictionary's symbols in index order, and each symbol's index."""

    def __init__(self, path: str):
        self.symbols: List[str] = Path(path).read_text(encoding="utf-8").split("\n")[:-1]
        self.ids: Dict[str, int] = {symbol: i for i, symbol in enumerate(self.symbols)}


class FairseqDictionaryTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "fairseq_vocab.txt", "target_vocab_file": "fairseq_target_vocab.txt"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, target_vocab_file=None, bos_token="<s>", pad_token="<pad>",
                 eos_token="</s>", unk_token="<unk>", wrap="eos", **kwargs):
        self.vocab_file = str(vocab_file)
        self.target_vocab_file = None if target_vocab_file is None else str(target_vocab_file)
        self.source = Vocabulary(self.vocab_file)
        self.target = self.source if target_vocab_file is None else Vocabulary(self.target_vocab_file)
        self.current = self.source
        self.wrap = wrap
        kwargs.pop("special_tokens_pattern", None)          # `wrap` decides it
        super().__init__(bos_token=bos_token, pad_token=pad_token, eos_token=eos_token, unk_token=unk_token,
                         wrap=wrap, special_tokens_pattern=wrap, **kwargs)

    def _wrapped(self, first: list, second: Optional[list], lead, end) -> list:
        """`first` (and `second`) as `wrap` lays them out; `lead` / `end`: what stands for `<s>` /
        `</s>` (their ids, or the special-tokens mask's 1)."""
        leads, ends, separated = wrap_layout(self.wrap)
        if not ends:
            return first + (second or [])
        out = ([lead] if leads else []) + first + [end]
        if second is not None:
            out += ([end] if separated else []) + second + [end]
        return out

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        return self._wrapped(token_ids_0, token_ids_1, self.bos_token_id, self.eos_token_id)

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False):
        if already_has_special_tokens:
            return super().get_special_tokens_mask(token_ids_0, token_ids_1, already_has_special_tokens=True)
        return self._wrapped([0] * len(token_ids_0), None if token_ids_1 is None else [0] * len(token_ids_1),
                             1, 1)

    def _switch_to_input_mode(self):
        self.current = self.source

    def _switch_to_target_mode(self):
        self.current = self.target

    @property
    def vocab_size(self) -> int:
        return len(self.current.symbols)

    def get_vocab(self) -> dict:
        return {**self.current.ids, **self.added_tokens_encoder}

    def symbol_of(self, token: str) -> str:
        """The dictionary symbol of a token `_tokenize` gave."""
        return token

    def token_of(self, symbol: str) -> str:
        """The token of a dictionary symbol, for `convert_tokens_to_string`."""
        return symbol

    def _convert_token_to_id(self, token):
        return self.current.ids.get(self.symbol_of(token), self.current.ids[str(self.unk_token)])

    def _convert_id_to_token(self, index):
        return self.token_of(self.target.symbols[index])

    def save_vocabulary(self, save_directory, filename_prefix=None):
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        paths = []
        for name, filename in self.vocab_files_names.items():
            source: Optional[str] = getattr(self, name)
            if source is None:
                continue
            target = Path(save_directory) / (prefix + filename)
            if Path(source).resolve() != target.resolve():
                shutil.copyfile(source, target)
            paths.append(str(target))
        return tuple(paths)


class FairseqWordTokenizer(FairseqDictionaryTokenizer):
    """fairseq's default tokenization (no BPE): words separated by whitespace."""

    def _tokenize(self, text, **kwargs):
        return text.split()

    def convert_tokens_to_string(self, tokens):
        return " ".join(tokens)
