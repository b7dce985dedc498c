"""fairseq optimizers and learning-rate schedulers of the user-dir."""
from . import nt_asgd  # noqa: F401  (registers --optimizer nt_asgd and --lr-scheduler nt_asgd)
