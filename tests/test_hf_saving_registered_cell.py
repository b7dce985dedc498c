"""A cell added with plugins.rnn.register_cell does not travel in the bundled remote code, so
save_pretrained refuses it, naming the cell and what to do, in a fresh process as a user would run
it (issue 28); and the model card says what trust_remote_code means and how to avoid it."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[1]

SAVE_REGISTERED = """
import sys
from plugins.rnn.variants import CellVariant, constant_momentum_decay, momentum_drive, register_cell
from hf_momentum import MomentumLSTMConfig, MomentumLSTMForCausalLM
register_cell(CellVariant("halfball", "a user's cell", has_v=True, has_m=False, restart="refused",
                          decay=constant_momentum_decay, drive=momentum_drive))
model = MomentumLSTMForCausalLM(MomentumLSTMConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1,
                                                   cell="halfball"))
try:
    model.save_pretrained(sys.argv[1])
except ValueError as error:
    print("refused:", error)
else:
    print("saved")
"""


def test_a_registered_cell_is_refused_at_save_in_a_fresh_process(tmp_path):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SAVE_REGISTERED), str(tmp_path / "m")],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""},
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and "'halfball'" in proc.stdout, proc.stdout
    assert "register_cell" in proc.stdout and "allow_registered_cell=True" in proc.stdout
    assert not (tmp_path / "m" / "config.json").exists()


def test_the_model_card_explains_trust_remote_code(tmp_path):
    from hf_momentum import MomentumLSTMConfig, MomentumLSTMForCausalLM
    model = MomentumLSTMForCausalLM(MomentumLSTMConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1))
    model.save_pretrained(tmp_path)
    card = " ".join((tmp_path / "README.md").read_text().split())
    assert "runs the Python files of this repository on your machine" in card
    assert "import hf_momentum" in card and "needs no `trust_remote_code`" in card
