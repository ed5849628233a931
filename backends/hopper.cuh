// The Hopper (sm_90a) instructions the version 3 kernel is built from: warpgroup matrix products
// (wgmma) reading shared memory through matrix descriptors, the tensor memory accelerator's bulk tile
// copies (TMA) completing on mbarriers, named barriers between warpgroups, and setmaxnreg.
//
// Self-contained beside ptx.cuh (no CUDA headers), so it compiles under NVRTC and nvcc alike.
#pragma once

#include "ptx.cuh"

// ---- warpgroup matrix products ---------------------------------------------------------------------
// One warpgroup (4 warps, 128 threads) computes D (64 x N, fp32) (+)= A (64 x 16) B (16 x N). The
// accumulator fragment of warp w is rows 16w..16w+15 in mma.sync's C layout, repeated over N / 8
// column blocks: d[4n + e] holds row g + 8 (e >> 1), column 8n + 2t + (e & 1) (g = lane / 4, t = lane % 4).
// The operand lists are spelled out (an asm statement takes no loop), once each, in the macros below.
// SIMFLASH_WGMMA_D<N/2>: the accumulator's N/2 registers, as operands %0.. and as their constraints.
#define SIMFLASH_WGMMA_D32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SIMFLASH_WGMMA_D64 SIMFLASH_WGMMA_D32 ", "                                                            \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                          \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SIMFLASH_WGMMA_D32_OUT                                                                                \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),             \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),       \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),     \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define SIMFLASH_WGMMA_D64_OUT                                                                                \
  SIMFLASH_WGMMA_D32_OUT,                                                                                     \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),     \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),     \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),     \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

#define SIMFLASH_WGMMA_SS_N64(TYPE)                                                                           \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"                                                     \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " {" SIMFLASH_WGMMA_D32            \
               "}, %32, %33, p, 1, 1, 0, 0;\n}"                                                               \
               : SIMFLASH_WGMMA_D32_OUT                                                                       \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate))

#define SIMFLASH_WGMMA_SS_N128(TYPE)                                                                          \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"                                                     \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {" SIMFLASH_WGMMA_D64           \
               "}, %64, %65, p, 1, 1, 0, 0;\n}"                                                               \
               : SIMFLASH_WGMMA_D64_OUT                                                                       \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate))

#define SIMFLASH_WGMMA_RS_N64(TYPE)                                                                           \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"                                                     \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " {" SIMFLASH_WGMMA_D32            \
               "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}"                                                 \
               : SIMFLASH_WGMMA_D32_OUT                                                                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

#define SIMFLASH_WGMMA_RS_N128(TYPE)                                                                          \
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %69, 0;\n"                                                     \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {" SIMFLASH_WGMMA_D64           \
               "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}"                                                 \
               : SIMFLASH_WGMMA_D64_OUT                                                                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

// D (+)= A B with A and B both in shared memory, K-major (the 16 K values of a row contiguous, as
// Q_i and K_j are stored). accumulate = 0 overwrites D.
template <int DT, int N>
static __device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], u64 desc_a, u64 desc_b, int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_ss: N must be 64 or 128");
  if constexpr (N == 64) {
    if constexpr (DT == FLOAT16) SIMFLASH_WGMMA_SS_N64("f16"); else SIMFLASH_WGMMA_SS_N64("bf16");
  } else {
    if constexpr (DT == FLOAT16) SIMFLASH_WGMMA_SS_N128("f16"); else SIMFLASH_WGMMA_SS_N128("bf16");
  }
}

// D (+)= A B with A in registers (mma.sync's A fragment of the warp's 16 rows: a[0] row g, a[1] row
// g + 8, columns 2t, 2t + 1; a[2], a[3] the same 8 columns on) and B in shared memory, MN-major (the
// N values of a K row contiguous, as V_j is stored): the transposed-B form.
template <int DT, int N>
static __device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const u32 (&a)[4], u64 desc_b, int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_rs: N must be 64 or 128");
  if constexpr (N == 64) {
    if constexpr (DT == FLOAT16) SIMFLASH_WGMMA_RS_N64("f16"); else SIMFLASH_WGMMA_RS_N64("bf16");
  } else {
    if constexpr (DT == FLOAT16) SIMFLASH_WGMMA_RS_N128("f16"); else SIMFLASH_WGMMA_RS_N128("bf16");
  }
}

// Registers wgmma reads or writes must not be touched by other instructions while it runs: the fence
// orders earlier register writes before the next wgmma; commit closes a group; wait<N> returns once at
// most N groups are still running.
static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keep the compiler from moving accesses to an accumulator across an asynchronous product.
template <int N>
static __device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
static __device__ __forceinline__ void fence_registers(u32 (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}

// The descriptor of a shared-memory operand laid out in 128-byte swizzled rows (8-row atoms of 1024
// bytes, each 16-byte chunk XORed with its row within the atom, as the TMA writes with SWIZZLE_128B).
// leading: bytes to the next 64 columns (MN-major; K-major ignores it, 16 by convention); stride: bytes
// to the next 8 rows. The atom must start on 1024 bytes; `address` may sit inside it (a K offset).
static __device__ __forceinline__ u64 smem_descriptor(u32 address, u32 leading, u32 stride) {
  return (u64)((address & 0x3FFFF) >> 4) | (u64)((leading & 0x3FFFF) >> 4) << 16 |
         (u64)((stride & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}

// ---- mbarriers ---------------------------------------------------------------------------------------
static __device__ __forceinline__ void mbarrier_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// The init is visible to the copy engine and the other threads after this and a barrier.
static __device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival that also announces `bytes` of copies still to land in this phase.
static __device__ __forceinline__ void mbarrier_expect_bytes(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mbarrier_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Wait until the phase of the given parity has completed (a fresh barrier counts parity 1 as done).
static __device__ __forceinline__ void mbarrier_wait(u32 bar, u32 parity) {
  u32 done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- the tensor memory accelerator -------------------------------------------------------------------
// A tensor map written to global memory by a host copy: make it visible to the copy engine once.
static __device__ __forceinline__ void tensormap_acquire(const void* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;" ::"l"(map) : "memory");
}
// Copy the box at (c0, c1, c2) of a 3-d tensor into shared memory; the bytes count on `bar`. Parts of
// the box outside the tensor are not read and land as zeros.
static __device__ __forceinline__ void tma_load_3d(u32 dst, const void* map, int c0, int c1, int c2, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
      ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// Copy shared memory to the box at (c0, c1, c2); parts outside the tensor are not written.
static __device__ __forceinline__ void tma_store_3d(const void* map, int c0, int c1, int c2, u32 src) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];"
               ::"l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(src)
               : "memory");
}
static __device__ __forceinline__ void tma_store_commit_and_wait() {
  asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;" ::: "memory");
}
// Ordinary shared-memory stores made visible to the copy engine and the tensor cores.
static __device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- warpgroups ----------------------------------------------------------------------------------------
// Named barrier `id` (0 is __syncthreads'): sync waits for `threads` arrivals, arrive adds this warp's.
static __device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
static __device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Hand registers between warpgroups: the producer gives up what the consumers take.
template <int REGS>
static __device__ __forceinline__ void registers_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
}
template <int REGS>
static __device__ __forceinline__ void registers_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
}
