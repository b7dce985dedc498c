"""Wall-clock timing of GPU work in the recipes' training loops."""
import torch


def synchronize(device) -> None:
    """Wait for queued GPU work so that wall-clock times measure it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
