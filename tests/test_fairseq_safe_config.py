"""A fairseq checkpoint cannot run code through the config strings fairseq evaluates
(fairseq_momentum/safe_config.py). Every payload here would create a marker file if it ran:
a control shows it does in plain fairseq, and with fairseq_momentum imported (in this process,
and through fairseq-eval-lm's --user-dir) it is refused with the field's name before the model
is built, and the marker never appears."""
import subprocess
import sys
import textwrap

import pytest
import torch
from fairseq_eval_sites import fairseq_eval_sites
from helpers.fairseq_cli import USER_DIR, cli_env, run_cli
from helpers.fairseq_payloads import load_state, payload, train_tiny_lm
from omegaconf import OmegaConf

import fairseq_momentum  # noqa: F401  (installs the checks in this process)
from fairseq_momentum import safe_config
from fairseq_momentum.safe_config import UnsafeConfigError

# (case, architecture the checkpoint names, model fields set, the eval site it reaches in fairseq)
SITES = [
    ("character_filters", "transformer_lm", {"character_embeddings": True, "character_filters": "P"},
     "eval() in transformer_lm.build_model"),
    ("momentum_character_filters", "momentum_transformer_lm",
     {"character_embeddings": True, "character_filters": "P"}, "the same eval through our architecture"),
    ("adaptive_input_cutoff", "transformer_lm", {"adaptive_input": True, "adaptive_input_cutoff": "P"},
     "options.eval_str_list in transformer_lm.build_model"),
    ("adaptive_softmax_cutoff", "transformer_lm", {"adaptive_softmax_cutoff": "P"},
     "utils.eval_str_list in TransformerDecoderBase"),
    ("decoder_xformers_att_config", "transformer_lm", {"decoder_xformers_att_config": "P"},
     "utils.eval_str_dict in MultiheadAttention"),
    ("fconv_decoder_layers", "fconv_lm", {"decoder_layers": "P"}, "eval() in fconv_lm.build_model"),
    ("fconv_decoder_attention", "fconv_lm", {"decoder_layers": "[(16, 3)]", "decoder_attention": "P"},
     "eval() in fconv_lm.build_model"),
    ("lightconv_character_filters", "lightconv_lm",
     {"decoder_kernel_size_list": [3], "character_embeddings": True, "character_filters": "P"},
     "eval() in lightconv_lm.build_model"),
]
SITE_IDS = [case for case, *_ in SITES]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A real fairseq-train checkpoint of a tiny momentum LM and its data-bin."""
    return train_tiny_lm(tmp_path_factory.mktemp("lm"))


def set_fields(namespace, arch, fields, marker):
    namespace.arch = namespace._name = arch
    for name, value in fields.items():
        setattr(namespace, name, payload(marker) if value == "P" else value)


def tampered(lm, dest, arch, fields, form="dict"):
    """A copy of the tiny checkpoint naming `arch`, with `fields` set in its model config ("P":
    the payload, whose marker is dest + '.ran'), its config stored as fairseq-train does (a
    dict holding the args Namespace), as a legacy top-level `args` Namespace, or as a DictConfig."""
    state = load_state(lm[0])
    marker = dest.with_suffix(".ran")
    model = state["cfg"]["model"]
    set_fields(model, arch, fields, marker)
    if form == "namespace":
        state["args"], state["cfg"] = model, None
    elif form == "omegaconf":
        state["cfg"] = OmegaConf.create(state["cfg"], flags={"allow_objects": True})
    torch.save(state, dest)
    return dest, marker


CONTROL = """
import sys
from pathlib import Path
from fairseq import checkpoint_utils
assert "fairseq_momentum" not in sys.modules
for path in sys.argv[1:]:
    try:
        checkpoint_utils.load_model_ensemble_and_task([path])
    except Exception as error:
        print(path, "raised", type(error).__name__)
    print(path, "ran" if Path(path).with_suffix(".ran").exists() else "did not run")
"""


def test_each_payload_runs_in_plain_fairseq(lm, tmp_path):
    """The control: without fairseq_momentum (weights_only off, as a user would have to), every
    payload below runs, so the refusals of the next tests are real."""
    paths = [tampered(lm, tmp_path / f"{case}.pt", arch, fields)[0] for case, arch, fields, _ in SITES
             if arch != "momentum_transformer_lm"]
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CONTROL), *map(str, paths)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=cli_env(TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for path in paths:
        assert f"{path} ran" in proc.stdout, proc.stdout + proc.stderr[-3000:]


@pytest.mark.parametrize("case, arch, fields, site", SITES, ids=SITE_IDS)
@pytest.mark.parametrize("form", ["dict", "namespace", "omegaconf"])
def test_payload_is_refused_before_the_model_is_built(lm, tmp_path, case, arch, fields, site, form):
    from fairseq import checkpoint_utils
    path, marker = tampered(lm, tmp_path / "evil.pt", arch, fields, form)
    with pytest.raises(UnsafeConfigError) as error:
        checkpoint_utils.load_model_ensemble_and_task([str(path)])
    assert not marker.exists(), f"the payload ran ({site})"
    message = str(error.value)
    field = next(name for name, value in fields.items() if value == "P")
    where = "args" if form == "namespace" else "cfg.model"
    assert f"{where}.{field} = " in message and str(path) in message, message


@pytest.mark.parametrize("field", sorted(safe_config.EVALUATED_FIELDS))
def test_every_evaluated_field_is_checked(lm, tmp_path, field):
    from fairseq import checkpoint_utils
    path, marker = tampered(lm, tmp_path / "evil.pt", "momentum_transformer_lm", {field: "P"})
    with pytest.raises(UnsafeConfigError, match=f"cfg.model.{field} = "):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not marker.exists()


def test_payload_in_an_omegaconf_node_or_interpolation_or_bytes_is_refused(lm, tmp_path):
    from fairseq import checkpoint_utils
    marker = tmp_path / "ran"
    state = load_state(lm[0])
    cfg = OmegaConf.create(state["cfg"], flags={"allow_objects": True})
    cfg.model = OmegaConf.create(vars(cfg.model), flags={"allow_objects": True})
    cfg.optimizer.adam_betas = payload(marker)
    cfg.model.character_filters = "${task.data}"
    cfg.model.decoder_xformers_att_config = payload(marker).encode()
    state["cfg"] = cfg
    torch.save(state, tmp_path / "evil.pt")
    with pytest.raises(UnsafeConfigError) as error:
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "evil.pt"))
    message = str(error.value)
    for field in ("cfg.optimizer.adam_betas", "cfg.model.character_filters",
                  "cfg.model.decoder_xformers_att_config"):
        assert f"{field} = " in message, message
    assert not marker.exists()


def test_a_state_that_skips_the_loader_still_cannot_run_code(lm, tmp_path):
    """Layer 2: a state handed straight to load_model_ensemble_and_task (no loader check) reaches
    fairseq's eval, which now reads literals only."""
    from fairseq import checkpoint_utils
    for case, arch, fields, site in SITES:
        marker = tmp_path / f"{case}.ran"
        state = load_state(lm[0])
        set_fields(state["cfg"]["model"], arch, fields, marker)
        state["cfg"] = OmegaConf.create(state["cfg"], flags={"allow_objects": True})
        state = checkpoint_utils._upgrade_state_dict.__wrapped__(state)
        with pytest.raises(UnsafeConfigError, match="not a literal"):
            checkpoint_utils.load_model_ensemble_and_task([str(lm[0])], state=state)
        assert not marker.exists(), f"the payload ran ({site})"


def test_fairseq_evaluators_read_literals_and_refuse_code(tmp_path):
    from fairseq import options, utils
    from fairseq.models import fconv_lm, transformer_lm
    from fairseq.models.wav2vec import wav2vec2
    marker = tmp_path / "ran"
    evil = payload(marker)
    for evaluate in (utils.eval_str_list, utils.eval_str_dict, utils.eval_bool, options.eval_str_list,
                     options.eval_bool, transformer_lm.eval, fconv_lm.eval):
        with pytest.raises(UnsafeConfigError, match="not a literal"):
            evaluate(evil)
    assert not marker.exists()
    assert utils.eval_str_list("[1, 2.5]", type=float) == [1.0, 2.5]
    assert options.eval_str_list("10000,50000", type=int) == [10000, 50000]
    assert utils.eval_str_dict("{'a': 1}") == {"a": 1} and utils.eval_str_dict(None) is None
    assert utils.eval_bool("True") is True and utils.eval_bool("0") is False
    assert utils.eval_bool(None) is False
    assert fconv_lm.eval("[(1268, 4)] * 13") == [(1268, 4)] * 13
    default_conv = "[(512, 10, 5)] + [(512, 3, 2)] * 4 + [(512,2,2)] + [(512,2,2)]"
    assert wav2vec2.eval(default_conv) == [(512, 10, 5)] + [(512, 3, 2)] * 4 + [(512, 2, 2)] * 2
    with pytest.raises(TypeError):      # as the builtin: eval_bool(True) falls back to its default
        transformer_lm.eval(True)


@pytest.mark.parametrize("text", ["[0] * 1000000000", "[1] * -1", "'a' * 3", "2 ** 10", "[1] + (2,)",
                                  "(lambda: 1)()", "[x for x in (1,)]", "().__class__", "{**{}}"])
def test_literal_refuses_what_is_not_a_bounded_literal(text):
    with pytest.raises((ValueError, TypeError, SyntaxError)):
        safe_config.literal(text)


def test_every_fairseq_eval_site_is_covered():
    """Each place the installed fairseq evaluates a config attribute names a listed field, each
    module with a builtin eval of configs is shadowed, and every other site was reviewed."""
    reviewed = {   # (module, argument) -> why it is safe or which field it carries
        ("fairseq.data.audio.raw_audio_dataset", "feature_encoder_spec"): "feature_encoder_spec",
        ("fairseq.modules.multihead_attention", "xformers_att_config"): "xformers_att_config",
        ("fairseq.examples.speech_recognition.models.w2l_conv_glu_enc", "conv_enc_config"): "conv_enc_config",
        ("fairseq.utils", "x"): "the evaluators themselves (their module's eval is shadowed)",
        ("fairseq.dataclass.utils", "x"): "fairseq.dataclass.utils.eval_str_list is ast.literal_eval",
        ("fairseq.models.lightconv", "x"): "argparse type of a command-line option",
        ("fairseq.models.lightconv_lm", "x"): "argparse type of a command-line option",
        ("fairseq.data.multilingual.multilingual_data_manager", "uf"): "argparse type of an option",
        ("fairseq.data.codedataset", "line.strip()"): "a line of a data file, not a checkpoint config",
        ("fairseq.examples.textless_nlp.pgslm.data_utils", "line.strip()"): "a data-file line",
        ("fairseq.examples.textless_nlp.pgslm.quantize_f0", "line.strip()"): "a data-file line",
        ("fairseq.examples.textless_nlp.pgslm.sample.sample", "line"): "a data-file line",
    }
    sites = fairseq_eval_sites()
    assert len(sites) > 50
    missing = [s for s in sites if s.field and s.field not in safe_config.EVALUATED_FIELDS]
    unreviewed = [s for s in sites if not s.field and (s.module, s.argument) not in reviewed]
    assert not missing and not unreviewed, (missing, unreviewed)
    carried = {why for why in reviewed.values() if " " not in why}
    assert carried <= safe_config.EVALUATED_FIELDS
    evaluating = {s.module for s in sites if s.function == "eval" and s.kind == "call"
                  and not s.module.startswith("fairseq.examples.") and s.module != "fairseq.data.codedataset"}
    assert evaluating == set(safe_config.EVALUATING_MODULES)


def test_fairseq_eval_lm_refuses_the_payload_and_still_evaluates_a_clean_checkpoint(lm, tmp_path):
    path, marker = tampered(lm, tmp_path / "evil.pt", "transformer_lm",
                            {"character_embeddings": True, "character_filters": "P"})
    common = [lm[1], "--user-dir", USER_DIR, "--cpu", "--tokens-per-sample", "16", "--max-sentences", "4"]
    proc = run_cli("eval-lm", *common, "--path", path, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and not marker.exists(), log[-3000:]
    assert "UnsafeConfigError" in log and f"checkpoint {path}" in log, log[-3000:]
    assert "args.character_filters = " in log or "cfg.model.character_filters = " in log, log[-3000:]
    clean = run_cli("eval-lm", *common, "--path", lm[0])
    assert "Perplexity" in clean.stdout + clean.stderr


def test_clean_checkpoint_loads_with_its_literal_config(lm):
    """What is not code still loads: the real checkpoint, and character filters given as a literal
    (a legacy `args` Namespace) build the character embedder they describe."""
    from fairseq import checkpoint_utils, tasks
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task([str(lm[0])])
    assert type(models[0]).__name__ == "MomentumTransformerLanguageModel"
    assert list(cfg.optimizer.adam_betas) == [0.9, 0.999]
    state = load_state(lm[0])
    set_fields(state["cfg"]["model"], "transformer_lm",
               {"character_embeddings": True, "character_filters": "[(1, 4), (2, 8)]"}, None)
    state["args"], state["cfg"] = state["cfg"]["model"], None
    cfg = checkpoint_utils._upgrade_state_dict(state)["cfg"]
    model = tasks.setup_task(cfg.task).build_model(cfg.model)
    widths = [conv.kernel_size[0] for conv in model.decoder.embed_tokens.convolutions]
    assert widths == [1, 2]


def test_the_error_names_a_way_out_that_works(lm, tmp_path):
    """The message suggests overriding the field; an override replaces the stored string before
    the check, so the user's own file loads and nothing from it runs."""
    from fairseq import checkpoint_utils
    path, marker = tampered(lm, tmp_path / "evil.pt", "momentum_transformer_lm", {"character_filters": "P"})
    with pytest.raises(UnsafeConfigError, match="arg_overrides"):
        checkpoint_utils.load_model_ensemble_and_task([str(path)])
    _, cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"character_filters": "[(1, 4)]"})
    assert cfg.model.character_filters == "[(1, 4)]" and not marker.exists()
