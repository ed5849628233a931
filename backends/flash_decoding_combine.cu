// Flash-Decoding, kernel 2 of 2: the combine kernel, simflash/algorithms/flash_decoding_combine.py: a
// logsumexp over the splits' partial results, row by row.
//
//     LSE = lse_max + log sum_s exp(LSE_s - lse_max)
//     w_s = exp(LSE_s - LSE)      split s's share of the row's probability mass
//     O   = sum_s w_s O_s         written once, in the storage dtype
//
// A split that saw no key of a row (LSE_s = -inf) weighs 0; a row no split saw (lse_max taken as 0, the
// sum 0, LSE = +inf) outputs 0, never NaN.
//
// One CTA per row, as decoding has few rows and many splits, and the kernel is one memory round trip
// if it can be: every thread first loads its share of the splits' O_s rows (16 bytes a lane, the 4
// warps taking alternate splits, up to AHEAD each) while warp 0 reads the row's LSE_s (a split a lane)
// and reduces them to the weights in shared memory; then each thread scales and sums, and the partial
// sums meet in shared memory.
//
// INSTRUMENTED (compile-time): count the HBM bytes each load and store moved per tensor, one atomic per
// CTA per tensor.
#include "ptx.cuh"

static __device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

static __device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <int DT, int D, bool INSTRUMENTED>
__global__ void __launch_bounds__(128) flash_decoding_combine(
    const float* __restrict__ O_partial,    // (num_splits, rows, D)
    const float* __restrict__ LSE_partial,  // (num_splits, rows)
    storage_t* __restrict__ O,              // (rows, D)
    int rows, int num_splits,
    u64* __restrict__ bytes_moved) {        // INSTRUMENTED: [LSE_partial, O_partial read; O written]
  using St = Storage<DT>;
  constexpr int THREADS = 128;
  constexpr int LANES = D / 4;             // threads holding a row: 4 floats each
  constexpr int PARTS = THREADS / LANES;   // groups of them taking alternate splits
  constexpr int AHEAD = 8;                 // splits a thread loads before the weights are known
  extern __shared__ float w[];             // (num_splits,) the row's weights
  __shared__ float4 part_sum[PARTS][LANES];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = blockIdx.x;
  const int ch = threadIdx.x % LANES, part = threadIdx.x / LANES;
  u64 read_LSE = 0, read_O = 0, written_O = 0;  // INSTRUMENTED counts of this thread
  auto load_O = [&](int s) {  // columns 4 ch .. 4 ch + 3 of split s's row
    read_O += 16;
    return *reinterpret_cast<const float4*>(O_partial + ((size_t)s * rows + row) * D + ch * 4);
  };

  // -- this thread's first splits' partial outputs, in flight while the weights are worked out
  float4 O_ahead[AHEAD];
#pragma unroll
  for (int k = 0; k < AHEAD; ++k)
    if (part + k * PARTS < num_splits) O_ahead[k] = load_O(part + k * PARTS);

  // -- every split's logsumexp of this row: lse_max, then the sum, over warp 0
  if (warp == 0) {
    float lse_max = SIMFLASH_NEG_INF;
    for (int s = lane; s < num_splits; s += 32) {
      w[s] = LSE_partial[(size_t)s * rows + row];
      read_LSE += 4;
      lse_max = fmaxf(lse_max, w[s]);
    }
    lse_max = warp_max(lse_max);
    if (lse_max == SIMFLASH_NEG_INF) lse_max = 0.f;  // a row no split saw: exp(-inf - 0) = 0, not NaN
    float lse_sum = 0.f;
    for (int s = lane; s < num_splits; s += 32) lse_sum += expf(w[s] - lse_max);
    lse_sum = warp_sum(lse_sum);
    const float LSE = lse_sum > 0.f ? logf(lse_sum) + lse_max : __int_as_float(0x7f800000);  // +inf: every w_s = 0
    for (int s = lane; s < num_splits; s += 32) w[s] = expf(w[s] - LSE);
  }
  __syncthreads();

  // -- every split's partial output, scaled by its weight, into the accumulator (the rest streamed now)
  float4 acc = {0.f, 0.f, 0.f, 0.f};  // columns 4 ch .. 4 ch + 3 of O
  auto add = [&](int s, float4 O_s) {
    acc = float4{fmaf(w[s], O_s.x, acc.x), fmaf(w[s], O_s.y, acc.y), fmaf(w[s], O_s.z, acc.z), fmaf(w[s], O_s.w, acc.w)};
  };
#pragma unroll
  for (int k = 0; k < AHEAD; ++k)
    if (part + k * PARTS < num_splits) add(part + k * PARTS, O_ahead[k]);
#pragma unroll 4
  for (int s = part + AHEAD * PARTS; s < num_splits; s += PARTS) add(s, load_O(s));
  part_sum[part][ch] = acc;
  __syncthreads();

  // -- the output, once, in the storage dtype
  if (part == 0) {
    for (int p = 1; p < PARTS; ++p) {
      const float4 other = part_sum[p][ch];
      acc = float4{acc.x + other.x, acc.y + other.y, acc.z + other.z, acc.w + other.w};
    }
    *reinterpret_cast<uint2*>(O + (size_t)row * D + ch * 4) = uint2{St::pack(acc.x, acc.y), St::pack(acc.z, acc.w)};
    written_O += 8;
  }

  if constexpr (INSTRUMENTED) {
    __shared__ u64 scratch[THREADS / 32];
    block_count<THREADS>(bytes_moved + 0, read_LSE, scratch);
    block_count<THREADS>(bytes_moved + 1, read_O, scratch);
    block_count<THREADS>(bytes_moved + 2, written_O, scratch);
  }
}
