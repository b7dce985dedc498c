"""Median time of a callable on CUDA (CUDA events) or on the CPU (the host clock), with warm-up runs
first so that Triton compilation and autotuning, cuDNN set-up and allocator growth stay out of the
timed runs."""
import statistics
import time


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def time_once_ms(fn, device: str) -> float:
    if device.startswith("cuda"):
        import torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def median_ms(fn, device: str, warmup: int = 2, target_ms: float = 150.0, min_reps: int = 3,
              max_reps: int = 50) -> float:
    """Median of as many timed runs as fit in about `target_ms` (between min_reps and max_reps),
    after `warmup` untimed runs."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    first = time_once_ms(fn, device)
    reps = max(min_reps, min(max_reps, int(target_ms / max(first, 1e-3))))
    return statistics.median([first] + [time_once_ms(fn, device) for _ in range(reps - 1)])
