"""`--config_overrides` of transformers' example scripts ("n_embd=10,resid_pdrop=0.2"): config fields
of a model trained from scratch beyond a recipe's own arguments, e.g. AWD-LSTM's regularisers of the
momentum LSTM ("locked_dropout=true,weight_drop=0.5,word_dropout=0.1")."""
from typing import Callable, Optional


def with_overrides(make_config: Callable[..., object], fields: dict, overrides: Optional[str]) -> dict:
    """`fields` (keyword arguments of `make_config`, a config class or factory) with `overrides` applied.
    Each value is parsed as transformers' `PreTrainedConfig.update_from_string` parses it: as the type
    of the field's value in a config made from `fields`. ValueError naming --config_overrides for an
    unknown field or a malformed entry; the config made from the result checks the values' ranges."""
    if not overrides:
        return fields
    probe = make_config(**fields)
    try:
        probe.update_from_string(overrides)
    except ValueError as error:
        raise ValueError(f"--config_overrides {overrides!r}: {error}") from None
    names = [entry.split("=", 1)[0] for entry in overrides.split(",")]
    return {**fields, **{name: getattr(probe, name) for name in names}}
