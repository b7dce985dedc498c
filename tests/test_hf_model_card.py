"""The model card of the native families is a huggingface_hub.ModelCard with library_name,
license, pipeline_tag and the custom_code tag; the same tags are the models' model_tags (which
Trainer.push_to_hub puts in the card it writes); push_to_hub adds `tags` to the card and passes
its other keyword arguments to HfApi.upload_folder (checked offline with a stub of HfApi)."""
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

from hf_momentum import saving

SIZES = {"momentum_transformer": dict(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=32,
                                      max_position_embeddings=32),
         "momentum_lstm": dict(vocab_size=50, hidden_size=16, num_hidden_layers=1)}


def tiny(model_type, auto=AutoModelForCausalLM):
    torch.manual_seed(0)
    return auto.from_config(AutoConfig.for_model(model_type, **SIZES[model_type]))


@pytest.mark.parametrize("model_type", sorted(SIZES))
@pytest.mark.parametrize("auto, pipeline_tag", [(AutoModelForCausalLM, "text-generation"),
                                                (AutoModelForSequenceClassification, "text-classification")])
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
