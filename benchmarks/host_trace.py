"""Where the host's time goes while it issues a step, on every thread (issue 27 items 3 and 4).

On the H200 (docs/benchmarks.md, 2026-12-04) the attention's forward+backward took 1.4–1.9 ms of
host time to issue against 0.8–1.1 ms of kernels, where the CPU machine, through the stand-in
launcher, issues the same calls in 0.2–0.3 ms; cProfile (gpu_kernels.py --host-profile) sees only
the calling thread, not the autograd engine's device thread, which runs the backward on a GPU, nor
the time inside the CUDA driver. torch.profiler with Python stacks sees every thread: this sums its
events' self times per step into kinds (the library's Python, Triton's, torch's, other Python, built-ins,
aten ops, CUDA runtime and driver calls, autograd's own nodes, other C++), per thread, and lists
the costliest Python functions and ops. The profiler slows the host, Python most: the kinds'
shares, not their sums, are what to compare with the unprofiled issue time.

    from host_trace import trace, markdown
    print(markdown(trace(step, steps=10, cuda=True)))"""
import collections

KINDS = ("momentum-plugins (Python)", "Triton (Python)", "torch (Python)", "other Python", "Python built-ins",
         "aten ops", "CUDA runtime and driver", "autograd nodes", "other C++")
OURS = ("plugins/", "hf_momentum/", "fairseq_momentum/")         # the library; benchmarks are "other"
PYTHON_KINDS = KINDS[:5]       # the kinds the profiler's Python tracer records
WAITING = ("threading.py(", "queue.py(", "selectors.py(", "concurrent/futures/thread.py(",
           "<built-in method acquire of _thread", "<built-in method wait")


def kind(name: str) -> str:
    """The kind of a profiler event, from its name: Python frames are "path.py(line): function"
    (the path relative to the nearest sys.path entry), built-in calls "<built-in ...>". A thread that
    waits idle (a compile worker, a monitor) is "waiting", which no step's total counts."""
    if name.startswith(WAITING):
        return "waiting"
    if ".py(" in name or name.startswith("<string>("):
        path = name.split("(", 1)[0]
        while path.startswith("../"):
            path = path[3:]
        if path.startswith(OURS):
            return "momentum-plugins (Python)"
        if path.startswith("triton/"):
            return "Triton (Python)"
        if path.startswith("torch/"):
            return "torch (Python)"
        return "other Python"
    if name.startswith("<built-in"):
        return "Python built-ins"
    if name.startswith("aten::"):
        return "aten ops"
    if name.startswith(("cuda", "cu")) and not name.startswith("cudnn"):
        return "CUDA runtime and driver"
    if name.startswith("autograd::") or name.endswith(("Backward0", "Backward")):
        return "autograd nodes"
    return "other C++"


def trace(step, steps: int = 10, cuda: bool = False, top: int = 12) -> dict:
    """Profile `steps` calls of step() (after one untimed call) on the host with Python stacks; with
    `cuda`, CUPTI's runtime and driver calls too, and a sync at the end. Per step: µs of self time
    by kind, by thread, and the `top` Python functions and non-Python events by self time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, with_stack=True) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    by_kind, by_thread = collections.Counter(), collections.Counter()
    by_name = collections.Counter()
    for event in prof.events():
        if (event.device_type != torch.autograd.DeviceType.CPU or event.name == "cudaDeviceSynchronize"
                or "profiler" in event.name):                # the profiler's own frames
            continue
        us, what = event.self_cpu_time_total / steps, kind(event.name)
        by_kind[what] += us
        if what != "waiting":
            by_thread[event.thread] += us
            by_name[_short(event.name)] += us
    python = [(name, us) for name, us in by_name.most_common() if ".py(" in name][:top]
    native = [(name, us) for name, us in by_name.most_common() if ".py(" not in name][:top]
    return dict(steps=steps, total_us=sum(by_thread.values()), kinds={k: by_kind.get(k, 0.0) for k in KINDS},
                waiting_us=by_kind.get("waiting", 0.0), threads=dict(by_thread.most_common()),
                python=python, native=native, python_frames=any(k in by_kind for k in PYTHON_KINDS),
                torch=torch.__version__)


def _short(name: str) -> str:
    """An event's name without the addresses that make each built-in's name unique."""
    return name.split(" at 0x", 1)[0] + (">" if " at 0x" in name else "")


def markdown(result: dict, title: str = "") -> str:
    total = max(result["total_us"], 1e-9)
    threads = ", ".join(f"{us:.0f}" for us in result["threads"].values() if us >= 0.5)
    lines = ([title, ""] if title else []) + [
        f"Host self time under torch.profiler (Python stacks), µs per step over {result['steps']} steps: "
        f"{result['total_us']:.0f} in all, by thread {threads} (and {result['waiting_us']:.0f} in threads "
        "waiting idle, not counted). On a GPU the backward runs on autograd's device thread: the calling "
        "thread's `run_backward` is then mostly its wait for it.", ""]
    if not result["python_frames"]:
        lines += [f"torch.profiler recorded no Python frames here (torch {result['torch']}; seen with torch "
                  "2.11 under Python 3.12): the Python kinds are missing from the total, not zero.", ""]
    lines += ["| kind | µs per step | share |", "|---|---:|---:|"]
    lines += [f"| {k} | {us:.0f} | {us / total:.0%} |" for k, us in result["kinds"].items() if us]
    for label, rows in (("Python function", result["python"]), ("op or call", result["native"])):
        lines += ["", f"| {label} | µs per step |", "|---|---:|"]
        lines += [f"| `{name[:100].replace('|', '/')}` | {us:.1f} |" for name, us in rows]
    return "\n".join(lines)
