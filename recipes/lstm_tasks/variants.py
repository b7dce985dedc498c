"""Cell hyperparameters of LSTM and the MomentumLSTM family per task (MomentumRNN,
Tables 7–10: MomentumLSTM, AdamLSTM, RMSPropLSTM, SRLSTM). The paper reports no NAG LSTM
for these tasks; "nag" here is SR without restart (F = ∞) at SR's step size."""
from dataclasses import asdict, dataclass
from typing import Dict, Optional

from plugins.rnn import MomentumLSTM


@dataclass(frozen=True)
class CellSpec:
    """A cell and the hyperparameters it reads; None: the layer's default."""
    cell: str
    momentum: Optional[float] = None
    step_size: Optional[float] = None
    beta: Optional[float] = None
    restart: Optional[int] = None

    def build(self, input_size: int, hidden_size: int) -> MomentumLSTM:
        return MomentumLSTM(input_size, hidden_size, batch_first=True, **asdict(self))


def family(momentum: CellSpec, adam: CellSpec, rmsprop: CellSpec, sr: CellSpec) -> Dict[str, CellSpec]:
    return {"lstm": CellSpec("lstm"), "momentum": momentum, "adam": adam, "rmsprop": rmsprop,
            "nag": CellSpec("nag", step_size=sr.step_size), "sr": sr}


# Copying with sequence length 1K / 2K and adding (Tables 7, 8, 9, 10).
COPYING_1K = family(CellSpec("momentum", momentum=0.6, step_size=0.9),
                    CellSpec("adam", momentum=0.6, step_size=2.0, beta=0.999),
                    CellSpec("rmsprop", step_size=2.0, beta=0.999),
                    CellSpec("sr", step_size=0.9, restart=100))
COPYING_2K = dict(COPYING_1K, momentum=CellSpec("momentum", momentum=0.9, step_size=2.0))
ADDING = family(CellSpec("momentum", momentum=0.9, step_size=2.0),
                CellSpec("adam", momentum=0.6, step_size=2.0, beta=0.999),
                CellSpec("rmsprop", step_size=2.0, beta=0.999),
                CellSpec("sr", step_size=0.9, restart=100))

MODELS = list(ADDING)


def copying_specs(delay: int) -> Dict[str, CellSpec]:
    """Table rows for the nearer of the paper's two copying lengths."""
    return COPYING_2K if delay >= 1500 else COPYING_1K
