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
    generation, generation_rounds = decode_rates(sizes, device, over)
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
                generation_rounds={f"{k[0]}@{k[1]}": v for k, v in generation_rounds.items()},
                decode_profile={str(k): v for k, v in profiles.items()},
                train_profile={f"{name}@{longest}": v for name, v in steps.items()})
    markdown = "\n\n".join([hf_markdown(train, generation, generation_rounds, sizes, mode),
                             profile_markdown(profiles, sizes),
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


DECODERS = ("momentum", "llama", "momentum compiled")


def decode_rates(sizes, device, over):
    """Greedy decoding tokens/s at batch 1 after each context's prompt, for every (decoder, context)
    cell of DECODERS × sizes["contexts"]: prefill untimed, then new_tokens cached forward steps
    (argmax fed back) timed as one region. A decode step at batch 1 waits on the host, whose speed
    drifts within a run (on the H200, 2026-12-04, the same ops took 2.65 and 3.31 ms a step in two
    passes minutes apart; docs/benchmarks.md): so, after one untimed pass of every cell (which
    compiles and tunes), each of
    sizes["repeats"] rounds times every cell once, in an order that rotates from round to round, with
    Python's garbage collector held off during the timed steps (as timeit does), so that what slows
    the host falls on all cells alike and the ratios can be taken within a round.
    Returns ({(name, context): median tokens/s, or why not}, {(name, context): tokens/s per round}).
    One model per decoder serves every context (its position table sized for the longest). "momentum":
    MomentumCache, eager; "llama": DynamicCache; "momentum compiled": a StaticMomentumCache, the prompt
    eager, every step through torch.compile(fullgraph=True, dynamic=False) of the model,
    mode="reduce-overhead" (CUDA graphs) on CUDA; elsewhere (the dry run) with the aot_eager backend,
    which traces the graph inductor would compile without its C++ build. Its graph does not depend on
    the context, so it is compiled once, and the cache is reset between passes, so the graph keeps
    reading the same buffers."""
    import statistics

    cells = [(name, context) for context in sizes["contexts"] for name in DECODERS]
    rates = {cell: [] for cell in cells}
    failed, passes = {}, {}
    for name in DECODERS:
        made = "budget" if over() else guarded(lambda: _decoder(name, sizes, device), device)
        for context in sizes["contexts"]:
            if isinstance(made, str):
                failed[name, context] = made
            else:
                passes[name, context] = (lambda made=made, context=context:
                                         _timed_pass(made, context, sizes, device))
    for round_ in range(sizes["repeats"] + 1):                  # round 0, untimed, compiles and tunes
        live = [cell for cell in cells if cell in passes and cell not in failed]
        shift = round_ % max(len(live), 1)
        for cell in live[shift:] + live[:shift]:
            if over():                                          # the cells keep the rounds they have
                break
            rate = guarded(passes[cell], device)
            if isinstance(rate, str):
                failed[cell] = rate
            elif round_:
                rates[cell].append(rate)
    medians = {cell: failed.get(cell) or (statistics.median(rates[cell]) if rates[cell] else "budget")
               for cell in cells}
    return medians, {cell: rates[cell] for cell in cells if cell not in failed and rates[cell]}


def _decoder(name, sizes, device):
    """(name, model, step, cache) for DECODERS' `name`, its position table sized for the longest
    context; cache None where every pass makes its own (MomentumCache, DynamicCache)."""
    import gpu_train
    import torch

    from hf_momentum import StaticMomentumCache
    longest = max(sizes["contexts"]) + sizes["new_tokens"] + 1
    make = gpu_train.llama_model if name == "llama" else gpu_train.momentum_model
    model = make(longest, sizes["size"]).to(device).eval()
    if name != "momentum compiled":
        return name, model, model, None
    how = dict(mode="reduce-overhead") if device == "cuda" else dict(backend="aot_eager")
    step = torch.compile(model, fullgraph=True, dynamic=False, **how)
    return name, model, step, StaticMomentumCache(model.config)


def _timed_pass(decoder, context, sizes, device):
    """One cell's pass: the prompt (untimed), then new_tokens steps timed; tokens/s."""
    import gc

    import torch
    from timing import time_once_ms

    from hf_momentum import MomentumCache
    from hf_momentum.modeling_common import CACHE_NAME
    name, model, step, cache = decoder
    if cache is not None:
        cache.reset()
    else:
        cache = MomentumCache(model.config) if name == "momentum" else transformers_cache(model)
    torch.manual_seed(context)
    prompt = torch.randint(0, sizes["size"]["vocab"], (1, context), device=device)
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        token = model(input_ids=prompt, **{CACHE_NAME: cache}, use_cache=True).logits[:, -1:].argmax(-1)
    gc.collect()
    gc.disable()
    try:
        ms = time_once_ms(lambda: _decode_steps(step, cache, token, sizes["new_tokens"]), device)
    finally:
        gc.enable()
    return sizes["new_tokens"] / ms * 1e3


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


def hf_markdown(train, generation, rounds, sizes, mode):
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
              "forward per token under bf16 autocast (prefill not timed); every cell timed once in each "
              f"of {sizes['repeats']} rounds, in an order that rotates, after one untimed round (which "
              "compiles), "
              "with the garbage collector held off while timing: tok/s are medians over the rounds, the "
              "ratios medians of the ratios within a round (their range beside them). Momentum: "
              "MomentumCache (O(1) state per layer), eager; momentum compiled: StaticMomentumCache, the "
              f"prompt eager, each step through torch.compile(fullgraph=True, {compile_how}); Llama: "
              "DynamicCache (KV grows with the context).", "",
              f"| context | momentum tok/s | momentum, static cache + torch.compile({compile_how}) "
              "tok/s | Llama tok/s | momentum / Llama | compiled / Llama |",
              "|---:|---:|---:|---:|---:|---:|"]
    for context in sizes["contexts"]:
        m, c, ll = (generation[name, context] for name in ("momentum", "momentum compiled", "llama"))
        lines.append(f"| {context} | {_cell(m)} | {_cell(c)} | {_cell(ll)} | "
                     f"{_round_ratio(rounds, ('momentum', context), ('llama', context))} | "
                     f"{_round_ratio(rounds, ('momentum compiled', context), ('llama', context))} |")
    if len(sizes["contexts"]) >= 2:
        short, long = min(sizes["contexts"]), max(sizes["contexts"])
        lines += ["", f"Tokens/s at context {long} over those at {short}, within each round: momentum "
                  f"{_round_ratio(rounds, ('momentum', long), ('momentum', short))}, momentum compiled "
                  f"{_round_ratio(rounds, ('momentum compiled', long), ('momentum compiled', short))}, "
                  f"Llama {_round_ratio(rounds, ('llama', long), ('llama', short))}."]
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


def _round_ratio(rounds, top, bottom):
    """The median over the rounds of top's tokens/s over bottom's, with their range; — where either
    cell has no timed round."""
    from goals import per_round
    ratio = per_round(rounds.get(top), rounds.get(bottom))
    if ratio is None:
        return "—"
    median, low, high = ratio
    return f"{median:.2f}" + (f" ({low:.2f}–{high:.2f})" if low != high else "")
