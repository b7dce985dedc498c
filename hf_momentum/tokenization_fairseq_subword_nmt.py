"""The tokenizer of a model trained with fairseq on subword-nmt BPE, the `@@ ` pieces of fairseq's
translation examples (Moses tokenization, then subword-nmt's BPE, before fairseq-preprocess; or the
task's `--tokenizer moses --bpe subword_nmt --bpe-codes`): a text is Moses-tokenized, split by the
BPE codes, and each piece takes its id in the fairseq dictionary (`<unk>` where the dictionary has
none), as fairseq's `MosesTokenizer.encode`, `SubwordNMTBPE.encode` and `encode_line` do. Without
codes it is Moses' words alone; without Moses, the BPE of whitespace-separated text. A
translation model's second dictionary as tokenization_fairseq_dictionary says.

Decoding removes the separator (fairseq's `--post-process subword_nmt`), then Moses-detokenizes in
the target language, fairseq's `SubwordNMTBPE.decode` and `MosesTokenizer.decode`. `text_target=`
is Moses-tokenized in the target language, as fairseq's translation examples tokenize each side of
the data in its own (fairseq's own tokenizer only ever encodes sources). The segmentation
is subword-nmt's and sacremoses' own, which fairseq calls. A model converted by
`fairseq_momentum.convert_to_hf --bpe-codes` saves it beside its weights; this file travels with it
(`trust_remote_code=True`), needing subword-nmt and, with Moses, sacremoses."""
from typing import Optional

from .tokenization_fairseq_dictionary import FairseqDictionaryTokenizer


class FairseqSubwordNMTTokenizer(FairseqDictionaryTokenizer):
    """bpe_codes_file: subword-nmt's codes (or None: no BPE); bpe_separator: what ends a piece that a
    word continues (fairseq's --bpe-separator); moses: Moses first, with moses_source_lang /
    moses_target_lang the languages of its tokenizer and detokenizer (as fairseq hands them to
    sacremoses, None included; `text_target=` is tokenized in moses_target_lang) and fairseq's
    --moses-no-dash-splits and --moses-no-escape as moses_dash_splits / moses_escape False;
    vocab_file (and target_vocab_file): the dictionary's symbols, one per line, line i = id i."""

    vocab_files_names = {"bpe_codes_file": "bpecodes", **FairseqDictionaryTokenizer.vocab_files_names}

    def __init__(self, bpe_codes_file: Optional[str], vocab_file, target_vocab_file=None, bpe_separator="@@",
                 moses=False, moses_source_lang: Optional[str] = None,
                 moses_target_lang: Optional[str] = None, moses_dash_splits=True, moses_escape=True,
                 **kwargs):
        self.bpe_codes_file = None if bpe_codes_file is None else str(bpe_codes_file)
        self.bpe = None
        if self.bpe_codes_file is not None:
            from subword_nmt.apply_bpe import BPE
            with open(self.bpe_codes_file, encoding="utf-8") as codes:
                self.bpe = BPE(codes, separator=bpe_separator)
        self.moses_tokenizers = {}
        self.moses_tokenizer = self.moses_detokenizer = None
        if moses:
            import sacremoses
            # each side of the data was Moses-tokenized in its own language (fairseq's prepare-*.sh)
            self.moses_tokenizers = {"source": sacremoses.MosesTokenizer(moses_source_lang),
                                     "target": sacremoses.MosesTokenizer(moses_target_lang)}
            self.moses_tokenizer = self.moses_tokenizers["source"]
            self.moses_detokenizer = sacremoses.MosesDetokenizer(moses_target_lang)
        self.bpe_separator = bpe_separator
        self.moses_dash_splits, self.moses_escape = moses_dash_splits, moses_escape
        super().__init__(vocab_file, target_vocab_file, bpe_separator=bpe_separator, moses=moses,
                         moses_source_lang=moses_source_lang, moses_target_lang=moses_target_lang,
                         moses_dash_splits=moses_dash_splits, moses_escape=moses_escape, **kwargs)

    def _switch_to_input_mode(self):
        super()._switch_to_input_mode()
        self.moses_tokenizer = self.moses_tokenizers.get("source")

    def _switch_to_target_mode(self):
        super()._switch_to_target_mode()
        self.moses_tokenizer = self.moses_tokenizers.get("target")

    def _tokenize(self, text, **kwargs):
        if self.moses_tokenizer is not None:
            text = self.moses_tokenizer.tokenize(text, aggressive_dash_splits=self.moses_dash_splits,
                                                 return_str=True, escape=self.moses_escape)
        if self.bpe is not None:
            text = self.bpe.process_line(text)
        return text.split()

    def convert_tokens_to_string(self, tokens):
        text = " ".join(tokens)
        if self.bpe is not None:
            text = (text + " ").replace(self.bpe_separator + " ", "").rstrip()
        if self.moses_detokenizer is None:
            return text
        return self.moses_detokenizer.detokenize(text.split())
