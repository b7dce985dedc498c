"""--connection-momentum / --connection-step-size / --connection-delta are refused when the chosen
--connection never reads them (they were accepted and ignored), on the command line and in a
fairseq-hydra-train `model:` section."""

import pytest
from fairseq.models import ARCH_CONFIG_REGISTRY
from helpers.fairseq_cli import parse_namespace
from omegaconf import OmegaConf, open_dict

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
