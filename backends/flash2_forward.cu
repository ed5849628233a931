// FlashAttention-2 forward (Dao 2023, Algorithm 1) on the tensor cores: the same algorithm, names and
// schedule as simflash/algorithms/flash2.py.
//
// One CTA per (head, query tile i) of B_r rows; B_r / 16 warps, each owning 16 rows of the tile.
// Grouped-query heads: a CTA's head is a query head, reading K/V head h / group; or, packed (pack =
// group), a K/V head whose group's query heads fill the tile's rows (packed row r x pack + h is position
// r of the group's head h), so each K/V tile is read once per tile of packed rows. A packed row keeps
// its position for the causal and window bounds.
//
// KV tiles of B_c rows stream through double-buffered shared memory (cp.async); S_ij and P_ij live in
// registers (mma.sync m16n8k16, ldmatrix): the loop is fold_kv_tiles (flash2_tile.cuh). m_i, l_i and the
// unnormalised a_i stay in fp32; the one division happens after the last KV tile, and a row that saw no
// key outputs 0. Causal and sliding windows: KV tiles no row of the tile sees are skipped (never
// loaded), tiles the diagonal or a window edge cuts are masked; a query tile with no KV tile to visit
// loads nothing and writes zeros.
//
// INSTRUMENTED (compile-time): count the HBM bytes each copy instruction moved per tensor, one atomic
// per query tile per tensor, and record m_i, l_i after every KV tile of one chosen (head, tile). In
// the timed build (INSTRUMENTED = false) all of that is compiled out.
//
// L (optional, nullptr: not written): the logsumexp of each row's scaled scores, m_i + log l_i, for a
// backward pass; +inf for a row that saw no key. Its rows are O's rows: (H_q, n_q), a packed row at its
// (head, position). INSTRUMENTED: counted as a fifth tensor, one atomic per row (a fifth block
// reduction costs the d = 256 build its last registers).
#include "flash2_tile.cuh"

template <int DT, int B_r, int B_c, int D, bool INSTRUMENTED>
__global__ void __launch_bounds__(B_r / 16 * 32, D == 64 ? 2 : 1) flash2_forward(
    const storage_t* __restrict__ Q,  // (H_q, n_q, D)
    const storage_t* __restrict__ K,  // (H_kv, n_kv, D)
    const storage_t* __restrict__ V,  // (H_kv, n_kv, D)
    storage_t* __restrict__ O,        // (H_q, n_q, D)
    int n_q, int n_kv, float scale,
    int pack, int group,              // query heads packed into a tile's rows (1: unpacked); per K/V head
    int diagonal_offset, int left, int right,  // query r sees keys r + off - left .. r + off + right
    u64* __restrict__ bytes_moved,    // INSTRUMENTED: [Q read, K read, V read, O written, L written]
    int trace_head, int trace_tile,   // INSTRUMENTED: the (head, query tile) whose state is recorded
    float* __restrict__ trace_m,      // INSTRUMENTED: (its KV tiles, B_r) m_i after each KV tile
    float* __restrict__ trace_l,      // INSTRUMENTED: (its KV tiles, B_r) l_i after each KV tile
    float* __restrict__ L) {          // (H_q, n_q) logsumexp, or nullptr
  using St = Storage<DT>;
  constexpr int THREADS = B_r / 16 * 32;
  constexpr int NO = D / 8;  // 8-column tiles of a_i per warp

  extern __shared__ __align__(128) unsigned char smem[];
  const u32 Q_s = shared_address(smem);                 // (B_r, D)
  const u32 KV_s = Q_s + 2 * B_r * D;                   // 2 stages of K_j, V_j: (B_c, D) each
  storage_t* O_s = reinterpret_cast<storage_t*>(smem);  // (B_r, D) staging for O_i, over Q_s

  const int i = gridDim.x - 1 - blockIdx.x;  // query tile; the longest causal tiles start first
  const int h = blockIdx.y;                   // query head, or packed K/V head
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;  // this thread holds rows g, g + 8 and columns 2t, 2t + 1

  const int row_start = i * B_r;
  const int rows = min(B_r, n_q * pack - row_start);
  const QueryRows q{n_q, pack, h * pack, row_start};
  const Visibility vis{n_kv, diagonal_offset, left, right};
  // -- the skip bounds: the KV tiles holding a key some row of this tile sees
  const int lo = vis.first_col(q.position(0)), hi = vis.last_col(q.position(rows - 1));
  const int j_begin = lo / B_c, j_end = lo <= hi ? hi / B_c + 1 : j_begin;
  const int h_kv = h * pack / group;
  u64 read_Q = 0, read_K = 0, read_V = 0, written_O = 0;  // INSTRUMENTED counts of this thread

  RowState<D> state;
  if (j_begin < j_end) {
    // -- Q_i, then its KV tiles
    read_Q += load_tile<B_r, D, THREADS>(Q_s, [=](int p) { return Q + q.row(p) * D; }, rows);
    const bool traced = INSTRUMENTED && h == trace_head && i == trace_tile;
    // Q_i's fragments stay in registers at d = 128 only. At d = 64 the kernel is held to 128 registers
    // so that two CTAs share an SM, and Q_i read again from shared memory runs faster than one CTA an SM
    // holding it (benchmarks/gpu/v1_d64_builds); at d = 256 they would crowd a_i out of the registers.
    fold_kv_tiles<DT, B_r, B_c, D, 1, 2, D == 128, INSTRUMENTED>(
        state, Q_s, KV_s, K + (size_t)h_kv * n_kv * D, V + (size_t)h_kv * n_kv * D, j_begin, j_end, vis, q, rows,
        scale, read_K, read_V, traced ? trace_m : nullptr, traced ? trace_l : nullptr);
  }
  __syncthreads();  // O_s is written over Q_s

  // -- normalise once; a row that saw no key outputs 0
  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l_row = state.row_sum(r);
    inv_l[r] = l_row > 0.f ? 1.f / l_row : 0.f;
    const int row = warp * 16 + g + r * 8;
    if (L != nullptr && t == 0 && row < rows) {
      L[q.row(row)] = l_row > 0.f ? state.m_i[r] * scale + logf(l_row) : SIMFLASH_POS_INF;
      if constexpr (INSTRUMENTED) atomicAdd(bytes_moved + 4, 4ull);
    }
  }
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + g + r * 8;
      *reinterpret_cast<u32*>(O_s + swizzle<D>(row, n) + 2 * t) =
          St::pack(state.a_i[n][2 * r] * inv_l[r], state.a_i[n][2 * r + 1] * inv_l[r]);
    }
  __syncthreads();
  // -- O_i to HBM in 16-byte chunks, valid rows only
#pragma unroll
  for (int k = 0; k < B_r * (D / 8) / THREADS; ++k) {  // B_r * D / 8 = 4 * D * THREADS / 32: exact
    const int c = threadIdx.x + k * THREADS;
    const int row = c / (D / 8), ch = c % (D / 8);
    if (row < rows) {
      *reinterpret_cast<uint4*>(O + q.row(row) * D + ch * 8) = *reinterpret_cast<const uint4*>(O_s + swizzle<D>(row, ch));
      written_O += 16;
    }
  }

  if constexpr (INSTRUMENTED) {
    __shared__ u64 scratch[THREADS / 32];
    block_count<THREADS>(bytes_moved + 0, read_Q, scratch);
    block_count<THREADS>(bytes_moved + 1, read_K, scratch);
    block_count<THREADS>(bytes_moved + 2, read_V, scratch);
    block_count<THREADS>(bytes_moved + 3, written_O, scratch);
  }
}
