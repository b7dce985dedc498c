"""fairseq user-dir of momentum-plugins: momentum transformers (MT, LM, NAT, RoBERTa-style masked LM)
and the MomentumLSTM (LM, MT).

    fairseq-train DATA --user-dir "$(python -m fairseq_momentum)" --arch momentum_transformer_lm ...

Importing it lets torch's safe (weights_only) unpickler read fairseq checkpoints by allowlisting
the few types fairseq saves in them, and makes an unreadable checkpoint fail with its name
(fairseq_momentum/checkpoints.py). torch.load stays safe for everything else in the process.
It also makes fairseq read the config strings it would `eval` (character_filters, adam_betas,
eval_str_list / eval_bool fields, ...) as literals only: a checkpoint whose config holds code there
is refused before its model is built (fairseq_momentum/safe_config.py). Model archives of
`from_pretrained` are extracted with no member written outside their folder (archives.py). A rank
that ends normally destroys its gloo process group at exit, which fairseq never does; without it,
ranks died at exit with SIGABRT (process_group_exit.py). fairseq's prefetching thread is stopped at
exit too: left inside torch, it aborted masked_lm runs after "done training" (loader_exit.py).
"""
from . import (  # noqa: F401  (models registers the architectures, optim the optimizers, tasks the tasks)
    archives,
    checkpoints,
    loader_exit,
    models,
    optim,
    process_group_exit,
    safe_config,
    tasks,
)

archives.install()
checkpoints.install()
loader_exit.install()
process_group_exit.install()
safe_config.install()
