"""The attention kernels as launched: through `triton_launch.direct`, which skips Triton's per-call
dispatch once a specialisation is compiled. One object per kernel module, shared by the launchers
(chunk, fused_chunk), so that a test's recorder set on it sees every launch."""
from ...triton_launch import DirectKernels
from . import chunk_kernels, fused_chunk_kernels

K = DirectKernels(chunk_kernels)
F = DirectKernels(fused_chunk_kernels)
