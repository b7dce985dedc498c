"""hf_momentum's transformers floor: the one setup.cfg declares, refused below at import."""
import configparser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hf_momentum.requirements import TRANSFORMERS_MIN, check_transformers


def test_the_floor_is_setup_cfgs():
    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    requirements = [Requirement(line) for line in config["options.extras_require"]["hf"].split("\n") if line]
    transformers = next(r for r in requirements if r.name == "transformers")
    floors = [spec.version for spec in transformers.specifier if spec.operator == ">="]
    assert floors == [TRANSFORMERS_MIN]


def test_an_older_transformers_is_refused_naming_the_floor():
    with pytest.raises(ImportError, match=rf"transformers>={TRANSFORMERS_MIN},<6 and found 5\.17\.0"):
        check_transformers("5.17.0")
    check_transformers(TRANSFORMERS_MIN)
    check_transformers("5.30.1")
