"""The model card of the native families is a huggingface_hub.ModelCard with library_name,
license, pipeline_tag and the custom_code tag; the same tags are the models' model_tags (which
Trainer.push_to_hub puts in the card it writes); push_to_hub adds `tags` to the card and passes
its other keyword arguments to HfApi.upload_folder (checked offline with a stub of HfApi)."""
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from hf_momentum import saving

SIZES = {"momentum_transformer": dict(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=32,
                                      max_position_embeddings=32),
         "momentum_lstm": dict(vocab_size=50, hidden_size=16, num_hidden_layers=1),
         "momentum_seq2seq": dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, encoder_layers=2,
                                  num_attention_heads=2, intermediate_size=32, max_position_embeddings=32),
         "momentum_lstm_seq2seq": dict(vocab_size=50, hidden_size=16, num_hidden_layers=2)}


HEAD_TAGS = [(AutoModelForCausalLM, "text-generation"),
             (AutoModelForSequenceClassification, "text-classification"),
             (AutoModelForTokenClassification, "token-classification"),
             (AutoModelForQuestionAnswering, "question-answering")]
CARD_CASES = [(model_type, auto, tag) for model_type in ("momentum_lstm", "momentum_transformer")
              for auto, tag in HEAD_TAGS] + \
    [("momentum_transformer", AutoModelForMaskedLM, "fill-mask"),
     ("momentum_seq2seq", AutoModelForSeq2SeqLM, "translation"),
     ("momentum_lstm_seq2seq", AutoModelForSeq2SeqLM, "translation")]


def tiny(model_type, auto=AutoModelForCausalLM):
    torch.manual_seed(0)
    encoder = dict(is_causal=False) if auto is AutoModelForMaskedLM else {}
    return auto.from_config(AutoConfig.for_model(model_type, **SIZES[model_type], **encoder))


@pytest.mark.parametrize("model_type, auto, pipeline_tag", CARD_CASES,
                         ids=[f"{m}-{tag}" for m, _, tag in CARD_CASES])
def test_saved_card_metadata(tmp_path, model_type, auto, pipeline_tag):
    model = tiny(model_type, auto)
    model.save_pretrained(tmp_path)
    data = ModelCard.load(tmp_path / "README.md").data
    tag = model_type.replace("_", "-")
    assert (data.library_name, data.license, data.pipeline_tag) == ("transformers", "mit", pipeline_tag)
    assert data.tags == [tag, "custom_code"] == model.model_tags
    assert "trust_remote_code=True" in (tmp_path / "README.md").read_text()


class StubApi:
    """Records what push_to_hub asks of the Hub; reads the card while the folder exists."""
    calls = []

    def __init__(self, token=None):
        self.token = token

    def create_repo(self, repo_id, private=None, exist_ok=False):
        StubApi.calls.append(("create_repo", repo_id, private))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, repo_id, folder_path, commit_message, **kwargs):
        files = sorted(p.name for p in Path(folder_path).iterdir())
        card = ModelCard.load(Path(folder_path) / "README.md")
        StubApi.calls.append(("upload_folder", repo_id, commit_message, kwargs, files, card.data.tags))
        return "commit-url"


def test_push_to_hub_passes_tags_and_keyword_arguments(monkeypatch):
    monkeypatch.setattr(saving, "HfApi", StubApi)
    StubApi.calls = []
    model = tiny("momentum_transformer")
    url = model.push_to_hub("user/tiny", private=True, tags="fine-tuned", commit_message="first",
                            allow_patterns=["*.json", "*.md"], delete_patterns=["old/*"])
    assert url == "commit-url"
    (_, repo, private), (_, repo2, message, kwargs, files, tags) = StubApi.calls
    assert (repo, private, repo2, message) == ("user/tiny", True, "user/tiny", "first")
    assert kwargs["allow_patterns"] == ["*.json", "*.md"] and kwargs["delete_patterns"] == ["old/*"]
    assert kwargs["create_pr"] is False and kwargs["revision"] is None
    assert {"README.md", "config.json", "model.safetensors"} <= set(files)
    assert tags == ["momentum-transformer", "custom_code", "fine-tuned"]


class StubHubForTrainer:
    """transformers.trainer's hf_api(): the repo Trainer.push_to_hub creates and the card it uploads."""
    cards = []

    def create_repo(self, repo_id, **kwargs):
        return type("RepoUrl", (), {"repo_id": f"user/{repo_id}"})()

    def upload_folder(self, repo_id, folder_path, **kwargs):
        StubHubForTrainer.cards.append(ModelCard.load(Path(folder_path) / "README.md"))
        return "commit-url"


def trainer(model, folder, cls=None):
    from transformers import TrainingArguments

    from hf_momentum.trainer import ModelCardTrainer
    args = TrainingArguments(output_dir=str(folder), report_to=[], use_cpu=True, save_strategy="no")
    return (cls or ModelCardTrainer)(model=model, args=args)


def assert_complete(data, pipeline_tag, model_type, license="mit"):
    assert (data.library_name, data.license, data.pipeline_tag) == ("transformers", license, pipeline_tag)
    assert {model_type.replace("_", "-"), "custom_code"} <= set(data.tags)


TRAINER_CASES = [(model_type, auto, tag) for model_type in ("momentum_lstm", "momentum_transformer")
                 for auto, tag in HEAD_TAGS[:2]] + \
    [("momentum_seq2seq", AutoModelForSeq2SeqLM, "translation")]


@pytest.mark.parametrize("model_type, auto, pipeline_tag", TRAINER_CASES,
                         ids=[f"{m}-{tag}" for m, _, tag in TRAINER_CASES])
def test_trainer_card_keeps_the_metadata_and_its_summary(tmp_path, model_type, auto, pipeline_tag):
    """Trainer.create_model_card writes its own card over README.md; ModelCardTrainer's keeps the
    training summary and adds library_name, license, pipeline_tag and the custom_code tag."""
    run = trainer(tiny(model_type, auto), tmp_path)
    run.save_model()
    run.create_model_card(model_name="tiny")
    data = ModelCard.load(tmp_path / "README.md").data
    assert_complete(data, pipeline_tag, model_type)
    assert "generated_from_trainer" in data.tags
    assert "Training procedure" in (tmp_path / "README.md").read_text()
    run.create_model_card(model_name="tiny", license="apache-2.0")
    assert_complete(ModelCard.load(tmp_path / "README.md").data, pipeline_tag, model_type, "apache-2.0")


def test_plain_trainer_card_is_completed_by_the_next_save(tmp_path):
    from transformers import Trainer
    model = tiny("momentum_lstm")
    run = trainer(model, tmp_path, Trainer)
    run.create_model_card(model_name="tiny")
    assert ModelCard.load(tmp_path / "README.md").data.pipeline_tag is None     # transformers' card
    run.save_model()
    assert_complete(ModelCard.load(tmp_path / "README.md").data, "text-generation", "momentum_lstm")


def test_trainer_push_to_hub_uploads_the_complete_card(tmp_path, monkeypatch):
    import transformers.trainer
    monkeypatch.setattr(transformers.trainer, "hf_api", StubHubForTrainer)
    StubHubForTrainer.cards = []
    assert trainer(tiny("momentum_transformer"), tmp_path).push_to_hub() == "commit-url"
    (card,) = StubHubForTrainer.cards
    assert_complete(card.data, "text-generation", "momentum_transformer")
