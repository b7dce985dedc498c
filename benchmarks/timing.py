"""Median time of a callable on CUDA (CUDA events) or on the CPU (the host clock), with warm-up runs
first so that Triton compilation and autotuning, cuDNN set-up and allocator growth stay out of the
timed runs; and the device time of each kernel a callable runs on CUDA (torch.profiler)."""
import collections
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


def device_kernel_times(fn, calls: int = 1) -> dict:
    """{kernel or copy name: (device µs over `calls` calls of fn, how many ran)} on CUDA, from
    torch.profiler's device events (one stream: they do not overlap, so their sum is the time the
    device was busy)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    totals, counts = collections.defaultdict(float), collections.defaultdict(int)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time
            counts[event.name] += 1
    return {name: (totals[name], counts[name]) for name in totals}
