// FlashAttention-2 backward, the preprocess kernel (the ledger's "flash2_backward_preprocess"):
// D_i = rowsum(dO_i o O_i) in fp32 for every query row (Algorithm 2's D, which turns the softmax's
// Jacobian into dS = P o (dP - D)), and dQ_accum zeroed for the main kernel's atomic adds.
//
// One CTA per (head, B_r query rows), 256 threads: each row's d values are read by d / 8 neighbouring
// lanes, 16 bytes of O and of dO each, and their products summed across those lanes.
//
// INSTRUMENTED (compile-time): count the bytes each load and store moved per tensor, one atomic per
// tensor per CTA.
#include "ptx.cuh"

template <int DT, int B_r, int d, bool INSTRUMENTED>
__global__ void __launch_bounds__(256) flash2_backward_preprocess(
    const storage_t* __restrict__ O,   // (H, n_q, d)
    const storage_t* __restrict__ dO,  // (H, n_q, d)
    float* __restrict__ D,             // (H, n_q)
    float* __restrict__ dQ_accum,      // (H, n_q, d)
    int n_q,
    u64* __restrict__ bytes_moved) {   // INSTRUMENTED: [O read, dO read, D written, dQ_accum written]
  using St = Storage<DT>;
  constexpr int THREADS = 256;
  constexpr int LANES = d / 8;                // threads per row, 8 values each
  constexpr int ROWS_PER_PASS = THREADS / LANES;
  static_assert(32 % LANES == 0 && B_r % ROWS_PER_PASS == 0, "a row's lanes must sit in one warp");

  const int h = blockIdx.y;
  const int ch = threadIdx.x % LANES;
  u64 read_O = 0, read_dO = 0, written_D = 0, written_dQ = 0;  // INSTRUMENTED counts of this thread

#pragma unroll
  for (int pass = 0; pass < B_r / ROWS_PER_PASS; ++pass) {
    const int row = blockIdx.x * B_r + pass * ROWS_PER_PASS + threadIdx.x / LANES;
    const bool valid = row < n_q;
    const size_t at = ((size_t)h * n_q + row) * d + ch * 8;
    float sum = 0.f;
    if (valid) {
      const uint4 o = *reinterpret_cast<const uint4*>(O + at), g = *reinterpret_cast<const uint4*>(dO + at);
      const storage_t* o8 = reinterpret_cast<const storage_t*>(&o);
      const storage_t* g8 = reinterpret_cast<const storage_t*>(&g);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum = fmaf(St::to_float(g8[e]), St::to_float(o8[e]), sum);
      const float4 zero = {0.f, 0.f, 0.f, 0.f};
      *reinterpret_cast<float4*>(dQ_accum + at) = zero;
      *reinterpret_cast<float4*>(dQ_accum + at + 4) = zero;
      read_O += 16, read_dO += 16, written_dQ += 32;
    }
    // -- the row's sum over its LANES neighbouring lanes (every lane of the warp takes part)
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (valid && ch == 0) {
      D[(size_t)h * n_q + row] = sum;
      written_D += 4;
    }
  }

  if constexpr (INSTRUMENTED) {
    __shared__ u64 scratch[THREADS / 32];
    block_count<THREADS>(bytes_moved + 0, read_O, scratch);
    block_count<THREADS>(bytes_moved + 1, read_dO, scratch);
    block_count<THREADS>(bytes_moved + 2, written_D, scratch);
    block_count<THREADS>(bytes_moved + 3, written_dQ, scratch);
  }
}
