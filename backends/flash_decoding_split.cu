// Flash-Decoding, kernel 1 of 2: the split kernel (Dao, Haziza, Massa, Sizov 2023; FlashAttention-2's
// flash_fwd_splitkv_kernel), simflash/algorithms/flash_decoding_split.py on the tensor cores.
//
// A decode step brings a few query rows per head against a long KV cache: FA-2's grid (query tiles x
// heads) would leave most SMs idle while each CTA streams a whole cache. CTA (i, s, z) = blockIdx
// (.x, .y, .z), FA-2's split-KV grid, runs FA-2's loop (fold_kv_tiles, flash2_tile.cuh) for query tile
// i of batch-head z over split s's run of KV tiles only: tiles [s T, (s + 1) T), T = ceil(T_c /
// num_splits) from the allocated n_kv, cut to the tiles the tile's rows see among batch element b's
// cache_seqlens[b] valid keys. Keys at or past cache_seqlens[b] are never loaded. Causal and window are
// aligned to the bottom right of those keys: query position r is key position cache_seqlens[b] - n_q + r.
//
// Several splits: the CTA writes its output normalised by its own sum and its logsumexp, both float32,
// for flash_decoding_combine.cu: O_s = a_s / l_s, LSE_s = m_s + log l_s (0 and -inf for a row that saw
// no key here; a split with no tile reads nothing, not even Q_i, and writes those). One split: O itself.
// Rows of O and of the partials are query rows in (batch, query head, position) order, packed or not.
//
// Query tiles of B_r = 64 (packed) rows and 4 warps, as FA-2's split kernel. A decode tile has few
// rows: one of at most 16 (32) puts all 4 warps on its one (two) row groups, each taking a quarter (a
// half) of every KV tile's keys (SLICES), merged at the end. STAGES KV tiles stream through shared
// memory, two ahead of the one computed: reading K and V at full bandwidth is the kernel's whole job.
// With B_c x D = 8192 (64-row tiles at d = 128), Q_i and the stages take 112 KiB: two CTAs an SM.
//
// INSTRUMENTED (compile-time): count the HBM bytes each load and store moved per tensor, one atomic per
// CTA per tensor.
#include "flash2_tile.cuh"

template <int DT, int B_c, int D, int SLICES, bool INSTRUMENTED>
__global__ void __launch_bounds__(128, 2) flash_decoding_split(  // two CTAs an SM
    const storage_t* __restrict__ Q,        // (batch x H_q, n_q, D)
    const storage_t* __restrict__ K,        // (batch x H_kv, n_kv, D), n_kv rows allocated
    const storage_t* __restrict__ V,        // (batch x H_kv, n_kv, D)
    storage_t* __restrict__ O,              // (batch x H_q x n_q, D): with one split
    float* __restrict__ O_partial,          // (num_splits, batch x H_q x n_q, D): with several
    float* __restrict__ LSE_partial,        // (num_splits, batch x H_q x n_q)
    const int* __restrict__ cache_seqlens,  // (batch,) valid K/V rows of each batch element; null: all n_kv
    int n_q, int n_kv, float scale,
    int heads, int pack, int group,         // CTA heads per batch element; query heads packed per row; per K/V head
    int tiles_per_split, int left, int right,  // query r sees keys r + off - left .. r + off + right
    u64* __restrict__ bytes_moved) {        // INSTRUMENTED: [Q, K, V read; O, O_partial, LSE_partial written]
  using St = Storage<DT>;
  constexpr int B_r = 64, THREADS = 128, STAGES = 3;
  constexpr int NO = D / 8;  // 8-column tiles of a_i per warp

  extern __shared__ __align__(128) unsigned char smem[];
  const u32 Q_s = shared_address(smem);  // (B_r, D)
  const u32 KV_s = Q_s + 2 * B_r * D;    // STAGES stages of K_j, V_j: (B_c, D) each

  const int i = blockIdx.x, s = blockIdx.y, z = blockIdx.z;  // query tile, split, batch x CTA head
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;  // this thread holds rows g, g + 8 and columns 2t, 2t + 1
  const bool partial = gridDim.y > 1;     // FA-2's Split: partials for the combine, or the final O
  const size_t out_rows = (size_t)gridDim.z * n_q * pack;  // rows of O and of each split's partials

  const int seqlen = cache_seqlens != nullptr ? cache_seqlens[z / heads] : n_kv;  // null: no load to wait for
  const int row_start = i * B_r;
  const int rows = min(B_r, n_q * pack - row_start);
  const QueryRows q{n_q, pack, z * pack, row_start};
  const Visibility vis{seqlen, seqlen - n_q, left, right};
  // -- this tile's run of KV tiles (its rows' keys, within the cache's length), cut to split s
  const int lo = vis.first_col(q.position(0)), hi = vis.last_col(q.position(rows - 1));
  const int j_begin = max(lo / B_c, s * tiles_per_split);
  const int j_end = lo <= hi ? min(hi / B_c + 1, (s + 1) * tiles_per_split) : j_begin;
  const int h_kv = z * pack / group;
  u64 read_Q = 0, read_K = 0, read_V = 0, written_O = 0, written_O_s = 0, written_LSE_s = 0;

  if (j_begin >= j_end) {
    // -- nothing to visit in this split: O_s = 0 and LSE_s = -inf give it no weight in the combine
    if (partial) {
      for (int c = threadIdx.x; c < rows * (D / 4); c += THREADS) {
        const size_t row = s * out_rows + q.row(c / (D / 4));
        *reinterpret_cast<float4*>(O_partial + row * D + c % (D / 4) * 4) = float4{0.f, 0.f, 0.f, 0.f};
        written_O_s += 16;
      }
      for (int p = threadIdx.x; p < rows; p += THREADS) {
        LSE_partial[s * out_rows + q.row(p)] = SIMFLASH_NEG_INF;
        written_LSE_s += 4;
      }
    } else {
      for (int c = threadIdx.x; c < rows * (D / 8); c += THREADS) {
        *reinterpret_cast<uint4*>(O + q.row(c / (D / 8)) * D + c % (D / 8) * 8) = uint4{0, 0, 0, 0};
        written_O += 16;
      }
    }
  } else {
    // -- Q_i, then the split's KV tiles; warps sharing a row group then merge their slices of the keys
    read_Q += load_tile<B_r, D, THREADS>(Q_s, [=](int p) { return Q + q.row(p) * D; }, rows);
    RowState<D> state;
    // Q_i is reread from shared memory for every KV tile: the registers go to the third stage's copies
    // and the slice merge, and the loop waits on HBM, not on those reads
    fold_kv_tiles<DT, B_r, B_c, D, SLICES, STAGES, false, false>(
        state, Q_s, KV_s, K + (size_t)h_kv * n_kv * D, V + (size_t)h_kv * n_kv * D, j_begin, j_end, vis, q, rows,
        scale, read_K, read_V, nullptr, nullptr);
    if constexpr (SLICES > 1) merge_slices<D, SLICES, THREADS>(state, reinterpret_cast<float*>(smem + 2 * B_r * D), scale);

    // -- normalise by the split's own sum; a row that saw no key in this split outputs 0
    const int row0 = warp / SLICES * 16;
    if (warp % SLICES == 0 && row0 < rows) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float l_row = state.row_sum(r);
        const float inv_l = l_row > 0.f ? 1.f / l_row : 0.f;
        const int p = row0 + g + r * 8;
        if (p < rows && partial) {
          float* O_row = O_partial + (s * out_rows + q.row(p)) * D;
#pragma unroll
          for (int n = 0; n < NO; ++n)
            *reinterpret_cast<float2*>(O_row + n * 8 + 2 * t) =
                float2{state.a_i[n][2 * r] * inv_l, state.a_i[n][2 * r + 1] * inv_l};
          written_O_s += NO * 8;
          // -- the split's logsumexp, for the combine's weights
          if (t == 0) {
            LSE_partial[s * out_rows + q.row(p)] = l_row > 0.f ? state.m_i[r] * scale + logf(l_row) : SIMFLASH_NEG_INF;
            written_LSE_s += 4;
          }
        } else if (p < rows) {
          storage_t* O_row = O + q.row(p) * D;
#pragma unroll
          for (int n = 0; n < NO; ++n)
            *reinterpret_cast<u32*>(O_row + n * 8 + 2 * t) =
                St::pack(state.a_i[n][2 * r] * inv_l, state.a_i[n][2 * r + 1] * inv_l);
          written_O += NO * 4;
        }
      }
    }
  }

  if constexpr (INSTRUMENTED) {
    __shared__ u64 scratch[THREADS / 32];
    block_count<THREADS>(bytes_moved + 0, read_Q, scratch);
    block_count<THREADS>(bytes_moved + 1, read_K, scratch);
    block_count<THREADS>(bytes_moved + 2, read_V, scratch);
    block_count<THREADS>(bytes_moved + 3, written_O, scratch);
    block_count<THREADS>(bytes_moved + 4, written_O_s, scratch);
    block_count<THREADS>(bytes_moved + 5, written_LSE_s, scratch);
  }
}
