"""A CPU decode step's attention that reads each row's own key columns only (`rollout.cpu_attention=varlen`).

Why: a refilled KV cache (continuous batching) holds sequences that started at different columns, and the batched
matmuls of `bench.rollout.embedded.decode_attention` read every row over the window from the batch's oldest live
sequence: at the 10m preset with 256 sequences in 32 slots that is ~0.79 of the cache's columns a step, where a
row's own columns are ~0.42 of the window (vLLM's paged kernel reads only those). torch has no CPU attention over
rows of different lengths (its varlen attention is CUDA-only; flex_attention on a CPU was tried and cost as much per
column read: docs/benchmarks.md), so this is two small C loops, compiled once per process with the system's C
compiler and called through ctypes: the scores of each row over its columns [lo_b, hi) (-inf before lo_b), torch's
softmax, then the probabilities times each row's own values. The OpenMP runtime is torch's (the library links
libgomp.so.1, which the process has loaded from torch), so `torch.set_num_threads` holds.

The same attention as the matmuls up to summation order: a column before lo_b is masked in `valid` anyway, so
skipping it changes nothing but the order of the sums over the head dimension and the columns
(tests/unit/test_cpu_attention.py). Where no C compiler is found, `unavailable()` says why and the engine refuses
`varlen` at build time.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile

import torch

#: `rollout.cpu_attention`: `matmul` (bench.rollout.embedded.decode_attention, over the window of live columns) or
#: `varlen` (this module, over each row's own columns)
CPU_ATTENTION = ("matmul", "varlen")

SOURCE = r"""
#include <stdint.h>
#include <math.h>

/* scores[b, h, j - lo] = dot(q[b, h], k[b, h / G, j]) * scale + mask[b, j] for j in [lo_b, hi); -inf for j < lo_b */
void varlen_scores(const float *q, int64_t qsb, int64_t qsh, const float *k, int64_t ksb, int64_t ksh,
                   const float *mask, int64_t msb, const int64_t *lo_rows, int64_t lo, int64_t hi,
                   int64_t B, int64_t H, int64_t Hkv, int64_t D, float scale, float *out) {
    int64_t G = H / Hkv, L = hi - lo;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t hk = 0; hk < Hkv; hk++) {
            int64_t start = lo_rows[b];
            for (int64_t g = 0; g < G; g++) {
                float *o = out + (b * H + hk * G + g) * L;
                for (int64_t j = lo; j < start; j++) o[j - lo] = -INFINITY;
            }
            for (int64_t j = start; j < hi; j++) {
                const float *kj = k + b * ksb + hk * ksh + j * D;
                float m = mask[b * msb + j];
                for (int64_t g = 0; g < G; g++) {
                    const float *qg = q + b * qsb + (hk * G + g) * qsh;
                    float acc = 0.0f;
                    #pragma omp simd reduction(+:acc)
                    for (int64_t d = 0; d < D; d++) acc += qg[d] * kj[d];
                    out[(b * H + hk * G + g) * L + (j - lo)] = acc * scale + m;
                }
            }
        }
    }
}

/* out[b, h] = sum over j in [lo_b, hi) of p[b, h, j - lo] * v[b, h / G, j] */
void varlen_values(const float *p, const float *v, int64_t vsb, int64_t vsh, const int64_t *lo_rows,
                   int64_t lo, int64_t hi, int64_t B, int64_t H, int64_t Hkv, int64_t D, float *out) {
    int64_t G = H / Hkv, L = hi - lo;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t hk = 0; hk < Hkv; hk++) {
            for (int64_t g = 0; g < G; g++) {
                float *o = out + (b * H + hk * G + g) * D;
                for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
            }
            for (int64_t j = lo_rows[b]; j < hi; j++) {
                const float *vj = v + b * vsb + hk * vsh + j * D;
                for (int64_t g = 0; g < G; g++) {
                    float w = p[(b * H + hk * G + g) * L + (j - lo)];
                    float *o = out + (b * H + hk * G + g) * D;
                    #pragma omp simd
                    for (int64_t d = 0; d < D; d++) o[d] += w * vj[d];
                }
            }
        }
    }
}
"""

#: -march=native: the library is built on the machine that runs it, once per process (never cached across
#: machines, whose CPUs differ); no -ffast-math, so -inf and the order of each sum are as written
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared")

_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | str:
    """The compiled kernels, or the reason there are none (no compiler, a failed build)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return "no C compiler (cc or gcc) on PATH, nor $CC"
    folder = tempfile.mkdtemp(prefix="qrl-cpu-attention-")
    src, lib = os.path.join(folder, "attention.c"), os.path.join(folder, "attention.so")
    with open(src, "w") as f:
        f.write(SOURCE)
    try:
        done = subprocess.run([cc, *FLAGS, src, "-o", lib], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{cc} did not build the kernels: {err}"
    if done.returncode != 0:
        return f"{cc} failed to build the kernels (exit {done.returncode}): {done.stderr.strip()[:300] or 'no output'}"
    try:
        dll = ctypes.CDLL(lib)
    except OSError as err:  # e.g. a temporary folder mounted noexec
        return f"the kernels built by {cc} do not load: {err}"
    dll.varlen_scores.argtypes = [_ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _i64, _ptr, _i64, _i64,
                                  _i64, _i64, _i64, _i64, _f32, _ptr]
    dll.varlen_values.argtypes = [_ptr, _ptr, _i64, _i64, _ptr, _i64, _i64, _i64, _i64, _i64, _i64, _ptr]
    shutil.rmtree(folder, ignore_errors=True)  # the loaded library stays mapped
    return dll


def unavailable() -> str | None:
    """Why `varlen_decode_attention` cannot run here (None: it can)."""
    lib = _library()
    return lib if isinstance(lib, str) else None


def varlen_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                            lo_rows: torch.Tensor, lo: int, hi: int, scale: float) -> torch.Tensor:
    """A decode step's GQA attention [B, H, 1, D] (fp32, CPU) of q [B, H, 1, D] over the columns [lo_rows[b], hi)
    of row b of the layer's cache k, v [B, Hkv, total, D] (contiguous) with the additive mask [B, 1, 1, total]
    (0 / -inf). `lo <= lo_rows[b] < hi`: the columns [lo, lo_rows[b]) are taken as masked (they are, for the engine:
    they precede the row's sequence), so the result is `decode_attention` over [lo, hi) up to summation order."""
    lib = _library()
    if isinstance(lib, str):
        raise RuntimeError(f"rollout.cpu_attention=varlen: {lib}; use rollout.cpu_attention=matmul")
    B, H, _, D = q.shape
    Hkv = k.shape[1]
    if not (k.is_contiguous() and v.is_contiguous() and mask.is_contiguous() and q.stride(3) == 1):
        raise ValueError("varlen_decode_attention wants a contiguous cache and mask and q's last dimension dense")
    lo_rows = lo_rows.contiguous()
    scores = torch.empty(B, H, hi - lo, dtype=torch.float32)
    lib.varlen_scores(q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
                      mask.data_ptr(), mask.stride(0), lo_rows.data_ptr(), lo, hi, B, H, Hkv, D, scale,
                      scores.data_ptr())
    probs = torch.softmax(scores, dim=-1)
    out = torch.empty(B, H, 1, D, dtype=torch.float32)
    lib.varlen_values(probs.data_ptr(), v.data_ptr(), v.stride(0), v.stride(1), lo_rows.data_ptr(), lo, hi,
                      B, H, Hkv, D, out.data_ptr())
    return out
