"""fairseq-hydra-train with the yaml configs shipped in fairseq_momentum/config, the checks a hydra
`model:` section gets (those of the command line), and half precision refused early without a GPU
(fairseq-train and fairseq-hydra-train)."""
import argparse

import pytest
import torch
from fairseq.models import ARCH_CONFIG_REGISTRY
from helpers.fairseq_cli import (
    REPO,
    USER_DIR,
    WORDS,
    parse_namespace,
    preprocess_lm,
    preprocess_translation,
    run_cli,
    write_dict,
    write_lm_text,
    write_parallel_text,
)
from omegaconf import OmegaConf, open_dict

import fairseq_momentum  # noqa: F401  (registers the architectures)

CONFIG_DIR = REPO / "fairseq_momentum" / "config"
TINY_RUN = ["common.cpu=true", "common.log_interval=1", "optimization.max_update=2",
            "dataset.batch_size=8", "dataset.num_workers=0", "dataset.required_batch_size_multiple=1"]


def hydra_train(config, data, save_dir, *overrides, check=True):
    return run_cli("hydra-train", "--config-dir", CONFIG_DIR, "--config-name", config, f"task.data={data}",
                   f"common.user_dir={USER_DIR}", f"checkpoint.save_dir={save_dir}", *TINY_RUN, *overrides,
                   cwd=save_dir.parent, check=check)


def load(checkpoint):
    from fairseq import checkpoint_utils
    [model], cfg, _ = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    return model, cfg


def attention_settings(modules):
    return {(m.momentum, m.step_size, m.causal) for m in modules
            if type(m).__name__ == "MomentumMultiheadAttention"}


def connections(model):
    return {type(m).__name__ for m in model.modules() if type(m).__name__.endswith("MomentumConnection")}


def test_lm_config_trains_with_its_momentum_settings(tmp_path):
    data = preprocess_lm(write_lm_text(tmp_path / "text", seed=5), tmp_path / "bin")
    save = tmp_path / "ckpt"
    proc = hydra_train("momentum_transformer_lm", data, save, "task.tokens_per_sample=16",
                       "model.decoder_layers=1", "model.decoder_embed_dim=16",
                       "model.decoder_ffn_embed_dim=32", "model.decoder_attention_heads=2",
                       "model.attention_momentum=0.3")
    assert "done training" in proc.stdout + proc.stderr
    model, cfg = load(save / "checkpoint_last.pt")
    assert cfg.optimization.max_update == 2 and type(model).__name__ == "MomentumTransformerLanguageModel"
    # from the command line (0.3), the preset (step size 1) and the yaml (adaptive connection)
    assert attention_settings(model.modules()) == {(0.3, 1.0, True)}
    assert connections(model) == {"AdaptiveMomentumConnection"}
    assert len(model.decoder.layers) == 1 and model.decoder.embed_dim == 16


def test_roberta_config_pretrains_with_its_momentum_settings(tmp_path):
    data = preprocess_lm(write_lm_text(tmp_path / "text", seed=5), tmp_path / "bin")
    save = tmp_path / "ckpt"
    hydra_train("momentum_roberta", data, save, "task.tokens_per_sample=16", "model.encoder_layers=1",
                "model.encoder_embed_dim=16", "model.encoder_ffn_embed_dim=32",
                "model.encoder_attention_heads=2", "model.attention_momentum=0.3",
                "lr_scheduler.warmup_updates=1", "+lr_scheduler.total_num_update=2")
    model, cfg = load(save / "checkpoint_last.pt")
    assert cfg.optimization.max_update == 2 and type(model).__name__ == "MomentumRobertaModel"
    # from the command line (0.3), the preset (step size 1) and the yaml (adaptive connection)
    assert attention_settings(model.modules()) == {(0.3, 1.0, False)}
    assert connections(model) == {"AdaptiveMomentumConnection"}
    assert len(model.encoder.sentence_encoder.layers) == 1


def test_translation_config_trains_with_its_momentum_settings(tmp_path):
    data = preprocess_translation(write_parallel_text(tmp_path / "text"), tmp_path / "bin")
    save = tmp_path / "ckpt"
    tiny = (("layers", 1), ("embed_dim", 16), ("ffn_embed_dim", 32), ("attention_heads", 2))
    # keys the yaml does not hold are added with hydra's `+`
    sizes = [f"+model.{part}_{name}={value}" for part in ("encoder", "decoder") for name, value in tiny]
    hydra_train("momentum_transformer", data, save, *sizes, "model.share_all_embeddings=false")
    model, _ = load(save / "checkpoint_last.pt")
    assert type(model).__name__ == "MomentumTransformerModel"
    assert attention_settings(model.encoder.modules()) == {(0.6, 1.0, False)}
    # decoder: causal self-attention (eq. 13) and momentum cross-attention (eq. 14)
    assert attention_settings(model.decoder.modules()) == {(0.6, 1.0, True), (0.6, 1.0, False)}


@pytest.mark.parametrize("overrides,message", [
    (["+model.attention_momentun=0.5"], "model.attention_momentun: momentum_transformer_lm has no option"),
    (["model.attention_momentum=1.5"], "model.attention_momentum: must be in [0, 1)"),
    (["common.cpu=false", "common.fp16=true"], "common.fp16 needs a CUDA GPU"),
], ids=["unknown-key", "bad-value", "fp16"])
def test_hydra_job_stops_before_training_naming_the_key(overrides, message, tmp_path):
    if "common.fp16=true" in overrides and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: common.fp16 is valid here")
    data = tmp_path / "dict-only"    # the task reads its dictionary; the model is refused before any data
    data.mkdir()
    write_dict(data / "dict.txt", WORDS)
    proc = hydra_train("momentum_transformer_lm", data, tmp_path / "ckpt", *overrides, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "ckpt" / "checkpoint_last.pt").exists()


@pytest.fixture
def hydra_job(monkeypatch):
    """The checks of a running fairseq-hydra-train job, in-process (hydra.main marks a job by
    setting HydraConfig, which a test cannot run)."""
    from hydra.core.hydra_config import HydraConfig
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))


def apply_preset(arch, common=None, **section):
    """The arch preset on the `model:` section of a whole config, as fairseq's build_model runs it."""
    root = OmegaConf.create({"common": common or {"cpu": True}, "model": {"_name": arch, **section}})
    with open_dict(root):
        ARCH_CONFIG_REGISTRY[arch](root.model)
    return root.model


@pytest.mark.parametrize("arch,section,message", [
    ("momentum_transformer_lm", {"attention_momentun": 0.5},
     "model.attention_momentun: momentum_transformer_lm has no option --attention-momentun"),
    ("momentum_transformer_lm", {"attention_momentum": 1.0}, "model.attention_momentum: must be in [0, 1)"),
    ("momentum_transformer_lm", {"attention_chunk_size": 0}, "model.attention_chunk_size: must be"),
    ("momentum_transformer_lm", {"decoder_layers": 2.5}, "model.decoder_layers: expected an integer"),
    ("momentum_transformer", {"cross_attention": "dot"}, "model.cross_attention: must be one of softmax"),
    ("linear_transformer_lm", {"connection": "residual"}, "model.connection: must be one of none"),
    ("momentum_iterative_nat_iwslt16", {"connection_delta": 0.0}, "model.connection_delta:"),
])
def test_hydra_model_section_gets_the_command_line_checks(arch, section, message, hydra_job):
    with pytest.raises(ValueError) as error:
        apply_preset(arch, **section)
    assert str(error.value).startswith(message)


def test_hydra_model_section_is_filled_by_the_preset(hydra_job):
    """What the yaml leaves unset comes from the --arch preset, as on the command line."""
    big = apply_preset("momentum_transformer_lm_big", attention_momentum=0.3)
    assert (big.decoder_layers, big.decoder_embed_dim, big.attention_momentum) == (12, 1024, 0.3)
    linear = apply_preset("linear_transformer_lm")
    assert (linear.attention_momentum, linear.attention_step_size) == (0.0, 1.0)


@pytest.mark.parametrize("flags,message", [
    (["--fp16"], "--fp16 needs a CUDA GPU and torch sees none"),
    (["--fp16", "--cpu"], "--fp16 with --cpu: half precision trains on a CUDA GPU; drop --fp16"),
    (["--memory-efficient-fp16", "--cpu"], "--memory-efficient-fp16 with --cpu"),
    (["--bf16", "--cpu"], "--bf16: fairseq trains bf16 on a TPU only"),
])
@pytest.mark.parametrize("arch", ["momentum_transformer_lm", "momentum_lstm_lm"])
def test_half_precision_without_a_gpu_stops_at_parsing(arch, flags, message, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        parse_namespace(arch, *flags)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "to train in float32 on the CPU" in err, err


def test_stored_half_precision_config_still_builds_on_a_cpu(monkeypatch):
    """A checkpoint's config records the flags of the machine that trained it: loading it
    elsewhere is not training in half precision, and is not refused."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    stored = argparse.Namespace(_name="momentum_transformer_lm", fp16=True, cpu=False)
    ARCH_CONFIG_REGISTRY["momentum_transformer_lm"](stored)
    assert stored.attention_momentum == 0.6
    stored_lstm = argparse.Namespace(_name="momentum_lstm_lm", bf16=True, tpu=True)
    ARCH_CONFIG_REGISTRY["momentum_lstm_lm"](stored_lstm)
    # nor is a stored hydra config: its `model:` section holds what the preset filled in
    stored = apply_preset("momentum_transformer_lm", common={"fp16": True})
    assert stored.base_shuffle is False and stored.attention_momentum == 0.6


def test_hydra_half_precision_is_refused_in_a_job(hydra_job, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^common.bf16 needs a CUDA GPU .*drop common.bf16"):
        apply_preset("momentum_transformer_lm", common={"bf16": True})
    with pytest.raises(ValueError, match=r"^common.fp16 with common.cpu: half precision"):
        apply_preset("momentum_transformer", common={"fp16": True, "cpu": True})


def test_fairseq_train_half_precision_without_a_gpu_stops_before_loading_data(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: --fp16 is valid here")
    proc = run_cli("train", tmp_path / "no-data", "--user-dir", USER_DIR, "--task", "language_modeling",
                   "--arch", "momentum_transformer_lm", "--fp16", check=False)
    assert proc.returncode == 2 and "error: --fp16 needs a CUDA GPU" in proc.stderr, proc.stderr[-3000:]
