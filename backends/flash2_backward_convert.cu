// FlashAttention-2 backward, the convert kernel (the ledger's "flash2_backward_convert"): dQ, summed
// in float32 by the main kernel's atomic adds into dQ_accum, rounded once to the storage dtype.
//
// 256 threads a CTA, 8 values a thread: 32 bytes read, 16 written.
//
// INSTRUMENTED (compile-time): count the bytes each load and store moved, one atomic per tensor per CTA.
#include "ptx.cuh"

template <int DT, bool INSTRUMENTED>
__global__ void __launch_bounds__(256) flash2_backward_convert(
    const float* __restrict__ dQ_accum,  // (H, n_q, d)
    storage_t* __restrict__ dQ,          // (H, n_q, d)
    long long values,                    // H * n_q * d, a multiple of 8
    u64* __restrict__ bytes_moved) {     // INSTRUMENTED: [dQ_accum read, dQ written]
  using St = Storage<DT>;
  constexpr int THREADS = 256;
  const long long at = ((long long)blockIdx.x * THREADS + threadIdx.x) * 8;
  u64 read_dQ = 0, written_dQ = 0;  // INSTRUMENTED counts of this thread

  if (at < values) {
    const float4 lo = *reinterpret_cast<const float4*>(dQ_accum + at);
    const float4 hi = *reinterpret_cast<const float4*>(dQ_accum + at + 4);
    const uint4 out = {St::pack(lo.x, lo.y), St::pack(lo.z, lo.w), St::pack(hi.x, hi.y), St::pack(hi.z, hi.w)};
    *reinterpret_cast<uint4*>(dQ + at) = out;
    read_dQ += 32, written_dQ += 16;
  }

  if constexpr (INSTRUMENTED) {
    __shared__ u64 scratch[THREADS / 32];
    block_count<THREADS>(bytes_moved + 0, read_dQ, scratch);
    block_count<THREADS>(bytes_moved + 1, written_dQ, scratch);
  }
}
