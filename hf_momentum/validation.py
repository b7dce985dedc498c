"""`plugins.validation` (the project's one set of argument checks) re-exported for the
configuration files, which import it with `from .validation import ...`.

Same mechanism as `momentum_core`: in the package this re-exports `plugins.validation`; a saved
model gets the generated, self-contained copy that `bundled_source()` returns, so its remote
code loads where only torch and transformers are installed.
"""
from plugins.validation import (
    check_bool,
    check_bool_fields,
    check_choice,
    check_int,
    check_momentum,
    check_number,
    check_offsets,
    check_positive,
    check_probability,
)

BUNDLED_MODULES = ("plugins.validation",)
EXPORTS = ("check_bool", "check_bool_fields", "check_choice", "check_int", "check_momentum", "check_number",
           "check_offsets", "check_positive", "check_probability")


def bundled_source() -> str:
    """Source of the self-contained file that replaces this one in a saved model."""
    from hf_momentum.flatten import flatten_modules
    return flatten_modules(BUNDLED_MODULES, EXPORTS)
