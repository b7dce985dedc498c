"""--connection-momentum / --connection-step-size / --connection-delta are refused when the chosen
--connection never reads them (they were accepted and ignored), on the command line and in a
fairseq-hydra-train `model:` section; checkpoints written before, which hold defaults for the
unread ones, have them unset on load (the whole load: tests/test_fairseq_legacy_checkpoint.py)."""
import argparse

import pytest
from fairseq.models import ARCH_CONFIG_REGISTRY
from helpers.fairseq_cli import parse_namespace
from omegaconf import OmegaConf, open_dict

from fairseq_momentum.options import clear_unread_connection_flags

FLAGS = {"momentum": "--connection-momentum", "step_size": "--connection-step-size",
         "delta": "--connection-delta"}
# (connection, flags it does not read), written out from eq. 15 (μ_r, γ_r) and eq. 18 (γ_r, δ)
UNREAD = [("none", "momentum"), ("none", "step_size"), ("none", "delta"), ("momentum", "delta"),
          ("adaptive", "momentum")]
ARCHS = {"momentum_transformer_lm": "language_modeling", "momentum_transformer": "translation",
         "momentum_iterative_nat_iwslt16": "translation_lev"}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("connection,name", UNREAD)
def test_a_flag_the_connection_ignores_fails_at_parsing(capsys, arch, connection, name):
    flag = FLAGS[name]
    with pytest.raises(SystemExit) as stop:
        parse_namespace(arch, "--connection", connection, flag, "0.5", task=ARCHS[arch])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {flag} is not read by --connection {connection} and would be ignored" in err, err


def test_the_default_connection_reads_none_of_them(capsys):
    with pytest.raises(SystemExit):
        parse_namespace("momentum_transformer_lm", "--connection-momentum", "0.3")
    assert "--connection-momentum is not read by --connection none" in capsys.readouterr().err


@pytest.mark.parametrize("connection,given,want", [
    ("none", [], {"momentum": None, "step_size": None, "delta": None}),
    ("momentum", ["--connection-momentum", "0.5"], {"momentum": 0.5, "step_size": 0.9, "delta": None}),
    ("adaptive", ["--connection-delta", "0.01"], {"momentum": None, "step_size": 0.9, "delta": 0.01}),
])
def test_read_flags_are_kept_and_filled_unread_ones_stay_unset(connection, given, want):
    args = parse_namespace("momentum_transformer_lm", "--connection", connection, *given)
    assert {name: getattr(args, f"connection_{name}", None) for name in FLAGS} == want


def test_hydra_model_section_refuses_an_unread_key():
    root = OmegaConf.create({"common": {"cpu": True},
                             "model": {"_name": "momentum_transformer_lm", "connection": "momentum",
                                       "connection_delta": 0.01}})
    with open_dict(root), pytest.raises(ValueError) as error:
        ARCH_CONFIG_REGISTRY["momentum_transformer_lm"](root.model)
    assert str(error.value).startswith("model.connection_delta is not read by model.connection=momentum")


def stored(kind, container):
    values = dict(connection=kind, connection_momentum=0.3, connection_step_size=0.9, connection_delta=0.001)
    if container == "namespace":
        return {"args": argparse.Namespace(**values), "cfg": None}
    model = values if container == "dict" else OmegaConf.create(values)
    return {"args": None, "cfg": {"model": model}}


@pytest.mark.parametrize("container", ["namespace", "dict", "omegaconf"])
@pytest.mark.parametrize("kind,kept", [("none", set()), ("momentum", {"momentum", "step_size"}),
                                       ("adaptive", {"step_size", "delta"})])
def test_checkpoint_values_of_unread_flags_are_unset_on_load(container, kind, kept):
    state = stored(kind, container)
    clear_unread_connection_flags(state)
    config = state["args"] if container == "namespace" else state["cfg"]["model"]
    read = config.get if container == "dict" else lambda key: getattr(config, key)
    for name, value in (("momentum", 0.3), ("step_size", 0.9), ("delta", 0.001)):
        assert read(f"connection_{name}") == (value if name in kept else None), name
