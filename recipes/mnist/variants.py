"""Cell hyperparameters for (P)MNIST (MomentumRNN, Tables 7–10, rows MNIST / PMNIST).

Where a table gives values per hidden size (RMSPropLSTM β on MNIST, SRLSTM on PMNIST) the
N = 256 values are used for hidden sizes ≥ 192 and the N = 128 ones below. No NAG LSTM is
reported for (P)MNIST; "nag" is SR without restart at SR's step size."""
from typing import Dict

from recipes.lstm_tasks.variants import CellSpec

MODELS = ["lstm", "momentum", "adam", "rmsprop", "nag", "sr"]


def cell_specs(task: str, hidden_size: int) -> Dict[str, CellSpec]:
    large = hidden_size >= 192
    if task == "mnist":
        sr = CellSpec("sr", step_size=1.0, restart=2)
        specs = {"momentum": CellSpec("momentum", momentum=0.6, step_size=0.6),
                 "adam": CellSpec("adam", momentum=0.6, step_size=0.6, beta=0.1),
                 "rmsprop": CellSpec("rmsprop", step_size=0.6, beta=0.9 if large else 0.99)}
    elif task == "pmnist":
        sr = (CellSpec("sr", step_size=0.9, restart=40) if large
              else CellSpec("sr", step_size=0.01, restart=6))
        specs = {"momentum": CellSpec("momentum", momentum=0.6, step_size=1.0),
                 "adam": CellSpec("adam", momentum=0.6, step_size=1.0, beta=0.01),
                 "rmsprop": CellSpec("rmsprop", step_size=1.0, beta=0.01)}
    else:
        raise ValueError(f"task must be 'mnist' or 'pmnist', got {task!r}")
    return {"lstm": CellSpec("lstm"), **specs, "nag": CellSpec("nag", step_size=sr.step_size),
            "sr": sr}
