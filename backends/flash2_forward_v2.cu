// FlashAttention-2 forward, version 2: version 1's algorithm (flash2_forward.cu, and the simulator's
// simflash/algorithms/flash2.py: same names, same schedule, same byte counts), laid out on the SM the
// way FlashAttention-2 lays out its own forward kernel.
//
// - 32 query rows per warp, B_r / 32 warps (4 at B_r = 128). Each K_j or V_j fragment a warp reads
//   from shared memory feeds the products of two 16-row blocks, so the tile costs half as many
//   shared-memory reads per FLOP as version 1's 16 rows per warp.
// - One K and one V buffer, filled staggered: wait for K_j, start V_j, S_ij = Q_i K_j^T, wait for V_j,
//   start K_{j+1}, softmax, a_i += P_ij V_j. Each copy overlaps the other half of the tile's work, and
//   shared memory is (B_r + 2 B_c) x d x 2 bytes (64 KiB at 128x64, d = 128): two CTAs share an SM,
//   so one CTA's softmax runs while the other's matrix products keep the tensor cores busy.
// - The KV tiles no row needs masked (inside n_kv, and left of the tile's first row's diagonal) run
//   a loop compiled without the mask; the diagonal and ragged tiles follow in a masked loop.
// - A warp holds at most 64 columns of S_ij at d = 128 (128 at d = 64) next to its 32 rows of a_i:
//   wider KV tiles are computed in column slices, each one online-softmax update.
// - A KV tile inside n_kv (all but a ragged last one) is copied with no test per row: its cp.async
//   instructions at constant offsets, without a compare and a select for each row.
//
// INSTRUMENTED (compile-time), as in version 1: count the HBM bytes each copy instruction moved per
// tensor, and record m_i, l_i after every KV tile of one chosen (head, tile); compiled out otherwise.
#include "ptx.cuh"

template <bool B>
struct Masked {
  static constexpr bool value = B;
};

// Element offset of (row, 16-byte chunk ch) in a shared tile of D columns. Rows are padded by one
// chunk, so the 8 rows one ldmatrix reads start in 8 different bank groups, and every address a
// thread uses is its own base plus a constant (an XOR swizzle would cost a register per column).
template <int D>
static __device__ __forceinline__ int padded(int row, int ch) {
  return row * (D + 8) + ch * 8;
}

// Start copying ROWS x D values from HBM into a padded shared tile, rows from valid_rows on
// zero-filled. Thread x copies chunk x % CHUNKS of every (THREADS / CHUNKS)-th row from row
// x / CHUNKS: one source and one destination base per call, the rows at constant offsets from them.
// Returns the bytes this thread read from HBM.
template <int ROWS, int D, int THREADS>
static __device__ __forceinline__ u32 copy_tile(u32 dst, const storage_t* src, int valid_rows) {
  constexpr int CHUNKS = D / 8, ROW_STEP = THREADS / CHUNKS;
  static_assert(THREADS % CHUNKS == 0 && ROWS % ROW_STEP == 0, "copy_tile: threads must tile the rows");
  const int first = threadIdx.x / CHUNKS, ch = threadIdx.x % CHUNKS;
  const int left = valid_rows - first;  // this thread's rows k * ROW_STEP < left are real
  const storage_t* from = src + first * D + ch * 8;
  const u32 to = dst + 2 * padded<D>(first, ch);
  u32 read_bytes = 0;
#pragma unroll
  for (int k = 0; k < ROWS / ROW_STEP; ++k) {
    const bool valid = k * ROW_STEP < left;
    cp_async_16(to + 2 * padded<D>(k * ROW_STEP, 0), valid ? from + k * ROW_STEP * D : src, valid ? 16 : 0);
    read_bytes += valid ? 16 : 0;
  }
  return read_bytes;
}

// copy_tile for a tile whose ROWS rows are all real (every KV tile but a ragged last one): no test per
// row, and every address a constant offset from this thread's first, so the copy is its cp.async
// instructions and little else.
template <int ROWS, int D, int THREADS>
static __device__ __forceinline__ u32 copy_full_tile(u32 dst, const storage_t* src) {
  constexpr int CHUNKS = D / 8, ROW_STEP = THREADS / CHUNKS;
  const int first = threadIdx.x / CHUNKS, ch = threadIdx.x % CHUNKS;
  const storage_t* from = src + first * D + ch * 8;
  const u32 to = dst + 2 * padded<D>(first, ch);
#pragma unroll
  for (int k = 0; k < ROWS / ROW_STEP; ++k) cp_async_16(to + 2 * padded<D>(k * ROW_STEP, 0), from + k * ROW_STEP * D, 16);
  return 16 * (ROWS / ROW_STEP);
}

// A warp's 32 rows of O_i = a_i / l_i (rows warp * 32 ..) to HBM: staged in the padded shared tile O_s
// over the warp's own rows, then copied in 16-byte chunks, valid rows only. O_tile: the tile's first
// row in HBM. Adds the bytes written to `written`.
template <typename St, int D>
static __device__ __forceinline__ void store_rows(storage_t* O_s, storage_t* O_tile, const float (&a_i)[2][D / 8][4],
                                                  const float (&inv_l)[4], int warp, int lane, int rows, u64& written) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp * 32 + mt * 16 + half * 8 + g;
        const float inv = inv_l[2 * mt + half];
        *reinterpret_cast<u32*>(O_s + padded<D>(row, n) + 2 * t) =
            St::pack(a_i[mt][n][2 * half] * inv, a_i[mt][n][2 * half + 1] * inv);
      }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < D / 8; ++k) {  // 32 rows x D / 8 chunks over 32 lanes
    const int c = lane + k * 32;
    const int row = warp * 32 + c / (D / 8), ch = c % (D / 8);
    if (row < rows) {
      *reinterpret_cast<uint4*>(O_tile + (size_t)row * D + ch * 8) = *reinterpret_cast<const uint4*>(O_s + padded<D>(row, ch));
      written += 16;
    }
  }
}

template <int DT, int B_r, int B_c, int D, bool INSTRUMENTED>
__global__ void __launch_bounds__(B_r, 2) flash2_forward_v2(
    const storage_t* __restrict__ Q,  // (H, n_q, D)
    const storage_t* __restrict__ K,  // (H, n_kv, D)
    const storage_t* __restrict__ V,  // (H, n_kv, D)
    storage_t* __restrict__ O,        // (H, n_q, D)
    int n_q, int n_kv, float scale,
    int causal, int diagonal_offset,  // causal: row r sees key c <= r + diagonal_offset
    u64* __restrict__ bytes_moved,    // INSTRUMENTED: [Q read, K read, V read, O written]
    int trace_head, int trace_tile,   // INSTRUMENTED: the (head, query tile) whose state is recorded
    float* __restrict__ trace_m,      // INSTRUMENTED: (T_c, B_r) m_i after each KV tile
    float* __restrict__ trace_l) {    // INSTRUMENTED: (T_c, B_r) l_i after each KV tile
  using St = Storage<DT>;
  static_assert(B_r % 32 == 0 && B_c % 16 == 0 && (D == 64 || D == 128), "unsupported tile shape");
  constexpr int THREADS = B_r;                                   // B_r / 32 warps of 32 rows
  constexpr int SLICE = B_c < 8192 / D ? B_c : 8192 / D;         // columns of S_ij a warp holds at once
  constexpr int SLICES = B_c / SLICE;
  constexpr int NS = SLICE / 8;  // 8-column tiles of S_ij per 16-row block
  constexpr int NO = D / 8;      // 8-column tiles of a_i per 16-row block
  // This warp's rows of Q_i as tensor-core A fragments stay in registers where they fit beside S_ij
  // and a_i (d = 64 with up to 64 columns); otherwise they are reread from shared memory per product.
  constexpr bool Q_IN_REGISTERS = D == 64 && SLICE <= 64;
  constexpr float LOG2E = 1.4426950408889634f;

  extern __shared__ __align__(128) unsigned char smem[];
  const u32 Q_s = shared_address(smem);   // (B_r, D + 8); each warp stages its rows of O_i over its rows
  const u32 K_s = Q_s + 2 * B_r * (D + 8);  // (B_c, D + 8) K_j
  const u32 V_s = K_s + 2 * B_c * (D + 8);  // (B_c, D + 8) V_j
  storage_t* O_s = reinterpret_cast<storage_t*>(smem);

  const int i = gridDim.x - 1 - blockIdx.x;  // query tile; the longest causal tiles start first
  const int h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;  // this thread holds rows g, g + 8 of each 16-row block

  const int row_start = i * B_r;
  const int rows = min(B_r, n_q - row_start);
  const KvTiles visited = kv_tiles_visited<B_c>(row_start, rows, n_kv, causal, diagonal_offset);
  const int T_c = visited.T_c, T_full = visited.T_full;

  const storage_t* Q_h = Q + (size_t)h * n_q * D;
  const storage_t* K_h = K + (size_t)h * n_kv * D;
  const storage_t* V_h = V + (size_t)h * n_kv * D;
  storage_t* O_h = O + (size_t)h * n_q * D;
  u64 read_Q = 0, read_K = 0, read_V = 0, written_O = 0;  // INSTRUMENTED counts of this thread

  // Per thread: rows g and g + 8 of the warp's two 16-row blocks, r = 2 * block + (0 | 1).
  float m_i[4], l_i[4];  // running max of the raw scores; this thread's part of the running sum
  float a_i[2][NO][4];   // (32, D) per warp: unnormalised output
#pragma unroll
  for (int r = 0; r < 4; ++r) m_i[r] = SIMFLASH_NEG_INF, l_i[r] = 0.f;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int n = 0; n < NO; ++n) a_i[mt][n][0] = a_i[mt][n][1] = a_i[mt][n][2] = a_i[mt][n][3] = 0.f;
  u32 Q_frag[Q_IN_REGISTERS ? 2 : 1][Q_IN_REGISTERS ? D / 16 : 1][4];
  const float scale_log2 = scale * LOG2E;  // exp(scale * x) = 2^(scale_log2 * x)
  const int warp_row = row_start + warp * 32;  // global row of this warp's first row

  // Shared addresses of this lane's ldmatrix rows; each fragment is at a constant offset from them.
  const u32 Q_lane = Q_s + 2 * padded<D>(warp * 32 + (lane & 15), lane >> 4);
  const u32 K_lane = K_s + 2 * padded<D>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const u32 V_lane = V_s + 2 * padded<D>(lane & 15, lane >> 4);
  // A fragments of this warp's 16-row block mt of Q_i, columns 16kk..16kk+15.
  auto load_Q = [&](u32(&frag)[4], int mt, int kk) { ldmatrix_x4(frag, Q_lane + 2 * padded<D>(mt * 16, kk * 2)); };

  // Start copying the KV tile of keys col.. into a shared tile; the rows past n_kv are zero-filled.
  auto copy_kv = [&](u32 dst, const storage_t* tensor, int col) -> u32 {
    const storage_t* src = tensor + (size_t)col * D;
    return col + B_c <= n_kv ? copy_full_tile<B_c, D, THREADS>(dst, src) : copy_tile<B_c, D, THREADS>(dst, src, n_kv - col);
  };

  // One KV tile j; MASK is known at compile time, so the unmasked loop carries no masking code.
  auto kv_tile = [&](const int j, auto mask) {
    constexpr bool MASK = decltype(mask)::value;
    const int col0 = j * B_c;
    // -- K_j has landed and every warp is done with V_{j-1}: start V_j
    cp_async_wait<0>();
    __syncthreads();
    read_V += copy_kv(V_s, V_h, col0);
    cp_async_commit();

#pragma unroll
    for (int s = 0; s < SLICES; ++s) {
      // -- S_ij = Q_i K_j^T for this slice of keys   (32, SLICE) per warp, fp32
      float S_ij[2][NS][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int n = 0; n < NS; ++n) S_ij[mt][n][0] = S_ij[mt][n][1] = S_ij[mt][n][2] = S_ij[mt][n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        u32 q[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          if constexpr (Q_IN_REGISTERS) {
#pragma unroll
            for (int e = 0; e < 4; ++e) q[mt][e] = Q_frag[mt][Q_IN_REGISTERS ? kk : 0][e];
          } else {
            load_Q(q[mt], mt, kk);
          }
        }
#pragma unroll
        for (int n = 0; n < NS; n += 2) {
          u32 b[4];  // K_j rows 8n..8n+15 of the slice, columns 16kk..16kk+15
          ldmatrix_x4(b, K_lane + 2 * padded<D>(s * SLICE + n * 8, kk * 2));
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            St::mma(S_ij[mt][n], q[mt], b[0], b[1]);
            St::mma(S_ij[mt][n + 1], q[mt], b[2], b[3]);
          }
        }
      }
      // -- V_j has landed; once every warp is past its last product with K_j, start K_{j+1}
      if (s == 0) {
        cp_async_wait<0>();
        __syncthreads();
      }
      if (s == SLICES - 1 && j + 1 < T_c) {
        if (SLICES > 1) __syncthreads();
        const int col = col0 + B_c;
        read_K += copy_kv(K_s, K_h, col);
        cp_async_commit();
      }

      // -- mask columns past n_kv and (causal) keys in a row's future, before the statistics see them
      if constexpr (MASK) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = warp_row + (r >> 1) * 16 + (r & 1) * 8 + g;
          // the last column row r sees, counted from this thread's first column of the slice
          const int last = (causal ? min(n_kv - 1, row + diagonal_offset) : n_kv - 1) - (col0 + s * SLICE + 2 * t);
#pragma unroll
          for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int c = 0; c < 2; ++c)
              if (n * 8 + c > last) S_ij[r >> 1][n][(r & 1) * 2 + c] = SIMFLASH_NEG_INF;
        }
      }

      // -- update m_i and l_i
      float m_new[4], m_base[4], alpha[4], row_sum[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) m_new[r] = m_i[r], row_sum[r] = 0.f;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int n = 0; n < NS; ++n) {
          m_new[2 * mt] = fmaxf(m_new[2 * mt], fmaxf(S_ij[mt][n][0], S_ij[mt][n][1]));
          m_new[2 * mt + 1] = fmaxf(m_new[2 * mt + 1], fmaxf(S_ij[mt][n][2], S_ij[mt][n][3]));
        }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(0xffffffffu, m_new[r], 1));  // the 4 threads of a row
        m_new[r] = fmaxf(m_new[r], __shfl_xor_sync(0xffffffffu, m_new[r], 2));
        // Only a masked tile can leave a row with no visible key yet (m = -inf): base 0, so 2^-inf = 0.
        m_base[r] = MASK && m_new[r] == SIMFLASH_NEG_INF ? 0.f : m_new[r] * scale_log2;
        alpha[r] = ex2(m_i[r] * scale_log2 - m_base[r]);  // moves the old state onto the new max
        m_i[r] = m_new[r];
      }
      // P_ij = 2^(scale_log2 S_ij - m_base), summed in fp32 and rounded to the storage dtype as the
      // tensor cores take it, in A-fragment order: 16 keys kc of block mt per fragment.
      u32 P_frag[2][SLICE / 16][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int r = 2 * mt + half;
            const float p0 = ex2(fmaf(S_ij[mt][n][2 * half], scale_log2, -m_base[r]));
            const float p1 = ex2(fmaf(S_ij[mt][n][2 * half + 1], scale_log2, -m_base[r]));
            row_sum[r] += p0 + p1;
            P_frag[mt][n / 2][(n & 1) * 2 + half] = St::pack(p0, p1);
          }
#pragma unroll
      for (int r = 0; r < 4; ++r) l_i[r] = alpha[r] * l_i[r] + row_sum[r];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          a_i[mt][n][0] *= alpha[2 * mt];
          a_i[mt][n][1] *= alpha[2 * mt];
          a_i[mt][n][2] *= alpha[2 * mt + 1];
          a_i[mt][n][3] *= alpha[2 * mt + 1];
        }

      // -- a_i += P_ij V_j
#pragma unroll
      for (int kc = 0; kc < SLICE / 16; ++kc)
#pragma unroll
        for (int n = 0; n < NO; n += 2) {
          u32 b[4];  // V_j rows 16kc..16kc+15 of the slice, columns 8n..8n+15, transposed
          ldmatrix_x4_trans(b, V_lane + 2 * padded<D>(s * SLICE + kc * 16, n));
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            St::mma(a_i[mt][n], P_frag[mt][kc], b[0], b[1]);
            St::mma(a_i[mt][n + 1], P_frag[mt][kc], b[2], b[3]);
          }
        }
    }

    if constexpr (INSTRUMENTED) {
      if (h == trace_head && i == trace_tile) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          float l_row = l_i[r] + __shfl_xor_sync(0xffffffffu, l_i[r], 1);
          l_row += __shfl_xor_sync(0xffffffffu, l_row, 2);
          const int row = warp * 32 + (r >> 1) * 16 + (r & 1) * 8 + g;
          if (t == 0 && row < rows) {
            trace_m[j * B_r + row] = m_i[r] * scale;  // the simulator's m: max of the scaled scores
            trace_l[j * B_r + row] = l_row;
          }
        }
      }
    }
  };

  // A tile that visits no KV tile loads nothing; its a_i and l_i stay 0 and it writes zeros.
  if (T_c > 0) {
    // -- Q_i and K_0; V_0 starts inside the first KV tile
    read_Q += copy_tile<B_r, D, THREADS>(Q_s, Q_h + (size_t)row_start * D, rows);
    read_K += copy_tile<B_c, D, THREADS>(K_s, K_h, min(B_c, n_kv));
    cp_async_commit();
    if constexpr (Q_IN_REGISTERS) {
      cp_async_wait<0>();
      __syncthreads();
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) load_Q(Q_frag[mt][Q_IN_REGISTERS ? kk : 0], mt, kk);
    }
    int j = 0;
    for (; j < T_full; ++j) kv_tile(j, Masked<false>{});
    for (; j < T_c; ++j) kv_tile(j, Masked<true>{});
  }

  // -- normalise once; a row that saw no key outputs 0
  float inv_l[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    float l_row = l_i[r] + __shfl_xor_sync(0xffffffffu, l_i[r], 1);
    l_row += __shfl_xor_sync(0xffffffffu, l_row, 2);
    inv_l[r] = l_row > 0.f ? 1.f / l_row : 0.f;
  }
  // Each warp stages its own 32 rows, which only it read as Q_i: no other warp to wait for.
  store_rows<St, D>(O_s, O_h + (size_t)row_start * D, a_i, inv_l, warp, lane, rows, written_O);

  if constexpr (INSTRUMENTED) {
    __shared__ u64 scratch[THREADS / 32];
    block_count<THREADS>(bytes_moved + 0, read_Q, scratch);
    block_count<THREADS>(bytes_moved + 1, read_K, scratch);
    block_count<THREADS>(bytes_moved + 2, read_V, scratch);
    block_count<THREADS>(bytes_moved + 3, written_O, scratch);
  }
}
