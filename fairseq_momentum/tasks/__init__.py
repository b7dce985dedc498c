"""fairseq tasks of the user-dir."""
from . import language_modeling_bptt  # noqa: F401  (registers the task)
