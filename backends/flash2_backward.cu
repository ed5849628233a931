// FlashAttention-2 backward (Dao 2023, Algorithm 2) on the tensor cores, the main kernel: dK, dV, and
// each KV tile's share of dQ. The ledger's "flash2_backward", schedule as simflash's FA-2 backward.
//
// One CTA per (head, KV tile j) of B_c rows; B_c / 16 warps. K_j and V_j stay in shared memory while
// the query tiles i that see tile j stream through: Q_i and dO_i double-buffered (cp.async), L_i and
// D_i from HBM into registers. Per query tile the CTA recomputes S_ij and P_ij = exp(S_ij - L_i)
// (masked entries 0), forms dP_ij = dO_i V_j^T and dS_ij = P_ij o (dP_ij - D_i), stages P_ij and
// dS_ij in shared memory in the storage dtype (the tensor cores take them so, and the transposed
// products below read them by columns), and accumulates dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i
// in fp32 registers across query tiles. dQ_i gets this KV tile's share, scale dS_ij K_j, by float32
// atomic adds into dQ_accum, which every CTA of the head adds to.
//
// Two warp layouts: for S_ij, dP_ij and dQ_i the warps tile the B_r rows 16 at a time and split the
// columns (B_c or d) into B_c / B_r strips; for dK_j and dV_j each warp owns 16 of the B_c rows.
//
// INSTRUMENTED (compile-time): count the HBM bytes each copy, load, store and atomic moved per
// tensor (an atomic add counts its float32 addend as written). The counts gather in shared memory,
// as the accumulators take every register, and reach HBM in one atomic per tensor per CTA.
#include "ptx.cuh"

// Byte offsets of one lane's row and 16-byte chunk in a swizzled shared tile of COLS columns, for
// every chunk first_chunk + C and row row0 + lane_row with row0 a multiple of 8: the swizzle (chunk
// XOR row & 7) then depends on C mod 8 alone, so at(row0, C) is one of 8 registers plus a constant.
// (A swizzle<COLS>() per ldmatrix would leave the compiler dozens of distinct addresses to keep
// alive across the query-tile loop.)
template <int COLS>
struct LaneTile {
  u32 offset[8];
  __device__ __forceinline__ LaneTile(int lane_row, int first_chunk) {
#pragma unroll
    for (int q = 0; q < 8; ++q) offset[q] = 2 * swizzle<COLS>(lane_row, first_chunk + q);
  }
  __device__ __forceinline__ u32 at(int row0, int C) const {  // row0 and C compile-time after unrolling
    return offset[C & 7] + 2 * (row0 * COLS + ((C & ~7) << 3));
  }
};

// acc = rows row0..row0 + 15 of A times (8-column tiles n_first..n_first + N - 1 of this lane's strip of
// B)^T, both shared tiles of d columns, for one warp: S_ij = Q_i K_j^T and dP_ij = dO_i V_j^T, (16, 8 N)
// in fp32.
template <int DT, int N, int d>
static __device__ __forceinline__ void mma_a_bt(float (&acc)[N][4], u32 A, int row0, u32 B, const LaneTile<d>& a_at,
                                                const LaneTile<d>& b_at, int n_first = 0) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < d / 16; ++kk) {
    u32 a[4];  // A rows row0.., columns 16kk..16kk+15
    ldmatrix_x4(a, A + a_at.at(row0, 2 * kk));
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      u32 b[4];  // B rows 8n..8n+15 of the strip, columns 16kk..16kk+15
      ldmatrix_x4(b, B + b_at.at((n_first + n) * 8, 2 * kk));
      Storage<DT>::mma(acc[n], a, b[0], b[1]);
      Storage<DT>::mma(acc[n + 1], a, b[2], b[3]);
    }
  }
}

template <int DT, int B_r, int B_c, int d, bool INSTRUMENTED>
__global__ void __launch_bounds__(B_c / 16 * 32) flash2_backward(
    const storage_t* __restrict__ Q,   // (H, n_q, d)
    const storage_t* __restrict__ K,   // (H, n_kv, d)
    const storage_t* __restrict__ V,   // (H, n_kv, d)
    const storage_t* __restrict__ dO,  // (H, n_q, d)
    const float* __restrict__ L,       // (H, n_q) logsumexp of the scaled scores; +inf: the row saw no key
    const float* __restrict__ D,       // (H, n_q) rowsum(dO o O), from the preprocess kernel
    float* __restrict__ dQ_accum,      // (H, n_q, d) zeroed by the preprocess kernel
    storage_t* __restrict__ dK,        // (H, n_kv, d)
    storage_t* __restrict__ dV,        // (H, n_kv, d)
    int n_q, int n_kv, float scale,
    int causal, int diagonal_offset,   // causal: row r sees key c <= r + diagonal_offset
    u64* __restrict__ bytes_moved) {   // INSTRUMENTED: [K, V, Q, dO, L, D read; dQ_accum, dK, dV written]
  using St = Storage<DT>;
  static_assert(B_r % 16 == 0 && B_c % B_r == 0 && d % 16 == 0 && d >= 64, "unsupported tile shape");
  constexpr int THREADS = B_c / 16 * 32;
  constexpr int STRIPS = B_c / B_r;        // warps side by side across the columns of S_ij and dQ_i
  constexpr int NS = B_c / STRIPS / 8;     // 8-column tiles of S_ij (and dP_ij) per warp
  constexpr int NP = NS / 4;               // of which one pass of dP_ij computes
  constexpr int NQ = d / STRIPS / 8;       // 8-column tiles of dQ_i per warp
  constexpr int NQ_PART = NQ < 4 ? NQ : 4;  // of which one pass computes and adds
  constexpr int NKV = d / 8;               // 8-column tiles of dK_j (and dV_j) per warp
  constexpr float LOG2E = 1.4426950408889634f;
  static_assert(NP % 2 == 0 && NS % NP == 0 && NQ % NQ_PART == 0 && NQ_PART % 2 == 0,
                "ldmatrix_x4 feeds two 8-column tiles");

  extern __shared__ __align__(128) unsigned char smem[];
  storage_t* const tiles = reinterpret_cast<storage_t*>(smem);  // dK_j, dV_j staged over K_j, V_j at the end
  const u32 K_s = shared_address(smem);     // (B_c, d)
  const u32 V_s = K_s + 2 * B_c * d;        // (B_c, d)
  const u32 Q_s = V_s + 2 * B_c * d;        // (2, B_r, d) double buffer
  const u32 dO_s = Q_s + 2 * 2 * B_r * d;   // (2, B_r, d) double buffer
  const u32 P_s = dO_s + 2 * 2 * B_r * d;   // (B_r, B_c) P_ij in the storage dtype
  const u32 dS_s = P_s + 2 * B_r * B_c;     // (B_r, B_c) dS_ij in the storage dtype

  const int j = blockIdx.x, h = blockIdx.y;  // causal: the KV tiles with the most query tiles start first
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;  // this thread holds rows g, g + 8 and columns 2t, 2t + 1
  const int warp_m = warp / STRIPS, warp_n = warp % STRIPS;  // rows 16 warp_m.. of S_ij, column strip warp_n
  const int strip = warp_n * NS * 8;  // this warp's first column of S_ij within the tile

  // -- where this lane's ldmatrix rows and stores land: A operands (rows lane & 15, chunk lane >> 4),
  // B operands read by rows (rows (lane & 7) + 8 (lane >> 4), chunk (lane >> 3) & 1), transposed forms
  const int a_row = lane & 15, a_chunk = lane >> 4;
  const int b_row = (lane & 7) + ((lane >> 4) << 3), b_chunk = (lane >> 3) & 1;
  const LaneTile<d> KV_b(strip + b_row, b_chunk);          // K_j, V_j as B of S_ij, dP_ij
  const LaneTile<B_c> PdS_at(b_row, warp * 2 + b_chunk);   // P_ij^T, dS_ij^T as A of dV_j, dK_j
  const LaneTile<d> QdO(a_row, a_chunk);  // Q_i, dO_i: as A of S_ij, dP_ij (rows 16 warp_m..), as B (transposed) of dK_j, dV_j
  const LaneTile<B_c> PdS(warp_m * 16 + a_row, a_chunk);   // P_ij, dS_ij stored (stmatrix), dS_ij as A of dQ_i
  const LaneTile<d> K_bt(a_row, warp_n * NQ + a_chunk);    // K_j as B (transposed) of dQ_i

  const int col_start = j * B_c;
  const int cols = min(B_c, n_kv - col_start);
  // -- the query tiles that see KV tile j: from the one holding the first row whose diagonal reaches it
  const int T_r = (n_q + B_r - 1) / B_r;
  const int first_row = causal ? max(0, col_start - diagonal_offset) : 0;
  const int i_first = first_row < n_q ? first_row / B_r : T_r;

  const storage_t* Q_h = Q + (size_t)h * n_q * d;
  const storage_t* dO_h = dO + (size_t)h * n_q * d;
  const float* L_h = L + (size_t)h * n_q;
  const float* D_h = D + (size_t)h * n_q;
  float* dQ_h = dQ_accum + (size_t)h * n_q * d;
  // INSTRUMENTED: bytes moved per tensor, in the order of bytes_moved
  enum { READ_K, READ_V, READ_Q, READ_dO, READ_L, READ_D, WRITTEN_dQ, WRITTEN_dK, WRITTEN_dV, TENSORS };
  __shared__ u64 counted[INSTRUMENTED ? TENSORS : 1];
  auto count = [&](int tensor, u32 bytes) {
    if constexpr (INSTRUMENTED) atomicAdd(&counted[tensor], (u64)bytes);
  };
  if constexpr (INSTRUMENTED) {
    if (threadIdx.x < TENSORS) counted[threadIdx.x] = 0;
    __syncthreads();
  }

  // -- K_j, V_j and the first Q_i, dO_i; a KV tile no query tile sees loads nothing and writes zeros
  const bool visited = i_first < T_r;
  count(READ_K, load_tile<B_c, d, THREADS>(K_s, K + ((size_t)h * n_kv + col_start) * d, visited ? cols : 0));
  count(READ_V, load_tile<B_c, d, THREADS>(V_s, V + ((size_t)h * n_kv + col_start) * d, visited ? cols : 0));
  if (visited) {
    const int rows = min(B_r, n_q - i_first * B_r);
    count(READ_Q, load_tile<B_r, d, THREADS>(Q_s, Q_h + (size_t)i_first * B_r * d, rows));
    count(READ_dO, load_tile<B_r, d, THREADS>(dO_s, dO_h + (size_t)i_first * B_r * d, rows));
  }
  cp_async_commit();

  float dK_j[NKV][4], dV_j[NKV][4];  // (16, d) per warp: rows 16 warp.. of dK_j, dV_j, fp32
#pragma unroll
  for (int n = 0; n < NKV; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dK_j[n][e] = dV_j[n][e] = 0.f;
  const float scale_log2 = scale * LOG2E;  // exp(scale * x - L) = 2^(scale_log2 * x - L * LOG2E)

  for (int i = i_first; i < T_r; ++i) {
    const int buf = (i - i_first) & 1;
    const u32 Q_i = Q_s + buf * 2 * B_r * d, dO_i = dO_s + buf * 2 * B_r * d;
    const int row_start = i * B_r;
    const int warp_row = row_start + warp_m * 16;  // global row of this warp's first row of S_ij

    // -- L_i and D_i of this thread's two rows; a row past n_q gets L = +inf, so its P_ij is 0
    float L_i[2], D_i[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp_row + g + 8 * r;
      const bool valid = row < n_q;
      L_i[r] = valid ? L_h[row] * LOG2E : SIMFLASH_POS_INF;
      D_i[r] = valid ? D_h[row] : 0.f;
      if (valid && warp_n == 0 && t == 0) count(READ_L, 4), count(READ_D, 4);  // each row counted once
    }

    cp_async_wait<0>();
    __syncthreads();  // Q_i, dO_i have landed; every warp is done with tile i - 1 (its buffers, P_s, dS_s)
    // -- prefetch Q_{i+1}, dO_{i+1} into the other buffer while this tile computes
    if (i + 1 < T_r) {
      const int next = (i + 1) * B_r, nbuf = (buf ^ 1) * 2 * B_r * d;
      count(READ_Q, load_tile<B_r, d, THREADS>(Q_s + nbuf, Q_h + (size_t)next * d, min(B_r, n_q - next)));
      count(READ_dO, load_tile<B_r, d, THREADS>(dO_s + nbuf, dO_h + (size_t)next * d, min(B_r, n_q - next)));
      cp_async_commit();
    }

    // -- S_ij = Q_i K_j^T   (16, B_c / STRIPS) per warp, fp32
    float S_ij[NS][4];
    mma_a_bt<DT>(S_ij, Q_i, warp_m * 16, K_s, QdO, KV_b);

    // -- mask columns past n_kv and (causal) keys in a row's future, then P_ij = exp(S_ij - L_i)
    if (col_start + B_c > n_kv || (causal && col_start + B_c - 1 > row_start + diagonal_offset))
      mask_scores(S_ij, warp_row, col_start + strip, n_kv, causal, diagonal_offset);
    // P_ij = exp(S_ij - L_i) in fp32, in S_ij's registers: dS_ij below takes P_ij before rounding, as FA-2
    // does; P_ij to shared memory in the storage dtype, as the tensor cores take it (16 columns at a time)
#pragma unroll
    for (int n = 0; n < NS; n += 2) {
      u32 P_st[2][2];  // rows g and g + 8 of 8-column tiles n and n + 1, two values a register
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float* const P_ij = S_ij[n + m];
          P_ij[2 * r] = ex2(fmaf(P_ij[2 * r], scale_log2, -L_i[r]));
          P_ij[2 * r + 1] = ex2(fmaf(P_ij[2 * r + 1], scale_log2, -L_i[r]));
          P_st[m][r] = St::pack(P_ij[2 * r], P_ij[2 * r + 1]);
        }
      stmatrix_x4(P_s + PdS.at(0, warp_n * NS + n), P_st[0][0], P_st[0][1], P_st[1][0], P_st[1][1]);
    }
    float (&P_ij)[NS][4] = S_ij;

    // -- dP_ij = dO_i V_j^T   (16, B_c / STRIPS) per warp, fp32, and dS_ij = P_ij o (dP_ij - D_i) from the
    // fp32 P_ij, to shared memory in the storage dtype: NP 8-column tiles of dP_ij at a time, as a whole
    // dP_ij beside P_ij, dK_j and dV_j would spill
#pragma unroll
    for (int n_first = 0; n_first < NS; n_first += NP) {
      float dP_ij[NP][4];
      mma_a_bt<DT>(dP_ij, dO_i, warp_m * 16, V_s, QdO, KV_b, n_first);
#pragma unroll
      for (int n = 0; n < NP; n += 2) {
        u32 dS_ij[4];  // rows g, g + 8 of 8-column tiles n_first + n, + n + 1: the stmatrix layout
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int m = n + (q >> 1), r = q & 1;
          dS_ij[q] = St::pack(P_ij[n_first + m][2 * r] * (dP_ij[m][2 * r] - D_i[r]),
                              P_ij[n_first + m][2 * r + 1] * (dP_ij[m][2 * r + 1] - D_i[r]));
        }
        stmatrix_x4(dS_s + PdS.at(0, warp_n * NS + n_first + n), dS_ij[0], dS_ij[1], dS_ij[2], dS_ij[3]);
      }
    }
    __syncthreads();  // all of P_ij and dS_ij are in shared memory

    // -- dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i   (16, d) per warp: rows 16 warp.. of the KV tile
#pragma unroll
    for (int kk = 0; kk < B_r / 16; ++kk) {
      u32 p[4], ds[4];  // P_ij^T and dS_ij^T rows 16 warp.., columns (query rows) 16kk..: transposed loads
      ldmatrix_x4_trans(p, P_s + PdS_at.at(kk * 16, 0));
      ldmatrix_x4_trans(ds, dS_s + PdS_at.at(kk * 16, 0));
#pragma unroll
      for (int n = 0; n < NKV; n += 2) {
        u32 b[4];  // dO_i (then Q_i) rows 16kk..16kk+15, columns 8n..8n+15, transposed
        ldmatrix_x4_trans(b, dO_i + QdO.at(kk * 16, n));
        St::mma(dV_j[n], p, b[0], b[1]);
        St::mma(dV_j[n + 1], p, b[2], b[3]);
        ldmatrix_x4_trans(b, Q_i + QdO.at(kk * 16, n));
        St::mma(dK_j[n], ds, b[0], b[1]);
        St::mma(dK_j[n + 1], ds, b[2], b[3]);
      }
    }

    // -- dQ_i += scale dS_ij K_j   (16, d / STRIPS) per warp, added atomically into dQ_accum; 32 columns
    // at a time, as registers are scarce next to dK_j and dV_j
#pragma unroll
    for (int n0 = 0; n0 < NQ; n0 += NQ_PART) {
      float dQ_i[NQ_PART][4];
#pragma unroll
      for (int n = 0; n < NQ_PART; ++n) dQ_i[n][0] = dQ_i[n][1] = dQ_i[n][2] = dQ_i[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < B_c / 16; ++kk) {
        u32 a[4];  // dS_ij rows 16 warp_m.., columns 16kk..16kk+15
        ldmatrix_x4(a, dS_s + PdS.at(0, 2 * kk));
#pragma unroll
        for (int n = 0; n < NQ_PART; n += 2) {
          u32 b[4];  // K_j rows 16kk..16kk+15, columns 8(n0 + n)..+15 of this warp's strip, transposed
          ldmatrix_x4_trans(b, K_s + K_bt.at(kk * 16, n0 + n));
          St::mma(dQ_i[n], a, b[0], b[1]);
          St::mma(dQ_i[n + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp_row + g + 8 * r;
        if (row < n_q) {
#pragma unroll
          for (int n = 0; n < NQ_PART; ++n)
            red_add_f32x2(dQ_h + (size_t)row * d + (warp_n * NQ + n0 + n) * 8 + 2 * t, scale * dQ_i[n][2 * r],
                          scale * dQ_i[n][2 * r + 1]);
          count(WRITTEN_dQ, NQ_PART * 8);
        }
      }
    }
  }
  cp_async_wait<0>();  // a KV tile no query tile sees still has its (empty) K_j, V_j copies in flight
  __syncthreads();     // every warp is done with K_j, V_j: stage dK_j, dV_j over them

  // -- dK_j = scale sum_i dS_ij^T Q_i and dV_j in the storage dtype, through shared memory to HBM
#pragma unroll
  for (int n = 0; n < NKV; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + g + r * 8;
      *reinterpret_cast<u32*>(tiles + swizzle<d>(row, n) + 2 * t) =
          St::pack(scale * dK_j[n][2 * r], scale * dK_j[n][2 * r + 1]);
      *reinterpret_cast<u32*>(tiles + B_c * d + swizzle<d>(row, n) + 2 * t) =
          St::pack(dV_j[n][2 * r], dV_j[n][2 * r + 1]);
    }
  __syncthreads();
  count(WRITTEN_dK, store_tile<B_c, d, THREADS>(dK + ((size_t)h * n_kv + col_start) * d, tiles, cols));
  count(WRITTEN_dV, store_tile<B_c, d, THREADS>(dV + ((size_t)h * n_kv + col_start) * d, tiles + B_c * d, cols));

  if constexpr (INSTRUMENTED) {
    __syncthreads();
    if (threadIdx.x < TENSORS) atomicAdd(bytes_moved + threadIdx.x, counted[threadIdx.x]);
  }
}
