"""Does a stream of writes cost a kernel the operand it reads again a little later? cuBLAS's Q K^T GEMM of the
naive path reads more of Q and K from DRAM than once from N = 5,120 up, as much as Q and K again at N = 8,192,
independently of the number of heads (`python benchmarks/gpu/naive_warm/qk_rereads.py`), though every
operand tile it reads again was read a few MiB of S before. Here a kernel lays out that GEMM's work as its
nvjet tile does (a CTA per output tile of 256 query rows x 128 keys, 132 CTAs walking the tiles band after
band: each band of 256 query rows reads all of K again, a block of 128 rows of K at a time, and its 64 KiB
of Q; or, `grouped`, the tiles of G blocks of K at a time band after band, then the next G blocks: each
band's Q is read again once a group, after G x N / 256 tiles; `serpentine`, every other group walking the
bands backwards, so that a band's Q is read again after anything from none to twice that) and, per tile,
either

- `write`: writes its 64 KiB of S (the GEMM: S streams through the L2 dirty between K's re-reads), or
- `read`:  reads 64 KiB of another buffer once (a read stream of the same size in place of S), or
- `none`:  does nothing more (only K and Q go through the L2).

Nsight Compute's DRAM bytes read, after a read-only flush each (application replay, no cache control, as
the warm sweeps are measured):

    python benchmarks/gpu/l2_probe/bands.py OUT_DIR     # ncu over itself: bands.json, bands_ncu.csv
    python benchmarks/gpu/l2_probe/bands.py --show benchmarks/gpu/l2_probe/bands.json

Printed per case: the DRAM reads beyond the compulsory (K + Q, and the other buffer where read), as a share
of K, and as a share of K's re-reads (bands less one, times K).
"""

import json
from pathlib import Path

from probe import MiB, chunks, profile_cases, read_kernel, run

SEQUENCES = (4096, 5120, 6144, 7168, 8192, 12288, 16384)
MODES = ("write", "read", "none")
CTAS, THREADS = 132, 512  # one CTA an SM, as the 256 x 128 tile's stages fill an SM's shared memory
KEY_BLOCK, QUERY_BAND = 128, 256  # rows of K per tile, rows of Q per band (fp16, d = 128: 256 bytes a row)
GROUPS = (4, 8, 16, 32)  # blocks of K a group (grouped: S written), at N a multiple of 4,096 (whole groups)
SERPENTINE_GROUPS = (8, 16)  # grouped and serpentine, at N a multiple of 2,048
SERPENTINE_SEQUENCES = (4096, 6144, 8192, 10240, 12288, 16384)
CASES = [(mode, n, 0, False) for mode in MODES for n in SEQUENCES] + [
    ("write", n, g, False) for g in GROUPS for n in SEQUENCES if n % 4096 == 0] + [
    ("write", n, g, True) for g in SERPENTINE_GROUPS for n in SERPENTINE_SEQUENCES]
BANDS = r"""
extern "C" __global__ void bands(const float4* K, const float4* Q, float4* S, const float4* R,
                                 unsigned long long n, int mode, unsigned long long group, int serpentine,
                                 float* never) {
  const unsigned long long per_band = n / 128, bands = n / 256, tiles = per_band * bands;  // 256 queries x 128 keys
  if (group == 0) group = per_band;  // band after band
  float s = 0.f;
  for (unsigned long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const unsigned long long in_group = t % (group * bands);
    const unsigned long long g = t / (group * bands), block = g * group + in_group % group;
    const unsigned long long band = serpentine && g % 2 ? bands - 1 - in_group / group : in_group / group;
    const float4* k = K + block * 2048;  // 128 rows of K: 32 KiB
    const float4* q = Q + band * 4096;   // 256 rows of Q: 64 KiB
    for (int i = threadIdx.x; i < 2048; i += blockDim.x) { const float4 v = k[i]; s += v.x + v.w; }
    for (int i = threadIdx.x; i < 4096; i += blockDim.x) { const float4 v = q[i]; s += v.y + v.z; }
    const unsigned long long at = t * 4096;  // the tile's 64 KiB of S
    if (mode == 0) for (int i = threadIdx.x; i < 4096; i += blockDim.x) S[at + i] = make_float4(s, i, t, 0.f);
    if (mode == 1) for (int i = threadIdx.x; i < 4096; i += blockDim.x) { const float4 v = R[at + i]; s += v.x; }
  }
  if (s == -1.f) never[0] = s;
}
"""


def operand_bytes(n: int) -> int:
    """Bytes of K (or of Q): n rows of 256 bytes."""
    return n * 256


def stream_bytes(n: int) -> int:
    """Bytes of S: a 64 KiB tile for each 256 queries x 128 keys."""
    return n // QUERY_BAND * (n // KEY_BLOCK) * 64 * 1024


def target() -> None:
    import cupy

    module = cupy.RawModule(code=read_kernel("flush_read") + BANDS)
    flush, bands = module.get_function("flush_read"), module.get_function("bands")
    largest = max(SEQUENCES)
    K, Q = (cupy.ones(operand_bytes(largest) // 4, dtype=cupy.float32) for _ in range(2))
    S, R = (cupy.ones(stream_bytes(largest) // 4, dtype=cupy.float32) for _ in range(2))
    F = cupy.ones(512 * MiB // 4, dtype=cupy.float32)
    never, same = cupy.zeros(1, dtype=cupy.float32), cupy.int32(0)
    for mode, n, group, serpentine in CASES:
        flush((CTAS * 4,), (256,), (F, chunks(512), same, never))
        bands((CTAS,), (THREADS,), (K, Q, S, R, cupy.uint64(n), cupy.int32(MODES.index(mode)), cupy.uint64(group),
                                     cupy.int32(serpentine), never))
    cupy.cuda.Device().synchronize()


def main(out: Path) -> None:
    profile_cases(__file__, out, "bands", "bands", [{"mode": mode, "n": n, "group": group, "serpentine": serpentine}
                                                       for mode, n, group, serpentine in CASES], show)


def show(path: Path) -> None:
    report = json.loads(path.read_text())
    print(f"{CTAS} CTAs walking tiles of {QUERY_BAND} queries x {KEY_BLOCK} keys band after band (d = 128, fp16)")
    print("Band after band (group -): K read again every band, S of a band between; grouped (G blocks): Q read again")
    print("every group, S of G x N / 256 tiles between. DRAM reads beyond the compulsory, as a share of K and of the")
    print("re-reads (K's band after band, Q's grouped)")
    print("(serpentine, Gs: S between is the average; a band's Q is read again after none to twice it)")
    print("mode       N  group  K MiB  S between MiB  time us  DRAM beyond compulsory MiB  of K  of the re-reads")
    for row in report["rows"]:
        n, k, group = row["n"], operand_bytes(row["n"]), row.get("group", 0)
        compulsory = 2 * k + (stream_bytes(n) if row["mode"] == "read" else 0)
        beyond = row["dram_read_bytes"] - compulsory
        groups = n // KEY_BLOCK // group if group else 0
        rereads = k * (groups - 1) if group else k * (n // QUERY_BAND - 1)
        between = 64 * 1024 * (group * n // QUERY_BAND if group else n // KEY_BLOCK)
        share = f"{beyond / rereads:15.2%}" if rereads else f"{'(none)':>15s}"  # one group: Q is read once
        label = f"{group}{'s' if row.get('serpentine') else ''}" if group else "-"
        print(f"{row['mode']:5s}  {n:5d}  {label:>5}  {k / MiB:5.2f}  {between / MiB:13.2f}  {row['time_ns'] / 1e3:7.0f}"
              f"  {beyond / MiB:26.2f}  {beyond / k:4.0%}  {share}")


if __name__ == "__main__":
    run(target, main, show)
