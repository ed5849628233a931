// FlashAttention-2's loop over KV tiles on the tensor cores, shared by the kernels that run it:
// flash2_forward.cu (a query tile against all the KV tiles it visits) and flash_decoding_split.cu (a
// query tile against one split's run of them). simflash/algorithms/flash2.py's fold_kv_tiles, same names.
//
// A CTA holds a query tile of B_r rows in B_r / 16 warps' worth of 16-row groups. Warps that share a
// row group (SLICES of them) each take B_c / SLICES columns of every KV tile and keep their own m_i,
// l_i, a_i; merge_slices folds them together at the end. SLICES = 1 is FA-2 (a warp per 16 rows);
// SLICES > 1 lets all warps work when the tile has only B_r / SLICES rows, as a decode step's has.
#pragma once
#include "ptx.cuh"

// Keys query position pos sees: c in [pos + off - left, pos + off + right] and c < n_kv. A side with no
// bound comes as 1 << 30: past any sequence, and far from overflowing pos + off +- it.
struct Visibility {
  int n_kv, off, left, right;
  __device__ __forceinline__ int first_col(int pos) const { return max(0, pos + off - left); }
  __device__ __forceinline__ int last_col(int pos) const { return min(n_kv - 1, pos + off + right); }
  __device__ __forceinline__ bool sees(int pos, int col) const {
    return col < n_kv && col >= pos + off - left && col <= pos + off + right;
  }
};

// Row p of a CTA's query tile: packed row row_start + p holds position (row_start + p) / pack of query
// head head0 + (row_start + p) % pack (FA-3's PackGQA, position-major); unpacked, pack = 1.
struct QueryRows {
  int n_q, pack, head0, row_start;
  __device__ __forceinline__ int position(int p) const { return (row_start + p) / pack; }
  // Its row in the (query heads x n_q) rows of Q and O.
  __device__ __forceinline__ size_t row(int p) const {
    return (size_t)(head0 + (row_start + p) % pack) * n_q + (row_start + p) / pack;
  }
};

// Rows [first, first + valid_rows) of a (rows, D) tensor in HBM, first < its rows: load_tile for
// contiguous rows, with the addressing hoisted out of the copies. A thread copies the same 16-byte chunk
// of every STEP-th row; STEP is a multiple of 8, so the swizzle of its chunk is the same on every pass.
template <int ROWS, int D, int THREADS>
static __device__ __forceinline__ u32 load_rows(u32 dst, const storage_t* src, int first, int valid_rows) {
  constexpr int CHUNKS = D / 8, STEP = THREADS / CHUNKS;
  static_assert(THREADS % CHUNKS == 0 && STEP % 8 == 0 && ROWS % STEP == 0, "unsupported tile shape");
  const int row = threadIdx.x / CHUNKS, ch = threadIdx.x % CHUNKS;
  const storage_t* tile = src + (size_t)first * D;
  const storage_t* from = tile + row * D + ch * 8;
  const u32 to = dst + 2 * swizzle<D>(row, ch);
  u32 read_bytes = 0;
#pragma unroll
  for (int k = 0; k < ROWS / STEP; ++k) {
    if (row + k * STEP < valid_rows) {
      cp_async_16(to + 2 * k * STEP * D, from + k * STEP * D, 16);
      read_bytes += 16;
    } else {
      cp_async_16(to + 2 * k * STEP * D, tile, 0);  // zero-fill: nothing is read
    }
  }
  return read_bytes;
}

// One thread's share of a warp's 16 rows: rows g and g + 8 (g = lane / 4), columns 8n + 2t, 8n + 2t + 1.
template <int D>
struct RowState {
  float m_i[2];          // running row max of the raw scores Q K^T (the same in a row's 4 threads)
  float l_i[2];          // this thread's part of the running row sum
  float a_i[D / 8][4];   // unnormalised output

  __device__ __forceinline__ RowState() {
    m_i[0] = m_i[1] = SIMFLASH_NEG_INF;
    l_i[0] = l_i[1] = 0.f;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) a_i[n][0] = a_i[n][1] = a_i[n][2] = a_i[n][3] = 0.f;
  }

  // The whole row sum of row r (the 4 threads of a row add their parts).
  __device__ __forceinline__ float row_sum(int r) const {
    float l = l_i[r] + __shfl_xor_sync(0xffffffffu, l_i[r], 1);
    return l + __shfl_xor_sync(0xffffffffu, l, 2);
  }
};

// A row with no visible key yet keeps m = -inf: exponentials are then taken against 0, so 2^-inf = 0, not NaN.
static __device__ __forceinline__ float exp_base(float m, float scale_log2) {
  return m == SIMFLASH_NEG_INF ? 0.f : m * scale_log2;
}

// Shared memory of the loop: STAGES buffers, each K_j then V_j, B_c x D values apiece.
template <int B_c, int D>
static __device__ __forceinline__ u32 K_stage(u32 KV_s, int stage) { return KV_s + stage * 2 * (2 * B_c * D); }
template <int B_c, int D>
static __device__ __forceinline__ u32 V_stage(u32 KV_s, int stage) { return K_stage<B_c, D>(KV_s, stage) + 2 * B_c * D; }

// FA-2's inner loop: fold KV tiles [j_begin, j_end) of K_h, V_h into this warp's RowState. Q_i is in
// shared memory at Q_s, its copies issued and not yet committed (the first group takes them). K and V
// tiles stream through STAGES shared buffers with cp.async, STAGES - 1 tiles ahead of the one computed.
// Q_IN_REGISTERS: each warp keeps its rows of Q_i as tensor-core A fragments in registers across KV
// tiles; otherwise it rereads them from shared memory for every KV tile (as FlashAttention-2 does for
// its large head dims), leaving the registers to the rest. TRACED (SLICES = 1): m_i (as the max of the
// scaled scores) and l_i after every KV tile into trace_m, trace_l (T_c, B_r). Every thread calls it;
// it ends with every warp done with the buffers.
template <int DT, int B_r, int B_c, int D, int SLICES, int STAGES, bool Q_IN_REGISTERS, bool TRACED>
static __device__ __forceinline__ void fold_kv_tiles(RowState<D>& state, u32 Q_s, u32 KV_s, const storage_t* K_h,
                                                     const storage_t* V_h, int j_begin, int j_end,
                                                     const Visibility& vis, const QueryRows& q, int rows,
                                                     float scale, u64& read_K, u64& read_V, float* trace_m,
                                                     float* trace_l) {
  using St = Storage<DT>;
  constexpr int THREADS = B_r / 16 * 32;
  constexpr int B_w = B_c / SLICES;          // KV columns per warp
  constexpr int B_s = B_w < 64 ? B_w : 64;  // of those, columns per online-softmax step
  constexpr int NS = B_s / 8;               // 8-column tiles of S_ij per warp
  constexpr int NO = D / 8;          // 8-column tiles of a_i per warp
  constexpr float LOG2E = 1.4426950408889634f;
  static_assert(B_r % 16 == 0 && B_w % B_s == 0 && B_s % 16 == 0 && D % 16 == 0 && STAGES >= 2, "unsupported tile shape");
  static_assert(SLICES == 1 || !TRACED, "the trace records one warp's state per row");

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = warp / SLICES * 16;      // this warp's first row in the tile
  const int col_w = warp % SLICES * B_w;    // and its first column in every KV tile
  const bool active = row0 < rows;          // a warp past the tile's last row has nothing to compute
  const float scale_log2 = scale * LOG2E;  // exp(scale * x) = 2^(scale_log2 * x)
  const int first_pos = q.position(0), last_pos = q.position(rows - 1);
  const int pos[2] = {q.position(row0 + g), q.position(row0 + g + 8)};  // positions of this thread's rows
  u32 Q_frag[Q_IN_REGISTERS ? D / 16 : 1][4];

  auto load_kv = [&](int j) {  // K_j, V_j (valid rows only) into stage (j - j_begin) % STAGES
    const int col = j * B_c, stage = (j - j_begin) % STAGES;
    read_K += load_rows<B_c, D, THREADS>(K_stage<B_c, D>(KV_s, stage), K_h, col, min(B_c, vis.n_kv - col));
    read_V += load_rows<B_c, D, THREADS>(V_stage<B_c, D>(KV_s, stage), V_h, col, min(B_c, vis.n_kv - col));
  };
  // -- the first STAGES - 1 tiles, a commit group each (Q_i's copies join the first)
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (j_begin + s < j_end) load_kv(j_begin + s);
    cp_async_commit();
  }

  for (int j = j_begin; j < j_end; ++j) {
    const int stage = (j - j_begin) % STAGES;
    const u32 K_j = K_stage<B_c, D>(KV_s, stage), V_j = V_stage<B_c, D>(KV_s, stage);
    // -- prefetch STAGES - 1 tiles ahead, into the buffers tile j - 1 left (every warp is done with them)
    if (j + STAGES - 1 < j_end) load_kv(j + STAGES - 1);
    cp_async_commit();
    cp_async_wait<STAGES - 1>();  // tile j has landed
    __syncthreads();
    if (Q_IN_REGISTERS && j == j_begin) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(Q_frag[Q_IN_REGISTERS ? kk : 0], Q_s + 2 * swizzle<D>(row0 + (lane & 15), kk * 2 + (lane >> 4)));
    }

    // A warp's columns go through the online softmax B_s at a time, so S_ij never holds more than 16 x 64
    // scores in registers (the update is the same whether a tile's keys come in one step or several).
    if (active) {
#pragma unroll
      for (int step = 0; step < B_w / B_s; ++step) {
        const int c_s = col_w + step * B_s;  // this step's first column in the tile
        // -- S_ij = Q_i K_j^T   (16, B_s) per warp, fp32
        float S_ij[NS][4];
#pragma unroll
        for (int n = 0; n < NS; ++n) S_ij[n][0] = S_ij[n][1] = S_ij[n][2] = S_ij[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const int qk = Q_IN_REGISTERS ? kk : 0;
          if (!Q_IN_REGISTERS)
            ldmatrix_x4(Q_frag[0], Q_s + 2 * swizzle<D>(row0 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
          for (int n = 0; n < NS; n += 2) {
            u32 b[4];  // K_j rows c_s + 8n .. + 15, columns 16kk .. 16kk + 15
            ldmatrix_x4(b, K_j + 2 * swizzle<D>(c_s + n * 8 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
            St::mma(S_ij[n], Q_frag[qk], b[0], b[1]);
            St::mma(S_ij[n + 1], Q_frag[qk], b[2], b[3]);
          }
        }

        // -- mask keys a row may not see (past n_kv, outside its window) before the statistics see them;
        // a tile wholly visible to the tile's first and last positions needs none
        const int col0 = j * B_c;
        if (col0 + B_c > vis.n_kv || col0 + B_c - 1 > vis.last_col(first_pos) || col0 < last_pos + vis.off - vis.left) {
#pragma unroll
          for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (!vis.sees(pos[e >> 1], col0 + c_s + n * 8 + 2 * t + (e & 1))) S_ij[n][e] = SIMFLASH_NEG_INF;
        }

        // -- update m_i and l_i
        float m_new[2] = {state.m_i[0], state.m_i[1]};
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
          m_base[r] = exp_base(m_new[r], scale_log2);
          alpha[r] = ex2(state.m_i[r] * scale_log2 - m_base[r]);  // moves the old state onto the new max
          state.m_i[r] = m_new[r];
        }
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            S_ij[n][e] = ex2(fmaf(S_ij[n][e], scale_log2, -m_base[e >> 1]));  // now P_ij
            row_sum[e >> 1] += S_ij[n][e];
          }
#pragma unroll
        for (int r = 0; r < 2; ++r) state.l_i[r] = alpha[r] * state.l_i[r] + row_sum[r];
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          state.a_i[n][0] *= alpha[0];
          state.a_i[n][1] *= alpha[0];
          state.a_i[n][2] *= alpha[1];
          state.a_i[n][3] *= alpha[1];
        }

        // -- a_i += P_ij V_j   (P_ij rounded to the storage dtype, as the tensor cores take it)
#pragma unroll
        for (int kc = 0; kc < B_s / 16; ++kc) {
          const u32 P_frag[4] = {St::pack(S_ij[2 * kc][0], S_ij[2 * kc][1]), St::pack(S_ij[2 * kc][2], S_ij[2 * kc][3]),
                                 St::pack(S_ij[2 * kc + 1][0], S_ij[2 * kc + 1][1]),
                                 St::pack(S_ij[2 * kc + 1][2], S_ij[2 * kc + 1][3])};
#pragma unroll
          for (int n = 0; n < NO; n += 2) {
            u32 b[4];  // V_j rows c_s + 16kc .. + 15, columns 8n .. 8n + 15, transposed
            ldmatrix_x4_trans(b, V_j + 2 * swizzle<D>(c_s + kc * 16 + (lane & 15), n + (lane >> 4)));
            St::mma(state.a_i[n], P_frag, b[0], b[1]);
            St::mma(state.a_i[n + 1], P_frag, b[2], b[3]);
          }
        }
      }
    }

    if constexpr (TRACED) {
      if (trace_m != nullptr) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float l_row = state.row_sum(r);
          const int row = row0 + g + r * 8;
          if (t == 0 && row < rows) {
            trace_m[(j - j_begin) * B_r + row] = state.m_i[r] * scale;  // the simulator's m: max of the scaled scores
            trace_l[(j - j_begin) * B_r + row] = l_row;
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();  // the empty groups past the last tile
}

// Fold the SLICES column slices of each row group into the state of its slice-0 warp, through shared
// memory at `scratch` (free: the KV buffers once fold_kv_tiles is done). Lane by lane: warps of one row
// group hold the same (row, column) elements of a_i in the same lane. Every thread calls it.
template <int D, int SLICES, int THREADS>
static __device__ __forceinline__ void merge_slices(RowState<D>& state, float* scratch, float scale) {
  constexpr int NO = D / 8, ITEMS = 4 + 4 * NO;  // m_i, l_i, a_i of one thread
  constexpr float LOG2E = 1.4426950408889634f;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, slice = warp % SLICES;
  // slot of warp (row group, slice > 0); item k of lane at [(slot * ITEMS + k) * 32 + lane]: no bank conflicts
  auto at = [&](int slot, int k) -> float& { return scratch[(slot * ITEMS + k) * 32 + lane]; };
  if (slice > 0) {
    const int slot = warp / SLICES * (SLICES - 1) + slice - 1;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      at(slot, r) = state.m_i[r];
      at(slot, 2 + r) = state.l_i[r];
    }
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) at(slot, 4 + 4 * n + e) = state.a_i[n][e];
  }
  __syncthreads();
  if (slice == 0) {
    const float scale_log2 = scale * LOG2E;
#pragma unroll
    for (int other = 1; other < SLICES; ++other) {
      const int slot = warp / SLICES * (SLICES - 1) + other - 1;
      float alpha[2], beta[2];  // this state's and the other slice's factors onto the common max
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_other = at(slot, r), m_new = fmaxf(state.m_i[r], m_other);
        const float base = exp_base(m_new, scale_log2);
        alpha[r] = ex2(state.m_i[r] * scale_log2 - base);
        beta[r] = ex2(m_other * scale_log2 - base);
        state.l_i[r] = alpha[r] * state.l_i[r] + beta[r] * at(slot, 2 + r);
        state.m_i[r] = m_new;
      }
#pragma unroll
      for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          state.a_i[n][e] = alpha[e >> 1] * state.a_i[n][e] + beta[e >> 1] * at(slot, 4 + 4 * n + e);
    }
  }
}
