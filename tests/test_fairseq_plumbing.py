"""User-dir plumbing: importing twice registers once and leaves torch.load's safe default alone
(the printed --user-dir is exercised by test_fairseq_transformer_lm's CLI test; checkpoint
loading by test_fairseq_checkpoints)."""
import subprocess
import sys

from helpers.fairseq_cli import USER_DIR, cli_env

ARCHS = ["momentum_transformer", "momentum_transformer_iwslt_de_en", "linear_transformer",
         "linear_transformer_iwslt_de_en", "momentum_transformer_lm", "momentum_transformer_lm_big",
         "momentum_transformer_lm_wiki103",
         "momentum_transformer_lm_gpt", "momentum_transformer_lm_gpt2_small", "linear_transformer_lm",
         "momentum_lstm_lm", "momentum_lstm_lm_ptb", "momentum_lstm",
         "momentum_lstm_wiseman_iwslt_de_en", "momentum_iterative_nat",
         "momentum_iterative_nat_iwslt16", "linear_iterative_nat_iwslt16", "momentum_roberta",
         "momentum_roberta_base", "momentum_roberta_large", "momentum_roberta_prenorm", "linear_roberta"]

IMPORT_TWICE = f"""
import importlib, os
from argparse import Namespace
assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ
import fairseq_momentum
assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ
from fairseq import checkpoint_utils, utils
from fairseq.models import ARCH_MODEL_REGISTRY
utils.import_user_module(Namespace(user_dir={USER_DIR!r}))
for name in ("momentum_transformer", "momentum_transformer_lm", "momentum_lstm_lm",
             "momentum_lstm", "momentum_nat", "momentum_roberta"):
    importlib.reload(importlib.import_module("fairseq_momentum.models." + name))
importlib.reload(fairseq_momentum)
loader = checkpoint_utils.load_checkpoint_to_cpu
assert loader.checks_checkpoints and not getattr(loader.__wrapped__, "checks_checkpoints", False)
print(" ".join(sorted(a for a in ARCH_MODEL_REGISTRY if "momentum" in a or a.startswith("linear_"))))
"""


def test_importing_the_user_dir_twice_registers_once():
    out = subprocess.run([sys.executable, "-c", IMPORT_TWICE], capture_output=True, text=True,
                         env=cli_env(), cwd="/")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == sorted(ARCHS)

