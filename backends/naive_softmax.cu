// Kernel 2 of naive attention: P = softmax(S), row by row, S (already scaled) and P in HBM in the
// storage dtype.
//
// One CTA per row of S (all heads stacked). Causal: only the permitted entries of the row, keys
// c <= r + diagonal_offset, are read and written (the rest of P is never stored, as in
// simflash/algorithms/naive.py); a row with no visible key writes nothing. The row is read from HBM
// once into shared memory, then max, sum and P are computed from there.
//
// INSTRUMENTED (compile-time): count the bytes read of S and written of P, one atomic per row each.
#include "ptx.cuh"

template <int THREADS>
static __device__ __forceinline__ float block_reduce(float x, float* scratch, bool take_max) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, x, offset);
    x = take_max ? fmaxf(x, other) : x + other;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // scratch may still be read from the previous reduction
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < THREADS / 32; ++w) x = take_max ? fmaxf(x, scratch[w]) : x + scratch[w];
  return x;
}

template <int DT, bool INSTRUMENTED>
__global__ void __launch_bounds__(256) naive_softmax(
    const storage_t* __restrict__ S,  // (H * n_q, n_kv) scores scale * Q K^T
    storage_t* __restrict__ P,        // (H * n_q, n_kv)
    int n_q, int n_kv,
    int causal, int diagonal_offset,  // causal: row r sees key c <= r + diagonal_offset
    u64* __restrict__ bytes_moved) {  // INSTRUMENTED: [S read, P written]
  using St = Storage<DT>;
  constexpr int THREADS = 256;
  constexpr float LOG2E = 1.4426950408889634f;
  extern __shared__ __align__(16) storage_t S_row[];  // (n_kv,) this row of S
  __shared__ float scratch[THREADS / 32];
  __shared__ u64 count_scratch[THREADS / 32];

  const size_t row = blockIdx.x;
  const int r = (int)(row % n_q);
  const int visible = causal ? max(0, min(n_kv, r + diagonal_offset + 1)) : n_kv;
  const storage_t* S_r = S + row * n_kv;
  storage_t* P_r = P + row * n_kv;
  // 16-byte accesses when every row starts on a 16-byte boundary; scalar ones for the rest.
  const int vector_end = n_kv % 8 == 0 ? visible / 8 * 8 : 0;

  u64 read_S = 0, written_P = 0;  // INSTRUMENTED counts of this thread

  // -- read the visible part of the row once; running max
  float m = SIMFLASH_NEG_INF;
  for (int c = threadIdx.x * 8; c < vector_end; c += THREADS * 8) {
    const uint4 chunk = *reinterpret_cast<const uint4*>(S_r + c);
    read_S += 16;
    *reinterpret_cast<uint4*>(S_row + c) = chunk;
    const storage_t* x = reinterpret_cast<const storage_t*>(&chunk);
#pragma unroll
    for (int e = 0; e < 8; ++e) m = fmaxf(m, St::to_float(x[e]));
  }
  for (int c = vector_end + threadIdx.x; c < visible; c += THREADS) {
    S_row[c] = S_r[c];
    read_S += sizeof(storage_t);
    m = fmaxf(m, St::to_float(S_row[c]));
  }
  m = block_reduce<THREADS>(m, scratch, true);

  // -- row sum of exp(S - m); m is finite whenever the row sees a key
  const float m_base = m * LOG2E;
  float l = 0.f;
  for (int c = threadIdx.x; c < visible; c += THREADS) l += ex2(fmaf(St::to_float(S_row[c]), LOG2E, -m_base));
  l = block_reduce<THREADS>(l, scratch, false);
  const float inv_l = visible > 0 ? 1.f / l : 0.f;

  // -- P = exp(S - m) / l, visible entries only
  for (int c = threadIdx.x * 8; c < vector_end; c += THREADS * 8) {
    const uint4 chunk = *reinterpret_cast<const uint4*>(S_row + c);
    const storage_t* x = reinterpret_cast<const storage_t*>(&chunk);
    u32 p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
      p[e] = St::pack(ex2(fmaf(St::to_float(x[2 * e]), LOG2E, -m_base)) * inv_l,
                      ex2(fmaf(St::to_float(x[2 * e + 1]), LOG2E, -m_base)) * inv_l);
    *reinterpret_cast<uint4*>(P_r + c) = make_uint4(p[0], p[1], p[2], p[3]);
    written_P += 16;
  }
  for (int c = vector_end + threadIdx.x; c < visible; c += THREADS) {
    P_r[c] = St::from_float(ex2(fmaf(St::to_float(S_row[c]), LOG2E, -m_base)) * inv_l);
    written_P += sizeof(storage_t);
  }

  if constexpr (INSTRUMENTED) {
    block_count<THREADS>(bytes_moved + 0, read_S, count_scratch);
    block_count<THREADS>(bytes_moved + 1, written_P, count_scratch);
  }
}
