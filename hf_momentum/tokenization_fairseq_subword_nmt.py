"""The tokenizer of a model trained with fairseq on subword-nmt BPE, the `@@ ` pieces of fairseq's
translation examples (Moses tokenization, then subword-nmt's BPE, before fairseq-preprocess; or the
task's `--tokenizer moses --bpe subword_nmt --bpe-codes`): a text is Moses-tokenized, split by the
BPE codes, and each piece takes its id in the fairseq dictionary (`<unk>` where the dictionary has
none), as fairseq's `MosesTokenizer.encode`, `SubwordNMTBPE.encode` and `encode_line` do. Without
codes it is Moses' words alone; without a Moses language, the BPE of whitespace-separated text. A
translation model's second dictionary as tokenization_fairseq_dictionary says.

Decoding removes the separator (fairseq's `--post-process subword_nmt`), then Moses-detokenizes in
the target language, fairseq's `SubwordNMTBPE.decode` and `MosesTokenizer.decode`. The segmentation
is subword-nmt's and sacremoses' own, which fairseq calls. A model converted by
`fairseq_momentum.convert_to_hf --bpe-codes` saves it beside its weights; this file travels with it
(`trust_remote_code=True`), needing subword-nmt and, with Moses, sacremoses."""
from typing import Optional

from .tokenization_fairseq_dictionary import FairseqDictionaryTokenizer


class FairseqSubwordNMTTokenizer(FairseqDictionaryTokenizer):
    """bpe_codes_file: subword-nmt's codes (or None: no BPE); bpe_separator: what ends a piece that a
    word continues (fairseq's --bpe-separator); moses_source_lang / moses_target_lang: the languages
    of Moses' tokenizer and detokenizer (None: no Moses), with fairseq's --moses-no-dash-splits and
    --moses-no-escape as moses_dash_splits / moses_escape False; vocab_file (and target_vocab_file):
    the dictionary's symbols, one per line, line i = id i."""

    vocab_files_names = {"bpe_codes_file": "bpecodes", **FairseqDictionaryTokenizer.vocab_files_names}

    def __init__(self, bpe_codes_file: Optional[str], vocab_file, target_vocab_file=None, bpe_separator="@@",
                 moses_source_lang: Optional[str] = None, moses_target_lang: Optional[str] = None,
                 moses_dash_splits=True, moses_escape=True, **kwargs):
        self.bpe_codes_file = None if bpe_codes_file is None else str(bpe_codes_file)
        self.bpe = None
        if self.bpe_codes_file is not None:
            from subword_nmt.apply_bpe import BPE
            with open(self.bpe_codes_file, encoding="utf-8") as codes:
                self.bpe = BPE(codes, separator=bpe_separator)
        self.moses = self.detokenizer = None
        if moses_source_lang is not None:
            import sacremoses
            self.moses = sacremoses.MosesTokenizer(moses_source_lang)
            self.detokenizer = sacremoses.MosesDetokenizer(moses_target_lang or moses_source_lang)
        self.bpe_separator = bpe_separator
        self.moses_dash_splits, self.moses_escape = moses_dash_splits, moses_escape
        super().__init__(vocab_file, target_vocab_file, bpe_separator=bpe_separator,
                         moses_source_lang=moses_source_lang, moses_target_lang=moses_target_lang,
                         moses_dash_splits=moses_dash_splits, moses_escape=moses_escape, **kwargs)

    def _tokenize(self, text, **kwargs):
        if self.moses is not None:
            text = self.moses.tokenize(text, aggressive_dash_splits=self.moses_dash_splits, return_str=True,
                                       escape=self.moses_escape)
        if self.bpe is not None:
            text = self.bpe.process_line(text)
        return text.split()

    def convert_tokens_to_string(self, tokens):
        text = " ".join(tokens)
        if self.bpe is not None:
            text = (text + " ").replace(self.bpe_separator + " ", "").rstrip()
        return text if self.detokenizer is None else self.detokenizer.detokenize(text.split())
