// FlashAttention-2 forward (Dao 2023, Algorithm 1) on the tensor cores: the same algorithm, names and
// schedule as simflash/algorithms/flash2.py.
//
// One CTA per (head, query tile i) of B_r rows; B_r / 16 warps, each owning 16 rows of the tile.
// KV tiles of B_c rows stream through double-buffered shared memory (cp.async); S_ij and P_ij live in
// registers (mma.sync m16n8k16, ldmatrix). m_i, l_i and the unnormalised a_i stay in fp32; the one
// division happens after the last KV tile, and a row that saw no key outputs 0.
//
// INSTRUMENTED (compile-time): count the HBM bytes each copy instruction moved per tensor, one atomic
// per query tile per tensor, and record m_i, l_i after every KV tile of one chosen (head, tile). In
// the timed build (INSTRUMENTED = false) all of that is compiled out.
//
// L (optional, nullptr: not written): the logsumexp of each row's scaled scores, m_i + log l_i, for a
// backward pass; +inf for a row that saw no key. INSTRUMENTED: counted as a fifth tensor, one atomic
// per row (a fifth block reduction costs the d = 256 build its last registers).
#include "ptx.cuh"

template <int DT, int B_r, int B_c, int D, bool INSTRUMENTED>
__global__ void __launch_bounds__(B_r / 16 * 32) flash2_forward(
    const storage_t* __restrict__ Q,  // (H, n_q, D)
    const storage_t* __restrict__ K,  // (H, n_kv, D)
    const storage_t* __restrict__ V,  // (H, n_kv, D)
    storage_t* __restrict__ O,        // (H, n_q, D)
    int n_q, int n_kv, float scale,
    int causal, int diagonal_offset,  // causal: row r sees key c <= r + diagonal_offset
    u64* __restrict__ bytes_moved,    // INSTRUMENTED: [Q read, K read, V read, O written]
    int trace_head, int trace_tile,   // INSTRUMENTED: the (head, query tile) whose state is recorded
    float* __restrict__ trace_m,      // INSTRUMENTED: (T_c, B_r) m_i after each KV tile
    float* __restrict__ trace_l,      // INSTRUMENTED: (T_c, B_r) l_i after each KV tile
    float* __restrict__ L) {          // (H, n_q) logsumexp, or nullptr
  using St = Storage<DT>;
  static_assert(B_r % 16 == 0 && B_c % 16 == 0 && D % 16 == 0 && D >= 64, "unsupported tile shape");
  constexpr int THREADS = B_r / 16 * 32;
  constexpr int NS = B_c / 8;   // 8-column tiles of S_ij per warp
  constexpr int NO = D / 8;     // 8-column tiles of a_i per warp
  constexpr float LOG2E = 1.4426950408889634f;

  extern __shared__ __align__(128) unsigned char smem[];
  const u32 Q_s = shared_address(smem);               // (B_r, D)
  const u32 K_s = Q_s + 2 * B_r * D;                  // (2, B_c, D) double buffer
  const u32 V_s = K_s + 2 * 2 * B_c * D;              // (2, B_c, D) double buffer
  storage_t* O_s = reinterpret_cast<storage_t*>(smem);  // (B_r, D) staging for O_i, over Q_s

  const int i = gridDim.x - 1 - blockIdx.x;  // query tile; the longest causal tiles start first
  const int h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;  // this thread holds rows g, g + 8 and columns 2t, 2t + 1

  const int row_start = i * B_r;
  const int rows = min(B_r, n_q - row_start);
  // -- the skip bound: KV tiles up to the last column any row of this tile may see
  const int last_col = causal ? min(row_start + rows - 1 + diagonal_offset, n_kv - 1) : n_kv - 1;
  const int T_c = last_col >= 0 ? last_col / B_c + 1 : 0;

  const storage_t* Q_h = Q + (size_t)h * n_q * D;
  const storage_t* K_h = K + (size_t)h * n_kv * D;
  const storage_t* V_h = V + (size_t)h * n_kv * D;
  storage_t* O_h = O + (size_t)h * n_q * D;
  u64 read_Q = 0, read_K = 0, read_V = 0, written_O = 0;  // INSTRUMENTED counts of this thread

  // -- Q_i, then K_0, V_0; a tile that visits no KV tile reads nothing (zero rows) and writes zeros
  read_Q += load_tile<B_r, D, THREADS>(Q_s, Q_h + (size_t)row_start * D, T_c > 0 ? rows : 0);
  if (T_c > 0) {
    read_K += load_tile<B_c, D, THREADS>(K_s, K_h, min(B_c, n_kv));
    read_V += load_tile<B_c, D, THREADS>(V_s, V_h, min(B_c, n_kv));
  }
  cp_async_commit();

  float m_i[2] = {SIMFLASH_NEG_INF, SIMFLASH_NEG_INF};  // running row max of the raw scores Q K^T
  float l_i[2] = {0.f, 0.f};                            // this thread's part of the running row sum
  float a_i[NO][4];                                      // (16, D) per warp: unnormalised output
#pragma unroll
  for (int n = 0; n < NO; ++n) a_i[n][0] = a_i[n][1] = a_i[n][2] = a_i[n][3] = 0.f;
  // This warp's 16 rows of Q_i as tensor-core A fragments: kept in registers across KV tiles up to
  // d = 128; at d = 256 they would crowd a_i out of the register file, so they are reread from shared
  // memory for every KV tile (as FlashAttention-2 does for its large head dims).
  constexpr bool Q_IN_REGISTERS = D <= 128;
  u32 Q_frag[Q_IN_REGISTERS ? D / 16 : 1][4];
  const float scale_log2 = scale * LOG2E;  // exp(scale * x) = 2^(scale_log2 * x)
  const int warp_row = row_start + warp * 16;  // global row of this warp's first row

  for (int j = 0; j < T_c; ++j) {
    const int buf = j & 1;
    const u32 K_j = K_s + buf * 2 * B_c * D, V_j = V_s + buf * 2 * B_c * D;
    // -- prefetch K_{j+1}, V_{j+1} into the other buffer while this tile computes
    if (j + 1 < T_c) {
      const int col = (j + 1) * B_c;
      const int nbuf = (buf ^ 1) * 2 * B_c * D;
      read_K += load_tile<B_c, D, THREADS>(K_s + nbuf, K_h + (size_t)col * D, min(B_c, n_kv - col));
      read_V += load_tile<B_c, D, THREADS>(V_s + nbuf, V_h + (size_t)col * D, min(B_c, n_kv - col));
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (Q_IN_REGISTERS && j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(Q_frag[Q_IN_REGISTERS ? kk : 0], Q_s + 2 * swizzle<D>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
    }

    // -- S_ij = Q_i K_j^T   (16, B_c) per warp, fp32
    float S_ij[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n) S_ij[n][0] = S_ij[n][1] = S_ij[n][2] = S_ij[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int q = Q_IN_REGISTERS ? kk : 0;
      if (!Q_IN_REGISTERS)
        ldmatrix_x4(Q_frag[0], Q_s + 2 * swizzle<D>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
      for (int n = 0; n < NS; n += 2) {
        u32 b[4];  // K_j rows 8n..8n+15, columns 16kk..16kk+15
        ldmatrix_x4(b, K_j + 2 * swizzle<D>(n * 8 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
        St::mma(S_ij[n], Q_frag[q], b[0], b[1]);
        St::mma(S_ij[n + 1], Q_frag[q], b[2], b[3]);
      }
    }

    // -- mask columns past n_kv and (causal) keys in a row's future, before the statistics see them
    const int col0 = j * B_c;
    if (col0 + B_c > n_kv || (causal && col0 + B_c - 1 > row_start + diagonal_offset))
      mask_scores(S_ij, warp_row, col0, n_kv, causal, diagonal_offset);

    // -- update m_i and l_i
    float m_new[2] = {m_i[0], m_i[1]};
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      m_new[0] = fmaxf(m_new[0], fmaxf(S_ij[n][0], S_ij[n][1]));
      m_new[1] = fmaxf(m_new[1], fmaxf(S_ij[n][2], S_ij[n][3]));
    }
    float alpha[2], m_base[2], row_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(0xffffffffu, m_new[r], 1));  // the 4 threads of a row
      m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(0xffffffffu, m_new[r], 2));
      // A row with no visible key yet keeps m = -inf: use base 0 so 2^-inf = 0, not NaN.
      m_base[r] = m_new[r] == SIMFLASH_NEG_INF ? 0.f : m_new[r] * scale_log2;
      alpha[r] = ex2(m_i[r] * scale_log2 - m_base[r]);  // moves the old state onto the new max
      m_i[r] = m_new[r];
    }
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        S_ij[n][e] = ex2(fmaf(S_ij[n][e], scale_log2, -m_base[e >> 1]));  // now P_ij
        row_sum[e >> 1] += S_ij[n][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_i[r] = alpha[r] * l_i[r] + row_sum[r];
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      a_i[n][0] *= alpha[0];
      a_i[n][1] *= alpha[0];
      a_i[n][2] *= alpha[1];
      a_i[n][3] *= alpha[1];
    }

    // -- a_i += P_ij V_j   (P_ij rounded to the storage dtype, as the tensor cores take it)
#pragma unroll
    for (int kc = 0; kc < B_c / 16; ++kc) {
      const u32 P_frag[4] = {St::pack(S_ij[2 * kc][0], S_ij[2 * kc][1]), St::pack(S_ij[2 * kc][2], S_ij[2 * kc][3]),
                             St::pack(S_ij[2 * kc + 1][0], S_ij[2 * kc + 1][1]),
                             St::pack(S_ij[2 * kc + 1][2], S_ij[2 * kc + 1][3])};
#pragma unroll
      for (int n = 0; n < NO; n += 2) {
        u32 b[4];  // V_j rows 16kc..16kc+15, columns 8n..8n+15, transposed
        ldmatrix_x4_trans(b, V_j + 2 * swizzle<D>(kc * 16 + (lane & 15), n + (lane >> 4)));
        St::mma(a_i[n], P_frag, b[0], b[1]);
        St::mma(a_i[n + 1], P_frag, b[2], b[3]);
      }
    }

    if constexpr (INSTRUMENTED) {
      if (h == trace_head && i == trace_tile) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float l_row = l_i[r] + __shfl_xor_sync(0xffffffffu, l_i[r], 1);
          l_row += __shfl_xor_sync(0xffffffffu, l_row, 2);
          const int row = warp * 16 + g + r * 8;
          if (t == 0 && row < rows) {
            trace_m[j * B_r + row] = m_i[r] * scale;  // the simulator's m: max of the scaled scores
            trace_l[j * B_r + row] = l_row;
          }
        }
      }
    }
    __syncthreads();  // every warp is done with buffer `buf` before it is refilled
  }
  cp_async_wait<0>();  // a tile that visited no KV tile still has its (empty) Q_i copies in flight
  __syncthreads();

  // -- normalise once; a row that saw no key outputs 0
  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l_row = l_i[r] + __shfl_xor_sync(0xffffffffu, l_i[r], 1);
    l_row += __shfl_xor_sync(0xffffffffu, l_row, 2);
    inv_l[r] = l_row > 0.f ? 1.f / l_row : 0.f;
    const int row = warp * 16 + g + r * 8;
    if (L != nullptr && t == 0 && row < rows) {
      L[(size_t)h * n_q + row_start + row] = l_row > 0.f ? m_i[r] * scale + logf(l_row) : SIMFLASH_POS_INF;
      if constexpr (INSTRUMENTED) atomicAdd(bytes_moved + 4, 4ull);
    }
  }
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + g + r * 8;
      *reinterpret_cast<u32*>(O_s + swizzle<D>(row, n) + 2 * t) =
          St::pack(a_i[n][2 * r] * inv_l[r], a_i[n][2 * r + 1] * inv_l[r]);
    }
  __syncthreads();
  // -- O_i to HBM in 16-byte chunks, valid rows only
  written_O += store_tile<B_r, D, THREADS>(O_h + (size_t)row_start * D, O_s, rows);

  if constexpr (INSTRUMENTED) {
    __shared__ u64 scratch[THREADS / 32];
    block_count<THREADS>(bytes_moved + 0, read_Q, scratch);
    block_count<THREADS>(bytes_moved + 1, read_K, scratch);
    block_count<THREADS>(bytes_moved + 2, read_V, scratch);
    block_count<THREADS>(bytes_moved + 3, written_O, scratch);
  }
}
