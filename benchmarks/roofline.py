"""The floor under an attention benchmark's times: bytes an ideal implementation must move, flops
it must do, and the device's published limits, so that each timed case can say what fraction of
the hardware it reached.

Bytes (e = bytes per element, N = B·H·T tokens × heads, D key size, E value size):
  forward           read q, k, v, write out:                      e·N·(2D + 2E)
  forward+backward  + read q, k, v, d_out, write dq, dk, dv:      e·N·(4D + 3E) more
Nothing else (states, scores, denominators) has to reach memory in an ideal kernel.

Flops of eq. 13's chunked form, per (batch, head), chunk C, T tokens (every product counts 2 flops
per multiply-add; the C×C blocks are counted whole, as the kernels compute them):
  intra-chunk  QKᵀ (C×D · D×C) and AV (C×C · C×E) per chunk:      2·T·C·(D + E)
  state update KᵀV per chunk, one state (β = 0) or two (s, m′):   2·T·D·E · (1 or 2)
  output from the states entering the chunk, Q·s (and Q·m′):      2·T·D·E · (1 or 2)
  forward = 2·T·C·(D + E) + 4·T·D·E·(1 or 2);  backward = 2 × forward (each product's two
  gradients), so forward+backward = 3 × forward. Denominators (O(T·D)) are left out.
Causal softmax attention (SDPA): QKᵀ and PV over the lower triangle, T²·(D + E) per (batch, head)
forward, 3 × that with the backward (recomputation inside flash kernels is not counted).
"""
from dataclasses import dataclass
from typing import Optional

# Dense (no 2:4 sparsity) peaks in TB/s and TFLOP/s, as published by NVIDIA; the datasheets quote
# tensor rates with sparsity, halved here. fp32 cases are held to the FP32 CUDA-core rate: the Triton
# kernels' state scans take exact fp32 FMA dots for fp32 inputs (utils.kernel_flags: IEEE; their
# per-chunk kernels six bf16 tensor-core products each, at most a sixth of the bf16 rate, by
# default), torch's fp32 matmuls use no TF32 unless asked, and SDPA's fp32 kernel runs on CUDA
# cores. TF32 is kept for the record.
#   H100 SXM / PCIe / NVL: NVIDIA H100 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h100
#     (SXM 3.35 TB/s, BF16 1,979*, TF32 989*, FP32 67; PCIe 2.0 TB/s, 1,513*, 756*, 51;
#     NVL 3.9 TB/s, 1,671*, 835*, 60); SXM rates to one decimal from the H100 architecture whitepaper
#   H200 SXM / NVL: NVIDIA H200 Tensor Core GPU datasheet, nvidia.com/en-us/data-center/h200
#     (4.8 TB/s; SXM BF16 1,979*, TF32 989*, FP32 67; NVL 1,671*, 835*, 60)
#   A100: NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf):
#     BF16 312, TF32 156, FP32 19.5; 40GB SXM/PCIe 1.555 TB/s, 80GB PCIe 1.935, 80GB SXM 2.039
DEVICES = [  # (words that must all appear in torch.cuda.get_device_name(), lower case), limits
    (("h100", "pcie"), dict(label="H100 PCIe", tb_s=2.0, bf16=756.5, tf32=378.0, fp32=51.2)),
    (("h100", "nvl"), dict(label="H100 NVL", tb_s=3.9, bf16=835.5, tf32=417.5, fp32=60.0)),
    (("h100",), dict(label="H100 SXM", tb_s=3.35, bf16=989.4, tf32=494.7, fp32=66.9)),
    (("h200", "nvl"), dict(label="H200 NVL", tb_s=4.8, bf16=835.5, tf32=417.5, fp32=60.0)),
    (("h200",), dict(label="H200 SXM", tb_s=4.8, bf16=989.4, tf32=494.7, fp32=66.9)),
    (("a100", "80gb", "pcie"), dict(label="A100 80GB PCIe", tb_s=1.935, bf16=312.0, tf32=156.0, fp32=19.5)),
    (("a100", "80gb"), dict(label="A100 80GB SXM", tb_s=2.039, bf16=312.0, tf32=156.0, fp32=19.5)),
    (("a100",), dict(label="A100 40GB", tb_s=1.555, bf16=312.0, tf32=156.0, fp32=19.5)),
]
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class Limits:
    label: str
    tb_s: float      # memory bandwidth, TB/s
    bf16: float      # dense tensor TFLOP/s, bf16/fp16 inputs
    tf32: float      # dense TF32 tensor TFLOP/s
    fp32: float      # FP32 CUDA-core TFLOP/s, the rate fp32 cases are held to

    def tflops(self, dtype: str) -> float:
        return self.fp32 if dtype == "fp32" else self.bf16


def device_limits(name: Optional[str]) -> Optional[Limits]:
    """The published limits of a CUDA device by its name; None for a CPU or an unknown device."""
    lowered = (name or "").lower()
    for words, limits in DEVICES:
        if all(word in lowered for word in words):
            return Limits(**limits)
    return None


def attention_bytes(method: str, B: int, H: int, T: int, D: int, E: int, dtype: str, backward: bool) -> int:
    """Bytes an ideal kernel moves: the same for every method, since all compute the same function
    of the same tensors (`method` is taken for symmetry with attention_flops)."""
    tokens = B * H * T
    passes = (2 * D + 2 * E) + ((4 * D + 3 * E) if backward else 0)
    return DTYPE_BYTES[dtype] * tokens * passes


def attention_flops(method: str, B: int, H: int, T: int, D: int, E: int, chunk: int, backward: bool) -> int:
    """Flops of one forward (or forward+backward) of `method`: "sdpa" is causal softmax attention,
    names starting "momentum" carry two states, every other method (linear, fla) one."""
    if method == "sdpa":
        forward = T * T * (D + E)
    else:
        states = 2 if method.startswith("momentum") else 1
        forward = 2 * T * chunk * (D + E) + 4 * T * D * E * states
    return B * H * forward * (3 if backward else 1)


@dataclass(frozen=True)
class Roofline:
    bytes: int
    flops: int
    ms: float
    limits: Optional[Limits]
    dtype: str

    @property
    def gb_s(self) -> float:
        return self.bytes / self.ms / 1e6

    @property
    def tflop_s(self) -> float:
        return self.flops / self.ms / 1e9

    def floor_ms(self) -> Optional[float]:
        """The larger of the time to move the bytes and the time to do the flops at peak."""
        if self.limits is None:
            return None
        return max(self.bytes / (self.limits.tb_s * 1e9), self.flops / (self.limits.tflops(self.dtype) * 1e9))

    def bound(self) -> str:
        memory = self.bytes / self.limits.tb_s
        compute = self.flops / (self.limits.tflops(self.dtype) * 1e3)
        return "memory" if memory >= compute else "compute"

    def cells(self) -> list:
        """Markdown cells: MB moved, GFLOP, achieved GB/s and TFLOP/s (with % of the device's
        bandwidth and peak where the device is known), and % of the floor with its bound."""
        if self.limits is None:
            return [f"{self.bytes / 1e6:.4g}", f"{self.flops / 1e9:.4g}", f"{self.gb_s:.4g}",
                    f"{self.tflop_s:.4g}", "—"]
        bw = 100 * self.gb_s / (self.limits.tb_s * 1e3)
        peak = 100 * self.tflop_s / self.limits.tflops(self.dtype)
        floor = 100 * self.floor_ms() / self.ms
        return [f"{self.bytes / 1e6:.4g}", f"{self.flops / 1e9:.4g}", f"{self.gb_s:.0f} ({bw:.0f}%)",
                f"{self.tflop_s:.1f} ({peak:.0f}%)", f"{floor:.0f}% ({self.bound()})"]


HEADER = ["ideal MB", "GFLOP", "GB/s (% of BW)", "TFLOP/s (% of peak)", "% of floor (bound)"]


def case_roofline(row: dict, limits: Optional[Limits], chunk: int) -> Roofline:
    """The roofline of one timed attention case (benchmarks/gpu_attention.py's rows: method, B, H,
    D, T, dtype, backward, ms), its flops counted at `chunk`."""
    shape = (row["B"], row["H"], row["T"], row["D"], row["D"])
    return Roofline(bytes=attention_bytes(row["method"], *shape, row["dtype"], row["backward"]),
                    flops=attention_flops(row["method"], *shape, chunk, row["backward"]),
                    ms=row["ms"], limits=limits, dtype=row["dtype"])


def limits_line(limits: Optional[Limits], name: str) -> str:
    if limits is None:
        return f"roofline: {name} is not in benchmarks/roofline.py's table (unknown device): no fractions"
    return (f"roofline: {limits.label} published limits {limits.tb_s} TB/s, {limits.bf16} TFLOP/s bf16, "
            f"{limits.tf32} tf32, {limits.fp32} fp32 (CUDA cores: the fp32 cases' limit); dense rates, "
            "sources cited in benchmarks/roofline.py")


# The Triton attention kernels' traffic (plugins/attention/triton): per kernel, the arguments it
# reads and those it writes, each in full once per launch (per-chunk kernels whose tiles cover the
# head dimension, as the pruner's largest tiles do at D ≤ 64; smaller tiles re-read q, k or v once
# per tile of the other dimension). Entries "name?FLAG" count only where the launch's constant
# FLAG is true ("name?!FLAG" where it is false). The ideal of attention_bytes is what these launches
# should approach.
KERNEL_TRAFFIC = {
    "fwd_h": (("k", "v", "s0?USE_INIT", "m0?USE_INIT", "z0?USE_INIT"),
              ("h_s?STORE_H", "h_m?STORE_H", "h_z?STORE_H", "s_out", "m_out", "z_out")),
    "merge_splits": (("s_loc", "m_loc", "z_loc", "s_init?USE_INIT", "m_init?USE_INIT", "z_init?USE_INIT"),
                     ("s_seg", "m_seg", "z_seg", "s_fin", "m_fin", "z_fin")),
    "fwd_o": (("q", "k", "v", "h_s", "h_m", "h_z", "e_s?SPLIT", "e_m?SPLIT", "e_z?SPLIT"), ("o", "den")),
    "bwd_dh": (("q", "o", "do", "den", "ds_fin?HAS_FINAL_GRAD", "dm_fin?HAS_FINAL_GRAD",
                "dz_fin?HAS_FINAL_GRAD"),
               ("dden", "dh_s?STORE_H", "dh_m?STORE_H", "dh_z?STORE_H", "ds0", "dm0", "dz0")),
    "bwd_dv": (("q", "k", "do", "den", "dh_s", "dh_m", "de_s?SPLIT", "de_m?SPLIT"), ("dv",)),
    "bwd_dqk": (("q", "k", "v", "do", "den", "dden", "h_s", "h_m", "h_z", "dh_s", "dh_m", "dh_z", "e_s?SPLIT",
                 "e_m?SPLIT", "e_z?SPLIT", "de_s?SPLIT", "de_m?SPLIT", "de_z?SPLIT"), ("dq", "dk")),
    # fused_chunk_kernels: the splits' states (*_loc) are empty tensors where the rows are not split
    "fused_fwd": (("q", "k", "v", "s0?USE_INIT", "m0?USE_INIT", "z0?USE_INIT", "s_loc", "m_loc", "z_loc"),
                  ("o", "den", "s_out", "m_out", "z_out")),
    "fused_bwd_dkv": (("q", "k", "v", "o?!DDEN_READY", "do", "den", "dden?DDEN_READY",
                       "ds_fin?HAS_FINAL_GRAD", "dm_fin?HAS_FINAL_GRAD", "dz_fin?HAS_FINAL_GRAD", "ds_loc",
                       "dm_loc", "dz_loc"),
                      ("dk", "dv", "dden?!DDEN_READY", "ds0", "dm0", "dz0")),
    "fused_bwd_dq": (("k", "v", "do", "den", "dden", "s0?USE_INIT", "m0?USE_INIT", "z0?USE_INIT", "s_loc",
                      "m_loc", "z_loc"), ("dq",)),
}


def launch_bytes(kernel: str, args: dict, constants: dict) -> int:
    """Bytes one launch of a Triton attention kernel reads and writes, from its arguments (by
    name) and constants. Without momentum the kernels read no M' (h_m / dh_m are h_s / dh_s, one
    buffer; e_m / de_m are not read): not counted. The splits' edge states (e_*, de_*) are counted
    once per launch like every tensor, though each program of a split reads them (from L2); the
    fused kernels' scans from zero read the keys and values of all splits but the last."""
    reads, writes = KERNEL_TRAFFIC[kernel]
    seen, total = set(), 0
    scanned = _scanned_fraction(kernel, args, constants)
    for entry in reads + writes:
        name, _, flag = entry.partition("?")
        if flag and bool(constants.get(flag.lstrip("!"))) == flag.startswith("!"):
            continue
        if name.endswith("_m") and name.startswith(("h", "dh", "e", "de")) and not constants.get("MOMENTUM"):
            continue
        tensor = args[name]
        key = (id(tensor), entry in writes)
        if key not in seen:
            seen.add(key)
            share = scanned if name in ("k", "v") else 1.0
            total += int(tensor.numel() * tensor.element_size() * share)
    return total


def _scanned_fraction(kernel: str, args: dict, constants: dict) -> float:
    """The share of the keys and values a launch reads: fwd_h without STORE_H (the fused kernels'
    scans from zero) skips the last of its G splits, which no other split chains."""
    if kernel != "fwd_h" or constants.get("STORE_H"):
        return 1.0
    N, G, CPS = args["N"], args["G"], args["CPS"]
    return min((G - 1) * CPS * constants["BT"], N) / max(N, 1)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _row_lengths(args: dict, constants: dict) -> list:
    """The real tokens of each row a launch's programs walk: every batch row (or packed segment)
    once per head."""
    H, N = args["H"], args["N"]
    if constants.get("IS_VARLEN"):
        offsets = args["cu_seqlens"].tolist()
        return [end - start for start, end in zip(offsets, offsets[1:])] * H
    if constants.get("HAS_LEN"):
        return [min(max(n, 0), N) for n in args["lengths"].tolist()] * H
    rows = args["k" if "k" in args else "q"].numel() // (N * constants["DK"])
    return [N] * rows


def _chunk_dots(kernel: str, BT: int, DK: int, DV: int, BK: int, BV: int, M: int, SPLIT_V: bool) -> int:
    """Flops of the tl.dot products one chunk costs `kernel`, summed over the programs that share
    the chunk (one per K or V tile of the grid), each dot (m × k)·(k × n) counted 2·m·k·n at its
    padded tile sizes, as the tensor cores or FMA units compute it."""
    def dot(m, k, n):
        return 2 * m * k * n
    NK, NV = _cdiv(DK, BK), _cdiv(DV, BV)
    states = 1 + M                                       # S, and M' with momentum
    if kernel in ("fwd_h", "bwd_dh"):                    # grid NK·NV: a state tile's update per chunk
        return NK * NV * states * dot(BK, BT, BV)
    if kernel in ("fwd_o", "bwd_dv"):                    # grid NV, loop over K tiles: QKᵀ once per V tile
        return NV * (NK * (dot(BT, BK, BT) + states * dot(BT, BK, BV)) + dot(BT, BT, BV))
    if kernel == "bwd_dqk":                              # grid NK, loop over V tiles: dNum·Vᵀ once per K tile
        return NK * (NV * (dot(BT, BV, BT) + 2 * states * dot(BT, BV, BK)) + 2 * dot(BT, BT, BK))
    # the fused kernels hold whole (BK ≥ DK, BV ≥ DV) states; fused_fwd a TV-wide block of them
    if kernel == "fused_fwd":
        TV = BV // 2 if SPLIT_V else BV
        per = dot(BT, BK, BT) + dot(BT, BT, TV) + states * (dot(BT, BK, TV) + dot(BK, BT, TV))
        return _cdiv(DV, TV) * per
    if kernel == "fused_bwd_dkv":
        return (2 * dot(BT, BK, BT) + 2 * dot(BT, BT, BV)
                + states * (2 * dot(BT, BK, BV) + dot(BK, BT, BV)))
    if kernel == "fused_bwd_dq":
        return dot(BT, BV, BT) + dot(BT, BT, BK) + states * (dot(BT, BV, BK) + dot(BK, BT, BV))
    raise KeyError(kernel)


def launch_flops(kernel: str, args: dict, constants: dict, config: dict) -> int:
    """Flops of the matrix products (tl.dot) one launch of a Triton attention kernel computes, from
    its arguments (by name), constants and autotuned config (BK, BV; SPLIT_V): the chunks with real
    tokens (padding chunks only store zeros) times `_chunk_dots`. Products repeated per tile count
    each time: at BK < DK bwd_dqk recomputes the chunk's dNum·Vᵀ for every K tile, at BV < DV fwd_o
    and bwd_dv recompute QKᵀ for every V tile. Elementwise work (weights, denominators) is left out.
    A scan from zero without STORE_H (the fused kernels') skips its last split. merge_splits
    composes eq. 12 elementwise: none."""
    if kernel == "merge_splits":
        return 0
    params = {**constants, **config}
    BT, DK, DV = params["BT"], params["DK"], params["DV"]
    per_chunk = _chunk_dots(kernel, BT, DK, DV, params["BK"], params["BV"], int(bool(params["MOMENTUM"])),
                            bool(params.get("SPLIT_V")))
    chunks = 0
    for L in _row_lengths(args, params):
        walked = _cdiv(L, BT)
        if kernel == "fwd_h" and not params.get("STORE_H"):
            walked = min(walked, (args["G"] - 1) * args["CPS"])
        chunks += walked
    return chunks * per_chunk
