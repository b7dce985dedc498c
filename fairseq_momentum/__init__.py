"""fairseq user-dir of momentum-plugins: momentum transformers (MT, LM, NAT) and the
MomentumLSTM (LM, MT).

    fairseq-train DATA --user-dir "$(python -m fairseq_momentum)" --arch momentum_transformer_lm ...

Importing it sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (unless already set): torch >= 2.6
loads checkpoints with weights_only=True, which cannot read the argparse Namespace that
fairseq stores in them, so fairseq-generate / eval-lm / resume would fail.
"""
import os

os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")

from . import models  # noqa: E402,F401  (registers the architectures)
