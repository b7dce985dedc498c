"""`make gpu-check`'s hf part (benchmarks/gpu_check.py runs it in its own process): training
tokens/s of momentum_transformer vs Llama-SDPA, greedy decoding tokens/s (MomentumCache eager, a
StaticMomentumCache step under torch.compile, Llama's DynamicCache), where an eager decode
step's time goes at two contexts, and where a training step's goes for both models at the longest
length (torch.profiler). Each cell is a number, or the reason it is
missing (OOM, budget, the error)."""
import time


def run(sizes, mode, device, budget_s):
    """The hf part's result (status, rows, markdown) at `sizes` (gpu_check's sizes of the mode);
    no case starts after `budget_s` seconds."""
    try:
        import transformers  # noqa: F401

        import hf_momentum  # noqa: F401
    except ImportError as error:
        return dict(status="skipped", markdown=f"Skipped: {type(error).__name__}: {error}")
    import gpu_train
    start = time.monotonic()
    over = lambda: time.monotonic() - start > budget_s
    train = {}
    for T in sizes["lengths"]:
        for name, make in (("momentum", gpu_train.momentum_model), ("llama", gpu_train.llama_model)):
            args = (make, T, sizes["tokens"], sizes["steps"], sizes["warmup"], sizes["size"], device)
            train[name, T] = "budget" if over() else guarded(lambda: gpu_train.measure(*args), device)
    generation, compiled = {}, {}
    for context in sizes["contexts"]:
        for name in ("momentum", "llama", "momentum compiled"):
            generation[name, context] = ("budget" if over() else guarded(
                lambda: decode_rate(name, context, sizes, device, compiled), device))
    profiles = {}
    for context in sizes["contexts"]:
        profiles[context] = ("budget" if over() else
                             guarded(lambda: decode_profile(context, sizes, device), device))
    longest = max(sizes["lengths"])
    steps = {}
    for name in ("momentum", "llama"):
        steps[name] = ("budget" if over() else
                       guarded(lambda: train_profile(name, longest, sizes, device), device))
    rows = dict(train={f"{k[0]}@{k[1]}": v for k, v in train.items()},
                generation={f"{k[0]}@{k[1]}": v for k, v in generation.items()},
                decode_profile={str(k): v for k, v in profiles.items()},
                train_profile={f"{name}@{longest}": v for name, v in steps.items()})
    markdown = "\n\n".join([hf_markdown(train, generation, sizes, mode), profile_markdown(profiles, sizes),
                             train_profile_markdown(steps, longest, sizes)])
    return dict(status="ok", rows=rows, markdown=markdown)


def guarded(fn, device):
    """fn(), or the reason it failed as a string (OOM or the error), keeping the other cells."""
    import torch
    try:
        return fn()
    except torch.cuda.OutOfMemoryError:
        return "OOM"
    except Exception as error:
        return " ".join(f"error: {type(error).__name__}: {error}".split())[:300]
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()


def decode_rate(name, context, sizes, device, compiled=None):
    """Greedy decoding tokens/s at batch 1 after a `context`-token prompt: prefill untimed, then
    new_tokens cached forward steps (argmax fed back) timed as one region, median of repeats.
    name: "momentum" (MomentumCache, eager), "llama" (DynamicCache) or "momentum compiled": a
    StaticMomentumCache, the prompt eager, every step through torch.compile(fullgraph=True,
    dynamic=False) of the model, mode="reduce-overhead" (CUDA graphs) on CUDA; elsewhere (the dry
    run) with the aot_eager backend, which traces the graph inductor would compile without its
    C++ build (about 50 s on 2 shared cores). That model, its compiled step and its cache are
    kept in `compiled` (a dict) for every context: the step's graph does not depend on the
    context, so it is compiled once, and the cache is reset between passes, so the graph keeps
    reading the same buffers."""
    import statistics

    import gpu_train
    import torch
    from timing import time_once_ms

    from hf_momentum import MomentumCache, StaticMomentumCache
    from hf_momentum.modeling_common import CACHE_NAME
    torch.manual_seed(0)
    prompt = torch.randint(0, sizes["size"]["vocab"], (1, context), device=device)
    if name == "momentum compiled":
        compiled = {} if compiled is None else compiled
        if not compiled:
            longest = max(sizes["contexts"]) + sizes["new_tokens"] + 1
            model = gpu_train.momentum_model(longest, sizes["size"]).to(device).eval()
            how = dict(mode="reduce-overhead") if device == "cuda" else dict(backend="aot_eager")
            compiled.update(model=model, cache=StaticMomentumCache(model.config),
                            step=torch.compile(model, fullgraph=True, dynamic=False, **how))
        model, step = compiled["model"], compiled["step"]
    else:
        make = gpu_train.llama_model if name == "llama" else gpu_train.momentum_model
        model = step = make(context + sizes["new_tokens"] + 1, sizes["size"]).to(device).eval()

    def decode():
        if name == "momentum compiled":
            cache = compiled["cache"]
            cache.reset()
        else:
            cache = MomentumCache(model.config) if name == "momentum" else transformers_cache(model)
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            token = model(input_ids=prompt, **{CACHE_NAME: cache}, use_cache=True).logits[:, -1:].argmax(-1)
            return lambda: _decode_steps(step, cache, token, sizes["new_tokens"])

    rates = []
    for i in range(sizes["repeats"] + 1):
        steps = decode()
        ms = time_once_ms(steps, device)
        if i:                                        # the first pass compiles and autotunes
            rates.append(sizes["new_tokens"] / ms * 1e3)
    return statistics.median(rates)


def _decode_steps(model, cache, token, n):
    import torch

    from hf_momentum.modeling_common import CACHE_NAME
    with torch.no_grad(), torch.autocast(token.device.type, dtype=torch.bfloat16):
        for _ in range(n):
            token = model(input_ids=token, **{CACHE_NAME: cache}, use_cache=True).logits[:, -1:].argmax(-1)


def decode_profile(context, sizes, device):
    """Where a greedy decode step of the momentum model spends its time after a `context`-token
    prompt (issue 27, item 4): profile_steps cached steps timed with CUDA events (after an untimed
    pass that compiles and tunes), then the same number under torch.profiler. Per step: wall ms,
    device-busy ms and kernel launches, and every op (name and input shapes) with its calls, host
    and device µs per step: profile_markdown lists the costliest, and those whose shapes differ
    between the shortest and the longest context."""
    import gpu_train
    import torch
    from timing import time_once_ms

    from hf_momentum import MomentumCache
    from hf_momentum.modeling_common import CACHE_NAME
    torch.manual_seed(0)
    n = sizes["profile_steps"]
    model = gpu_train.momentum_model(context + 3 * n + 2, sizes["size"]).to(device).eval()
    prompt = torch.randint(0, sizes["size"]["vocab"], (1, context), device=device)
    cache = MomentumCache(model.config)
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        token = model(input_ids=prompt, **{CACHE_NAME: cache}, use_cache=True).logits[:, -1:].argmax(-1)
    _decode_steps(model, cache, token, n)
    step_ms = time_once_ms(lambda: _decode_steps(model, cache, token, n), device) / n
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        _decode_steps(model, cache, token, n)
        if device == "cuda":
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    ops = []
    for avg in prof.key_averages(group_by_input_shape=True):
        device_us = getattr(avg, "self_device_time_total", None)
        device_us = getattr(avg, "self_cuda_time_total", 0.0) if device_us is None else device_us
        ops.append(dict(op=avg.key, shapes=str(avg.input_shapes)[:160], calls=avg.count / n,
                        host_us=avg.self_cpu_time_total / n, device_us=device_us / n))
    return dict(step_ms=step_ms, kernels_per_step=len(kernels) / n,
                device_busy_ms=sum(e.time_range.elapsed_us() for e in kernels) / n / 1e3,
                host_op_ms=sum(o["host_us"] for o in ops) / 1e3,
                ops=sorted(ops, key=lambda o: -(o["host_us"] + o["device_us"])))


def train_profile(name, T, sizes, device, top=15):
    """Where one training step of `name` ("momentum" or "llama") goes at sequence length T, the
    training table's step (gpu_train.training_step): after two untimed steps, one timed with CUDA
    events, then one under torch.profiler. The step's wall ms, device-busy ms and kernel count,
    the ops' host time, and the `top` kernels by device time (grouped by kernel name; on the CPU,
    where there are none, the top ops by host time)."""
    import gpu_train
    import torch
    from timing import synchronize, time_once_ms

    make = gpu_train.llama_model if name == "llama" else gpu_train.momentum_model
    _model, step, _batch = gpu_train.training_step(make, T, sizes["tokens"], sizes["size"], device)
    for _ in range(2):
        step()
    synchronize(device)
    step_ms = time_once_ms(step, device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step()
        synchronize(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    grouped = {}
    for event in kernels:
        calls, us = grouped.get(event.name, (0, 0.0))
        grouped[event.name] = (calls + 1, us + event.time_range.elapsed_us())
    ops = [(avg.key, avg.count, avg.self_cpu_time_total) for avg in prof.key_averages()]
    if grouped:
        ranked = sorted(((n, c, us, "device") for n, (c, us) in grouped.items()), key=lambda r: -r[2])
    else:
        ranked = sorted(((n, c, us, "host") for n, c, us in ops), key=lambda r: -r[2])
    return dict(step_ms=step_ms, kernels=len(kernels),
                device_busy_ms=sum(e.time_range.elapsed_us() for e in kernels) / 1e3,
                host_op_ms=sum(us for _, _, us in ops) / 1e3,
                top=[dict(name=n[:90], calls=c, us=us, clock=clock) for n, c, us, clock in ranked[:top]])


def train_profile_markdown(steps, T, sizes):
    """The training-step profiles of train_profile, one table per model."""
    B = max(1, sizes["tokens"] // T)
    lines = [f"Where a training step goes at T = {T} (batch {B}; the training table's step: bf16 autocast, "
             "forward, backward, AdamW; one step timed with CUDA events after two untimed ones, then one "
             "under torch.profiler; kernels grouped by name, µs per step).", ""]
    for name, prof in steps.items():
        if isinstance(prof, str):
            lines += [f"- {name}: {prof}", ""]
            continue
        clock = prof["top"][0]["clock"] if prof["top"] else "device"
        what = "kernel" if clock == "device" else "op"
        lines += [f"{name}: {prof['step_ms']:.2f} ms/step; device busy {prof['device_busy_ms']:.2f} ms in "
                  f"{prof['kernels']} kernels; ops' host time {prof['host_op_ms']:.2f} ms.", "",
                  f"| {what} | calls | {clock} µs | share of {clock} time |", "|---|---:|---:|---:|"]
        total = prof["device_busy_ms"] * 1e3 if clock == "device" else prof["host_op_ms"] * 1e3
        lines += [f"| `{t['name'].replace('|', '/')}` | {t['calls']} | {t['us']:.0f} | "
                  f"{t['us'] / max(total, 1e-9):.1%} |" for t in prof["top"]] + [""]
    return "\n".join(lines).rstrip()


def profile_markdown(profiles, sizes):
    lines = [f"Where a decode step goes (momentum model, batch 1, {sizes['profile_steps']} cached steps "
             "after an untimed pass: ms/step with CUDA events, then the same steps under torch.profiler; "
             "host µs is the ops' self CPU time, device µs their kernels' time, both per step).", ""]
    header = ["| op | input shapes | calls/step | host µs/step | device µs/step |",
              "|---|---|---:|---:|---:|"]
    row = lambda o: (f"| `{o['op']}` | {o['shapes'].replace('|', '/')} | {o['calls']:.0f} | "
                     f"{o['host_us']:.1f} | {o['device_us']:.1f} |")
    done = {c: p for c, p in profiles.items() if not isinstance(p, str)}
    for context, prof in profiles.items():
        if isinstance(prof, str):
            lines += [f"- context {context}: {prof}", ""]
            continue
        lines += [f"Context {context}: {prof['step_ms']:.2f} ms/step; device busy "
                  f"{prof['device_busy_ms']:.3f} ms/step in {prof['kernels_per_step']:.0f} kernels; "
                  f"ops' host time {prof['host_op_ms']:.2f} ms/step. The costliest ops:", ""] + header
        lines += [row(o) for o in prof["ops"][:12]] + [""]
    if len(done) >= 2:
        short, long = min(done), max(done)
        seen = {(o["op"], o["shapes"]) for o in done[short]["ops"]}
        changed = [o for o in done[long]["ops"] if (o["op"], o["shapes"]) not in seen]
        lines += [f"Ops at context {long} whose name and input shapes do not occur at {short} "
                  f"({len(changed)}; the position-embedding table's size follows the context):", ""]
        lines += header + [row(o) for o in changed[:12]] if changed else ["none"]
    return "\n".join(lines).rstrip()


def transformers_cache(model):
    from transformers import DynamicCache
    return DynamicCache(config=model.config)


def hf_markdown(train, generation, sizes, mode):
    s = sizes["size"]
    compile_how = "backend='aot_eager'" if mode == "dry-run" else "mode='reduce-overhead'"
    lines = [f"Both models {s['layers']} layers, hidden {s['hidden']}, {s['heads']} heads, FFN {s['ffn']}, "
             f"vocabulary {s['vocab']}, random weights. Training: bf16 autocast + AdamW, {sizes['tokens']} "
             f"tokens per step, median of {sizes['steps']} CUDA-event-timed steps after {sizes['warmup']} "
             "warm-up steps (benchmarks/gpu_train.py's measure). Llama uses SDPA; the momentum model "
             "whatever `momentum_attention` picks (Triton on CUDA).", "",
             "| T | momentum tok/s | Llama-SDPA tok/s | momentum / Llama | momentum MiB | Llama MiB | params "
             "momentum / Llama |", "|---:|---:|---:|---:|---:|---:|---|"]
    for T in sizes["lengths"]:
        m, ll = train["momentum", T], train["llama", T]
        if isinstance(m, str) or isinstance(ll, str):
            lines.append(f"| {T} | {_cell(m)} | {_cell(ll)} | — | — | — | — |")
            continue
        lines.append(f"| {T} | {m[0]:.0f} | {ll[0]:.0f} | {m[0] / ll[0]:.2f} | {m[1]:.0f} | {ll[1]:.0f} | "
                     f"{m[2] / 1e6:.1f}M / {ll[2] / 1e6:.1f}M |")
    lines += ["", f"Generation: batch 1, greedy, {sizes['new_tokens']} tokens after the prompt, one cached "
              "forward per token under bf16 autocast (prefill not timed), median of "
              f"{sizes['repeats']} after one untimed pass (which compiles). Momentum: MomentumCache (O(1) "
              "state per layer), eager; momentum compiled: StaticMomentumCache, the prompt eager, each "
              f"step through torch.compile(fullgraph=True, {compile_how}); Llama: DynamicCache "
              "(KV grows with the context).", "",
              f"| context | momentum tok/s | momentum, static cache + torch.compile({compile_how}) "
              "tok/s | Llama tok/s | momentum / Llama | compiled / Llama |",
              "|---:|---:|---:|---:|---:|---:|"]
    for context in sizes["contexts"]:
        m, c, ll = (generation[name, context] for name in ("momentum", "momentum compiled", "llama"))
        ratio = lambda a: "—" if isinstance(a, str) or isinstance(ll, str) else f"{a / ll:.2f}"
        lines.append(f"| {context} | {_cell(m)} | {_cell(c)} | {_cell(ll)} | {ratio(m)} | {ratio(c)} |")
    errors = [f"- {name} at {n}: `{value}`" for table in (train, generation)
              for (name, n), value in table.items() if isinstance(value, str) and value.startswith("error")]
    if errors:
        lines += ["", "Errors:"] + errors
    if mode == "dry-run":
        lines.insert(0, "Tiny models on the CPU (bf16 autocast there): checks the plumbing, not speed.\n")
    return "\n".join(lines)


def _cell(value):
    """A number, or OOM / budget / error (each error is listed under the tables)."""
    if isinstance(value, str):
        return value.split(":")[0]
    return f"{value[0]:.0f}" if isinstance(value, (tuple, list)) else f"{value:.1f}"
