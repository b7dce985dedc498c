"""The tokenizer of a model trained with fairseq on sentencepiece pieces: the sentencepiece model
segments a text, then each piece takes its id in the fairseq dictionary (`<unk>` where the
dictionary has no such piece), as fairseq's `--bpe sentencepiece` with `encode_line` does. A
model converted by `fairseq_momentum.convert_to_hf --sentencepiece-model` saves it beside its
weights; this file travels with it (`trust_remote_code=True`), needing only sentencepiece.

Decoding joins the pieces and turns `▁` into spaces, fairseq's `--post-process sentencepiece`.
`wrap` says what a text is wrapped in (transformers' special_tokens_pattern, saved with the
tokenizer): "eos" (a translation source: text, then `</s>`), "bos_eos" (a masked LM's
`<s> ... </s>`) or "none" (a language model's prompt)."""
import shutil
from pathlib import Path

import sentencepiece
from transformers import PreTrainedTokenizer

SPACE = "\u2581"


class FairseqSentencePieceTokenizer(PreTrainedTokenizer):
    """sentencepiece segmentation with a fairseq dictionary's ids. sp_model_file: the
    sentencepiece model; vocab_file: the dictionary's symbols, one per line, line i = id i."""

    vocab_files_names = {"sp_model_file": "sentencepiece.model", "vocab_file": "fairseq_vocab.txt"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, sp_model_file, vocab_file, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
                 unk_token="<unk>", wrap="eos", **kwargs):
        self.sp_model_file, self.vocab_file = str(sp_model_file), str(vocab_file)
        self.sp_model = sentencepiece.SentencePieceProcessor(model_file=self.sp_model_file)
        self.symbols = Path(self.vocab_file).read_text(encoding="utf-8").split("\n")[:-1]
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
        return self.sp_model.encode(text, out_type=str)

    def _convert_token_to_id(self, token):
        return self.ids.get(token, self.ids[str(self.unk_token)])

    def _convert_id_to_token(self, index):
        return self.symbols[index]

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens).replace(SPACE, " ").strip()

    def save_vocabulary(self, save_directory, filename_prefix=None):
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        paths = []
        for name, source in (("sp_model_file", self.sp_model_file), ("vocab_file", self.vocab_file)):
            target = Path(save_directory) / (prefix + self.vocab_files_names[name])
            if Path(source).resolve() != target.resolve():
                shutil.copyfile(source, target)
            paths.append(str(target))
        return tuple(paths)
