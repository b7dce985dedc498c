"""fairseq user-dir of momentum-plugins: momentum transformers (MT, LM, NAT) and the
MomentumLSTM (LM, MT).

    fairseq-train DATA --user-dir "$(python -m fairseq_momentum)" --arch momentum_transformer_lm ...

Importing it lets torch's safe (weights_only) unpickler read fairseq checkpoints by allowlisting
the few types fairseq saves in them, and makes an unreadable checkpoint fail with its name
(fairseq_momentum/checkpoints.py). torch.load stays safe for everything else in the process.
"""
from . import checkpoints, models  # noqa: F401  (models registers the architectures)

checkpoints.install()
