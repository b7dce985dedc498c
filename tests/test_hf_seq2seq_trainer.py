"""The encoder-decoder learns with transformers' own training loop: Seq2SeqTrainer and
DataCollatorForSeq2Seq (which pads labels with -100 and builds the decoder's inputs through the
model's `prepare_decoder_input_ids_from_labels`) teach it to reverse short sequences, which needs
the cross-attention to find each source position; beam search then reverses unseen ones."""
import random

import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import (
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerFast,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from hf_momentum import (
    MomentumLSTMSeq2SeqConfig,
    MomentumLSTMSeq2SeqForConditionalGeneration,
    MomentumSeq2SeqConfig,
    MomentumSeq2SeqForConditionalGeneration,
)

UNK, PAD, EOS, VOCAB = 0, 1, 2, 13


def reversal_pairs(count, seed):
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        source = [rng.randint(3, VOCAB - 1) for _ in range(rng.randint(2, 5))]
        pairs.append({"input_ids": source + [EOS], "attention_mask": [1] * (len(source) + 1),
                      "labels": source[::-1] + [EOS]})
    return pairs


def exact_matches(model, pairs):
    """The share of pairs whose beam-search output is the reversed source, then EOS."""
    model.eval()
    right = 0
    with torch.no_grad():
        for pair in pairs:
            out = model.generate(input_ids=torch.tensor([pair["input_ids"]]), max_new_tokens=8, num_beams=2,
                                 do_sample=False)
            right += out[0, 1:1 + len(pair["labels"])].tolist() == pair["labels"]
    return right / len(pairs)


# momentum cross-attention, the one that must learn to find a position (linear attention has no
# softmax to sharpen): the Trainer's loop is the same for the others, whose cross-attention
# tests/test_hf_seq2seq.py checks against its equations (26 s each on the CI machine)
@pytest.mark.parametrize("cross", ["momentum"])
def test_seq2seq_trainer_teaches_reversal(cross, tmp_path):
    torch.manual_seed(0)
    config = MomentumSeq2SeqConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, encoder_layers=2,
                                   num_attention_heads=4, max_position_embeddings=16, hidden_dropout=0.0,
                                   pad_token_id=PAD, bos_token_id=UNK, eos_token_id=EOS,
                                   decoder_start_token_id=EOS, cross_attention=cross)
    assert trained_exact_matches(MomentumSeq2SeqForConditionalGeneration(config), tmp_path, epochs=12,
                                 learning_rate=3e-3) > 0.9


def word_tokenizer(vocab_size=VOCAB):
    """A word-level tokenizer whose words are the ids themselves ("0", "1", ...), with UNK, PAD, EOS."""
    words = models.WordLevel({str(i): i for i in range(vocab_size)}, unk_token=str(UNK))
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(words), unk_token=str(UNK), pad_token=str(PAD),
                                   eos_token=str(EOS))


def trained_exact_matches(model, tmp_path, epochs, learning_rate):
    """The share of held-out pairs `model` reverses after Seq2SeqTrainer's training (none before)."""
    tokenizer = word_tokenizer()
    held_out = reversal_pairs(50, seed=1)
    before = exact_matches(model, held_out)
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=32, num_train_epochs=epochs,
        learning_rate=learning_rate,
        warmup_steps=20, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        logging_strategy="no", seed=0)
    Seq2SeqTrainer(model=model, args=args, train_dataset=reversal_pairs(1500, seed=0),
                   data_collator=DataCollatorForSeq2Seq(tokenizer, model=model)).train()
    assert before < 0.1, before
    return exact_matches(model, held_out)


def test_seq2seq_trainer_teaches_the_lstm_encoder_decoder_reversal(tmp_path):
    """The same loop for the attentional MomentumLSTM encoder-decoder (its attention must learn to
    find each source position; dropout on, as fairseq's presets train)."""
    torch.manual_seed(0)
    config = MomentumLSTMSeq2SeqConfig(
        vocab_size=VOCAB, encoder_embedding_size=32, encoder_hidden_size=32, encoder_bidirectional=True,
        decoder_embedding_size=32, hidden_size=64, decoder_output_size=32, num_hidden_layers=1,
        cell="momentum", tie_word_embeddings=True, share_encoder_decoder_embeddings=True, pad_token_id=PAD,
        bos_token_id=UNK, eos_token_id=EOS, decoder_start_token_id=EOS)
    assert trained_exact_matches(MomentumLSTMSeq2SeqForConditionalGeneration(config), tmp_path, epochs=16,
                                 learning_rate=1.5e-2) > 0.9
