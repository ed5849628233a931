// FlashAttention forward, version 3: the algorithm of versions 1 and 2 (simflash/algorithms/flash2.py:
// same names, same schedule, same byte counts) laid out on a Hopper SM the way FlashAttention-3 lays
// out its forward kernel.
//
// - Three warpgroups. Warpgroup 0 is the producer: one thread issues the tensor memory accelerator's
//   (TMA) bulk copies of Q_i and of every K_j, V_j into shared memory, KV_STAGES buffers deep, each
//   copy completing on an mbarrier; it hands most of its registers to the consumers (setmaxnreg).
//   Warpgroups 1 and 2 are the consumers, 64 query rows of the 128-row tile each.
// - The products are warpgroup MMAs (wgmma) reading Q_i, K_j and V_j straight from shared memory in
//   the 128-byte swizzled layout the TMA writes; P_ij goes from the softmax's registers into the P V
//   product without touching shared memory. A consumer frees a K or V buffer (an mbarrier arrival)
//   once its product has read it.
// - Inside a consumer, S_ij = Q_i K_j^T is issued together with a_i += P_i,j-1 V_j-1, so the softmax
//   of tile j overlaps the P V product of tile j - 1.
// - PINGPONG: the two consumers take turns at the tensor cores (two named barriers): one issues its
//   products while the other runs its softmax.
// - The KV tiles no row needs masked run a loop compiled without the mask, as in version 2.
// - O_i is normalised in registers, staged in Q_i's shared memory (each consumer over its own rows)
//   and written by a TMA store, which writes only the rows inside n_q.
//
// INSTRUMENTED (compile-time), as in versions 1 and 2: count the HBM bytes of every copy per tensor
// (rows inside the tensor; the TMA reads none outside it) and record m_i, l_i after every KV tile of
// one chosen (head, tile).
#include "hopper.cuh"

template <bool B>
struct Flag {
  static constexpr bool value = B;
};

constexpr int V3_BLOCK_Q = 128;     // B_r: two consumer warpgroups of 64 rows
constexpr int V3_THREADS = 384;     // producer, consumer, consumer
constexpr int V3_KV_STAGES = 2;     // K_j and V_j buffers in flight
constexpr int V3_PRODUCER_REGS = 24;
constexpr int V3_CONSUMER_REGS = 240;
constexpr int V3_BOX = 64;          // columns per TMA box: 128 bytes, the swizzle's row
constexpr int V3_TURN_BARRIER = 1;  // named barriers 1, 2: whose turn at the tensor cores
constexpr int V3_STORE_BARRIER = 3; // named barriers 3, 4: a consumer's O_i staged

// The tensor maps, in the order the host writes them (128 bytes each).
enum V3Map { MAP_Q = 0, MAP_K = 1, MAP_V = 2, MAP_O = 3 };

template <int DT, int B_c, int D, bool PINGPONG, bool INSTRUMENTED>
__global__ void __launch_bounds__(V3_THREADS, 1) flash2_forward_v3(
    const unsigned char* __restrict__ maps,  // 4 CUtensorMaps of (H, n, D) tensors: Q, K, V, O
    int n_q, int n_kv, float scale,
    int causal, int diagonal_offset,  // causal: row r sees key c <= r + diagonal_offset
    u64* __restrict__ bytes_moved,    // INSTRUMENTED: [Q read, K read, V read, O written]
    int trace_head, int trace_tile,   // INSTRUMENTED: the (head, query tile) whose state is recorded
    float* __restrict__ trace_m,      // INSTRUMENTED: (T_c, B_r) m_i after each KV tile
    float* __restrict__ trace_l) {    // INSTRUMENTED: (T_c, B_r) l_i after each KV tile
  using St = Storage<DT>;
  constexpr int B_r = V3_BLOCK_Q, STAGES = V3_KV_STAGES;
  static_assert((B_c == 64 || B_c == 128) && (D == 64 || D == 128), "unsupported tile shape");
  constexpr u32 Q_BYTES = B_r * D * 2, KV_BYTES = B_c * D * 2;
  constexpr int BOXES = D / V3_BOX;  // a tile of R rows is BOXES boxes of R x 64 values, R x 128 bytes
  constexpr float LOG2E = 1.4426950408889634f;

  extern __shared__ unsigned char smem[];
  __shared__ __align__(8) u64 barriers[1 + 4 * STAGES];
  const u32 base = (shared_address(smem) + 1023) & ~1023u;  // swizzle atoms start on 1024 bytes
  const u32 Q_s = base;
  auto K_s = [&](int s) { return base + Q_BYTES + s * KV_BYTES; };
  auto V_s = [&](int s) { return base + Q_BYTES + (STAGES + s) * KV_BYTES; };
  const u32 bars = shared_address(barriers);
  const u32 Q_full = bars;
  auto K_full = [&](int s) { return bars + 8 * (1 + s); };
  auto V_full = [&](int s) { return bars + 8 * (1 + STAGES + s); };
  auto K_empty = [&](int s) { return bars + 8 * (1 + 2 * STAGES + s); };
  auto V_empty = [&](int s) { return bars + 8 * (1 + 3 * STAGES + s); };
  auto map = [&](V3Map m) { return maps + 128 * m; };

  const int i = gridDim.x - 1 - blockIdx.x;  // query tile; the longest causal tiles start first
  const int h = blockIdx.y;
  const int row_start = i * B_r;
  const int rows = min(B_r, n_q - row_start);
  const KvTiles visited = kv_tiles_visited<B_c>(row_start, rows, n_kv, causal, diagonal_offset);
  const int T_c = visited.T_c, T_full = visited.T_full;

  if (threadIdx.x == 0) {
    mbarrier_init(Q_full, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(K_full(s), 1);  // the producer's arrival; the copy's bytes complete the phase
      mbarrier_init(V_full(s), 1);
      mbarrier_init(K_empty(s), 8);  // one arrival per consumer warp
      mbarrier_init(V_empty(s), 8);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    // ================= producer =================
    registers_release<V3_PRODUCER_REGS>();
    if (threadIdx.x == 0 && T_c > 0) {
      tensormap_acquire(map(MAP_Q));
      tensormap_acquire(map(MAP_K));
      tensormap_acquire(map(MAP_V));
      mbarrier_expect_bytes(Q_full, Q_BYTES);
#pragma unroll
      for (int b = 0; b < BOXES; ++b) tma_load_3d(Q_s + b * B_r * 128, map(MAP_Q), b * V3_BOX, row_start, h, Q_full);
      u64 read_K = 0, read_V = 0;
      for (int j = 0; j < T_c; ++j) {
        const int s = j % STAGES;
        const u32 parity = ((j / STAGES) & 1) ^ 1;  // the buffer's previous use has been released
        const int valid = min(B_c, n_kv - j * B_c);
        mbarrier_wait(K_empty(s), parity);
        mbarrier_expect_bytes(K_full(s), KV_BYTES);
#pragma unroll
        for (int b = 0; b < BOXES; ++b) tma_load_3d(K_s(s) + b * B_c * 128, map(MAP_K), b * V3_BOX, j * B_c, h, K_full(s));
        mbarrier_wait(V_empty(s), parity);
        mbarrier_expect_bytes(V_full(s), KV_BYTES);
#pragma unroll
        for (int b = 0; b < BOXES; ++b) tma_load_3d(V_s(s) + b * B_c * 128, map(MAP_V), b * V3_BOX, j * B_c, h, V_full(s));
        read_K += (u64)valid * D * 2;
        read_V += (u64)valid * D * 2;
      }
      if constexpr (INSTRUMENTED) {
        atomicAdd(bytes_moved + 0, (u64)rows * D * 2);
        atomicAdd(bytes_moved + 1, read_K);
        atomicAdd(bytes_moved + 2, read_V);
      }
    }
    return;
  }

  // ================= consumers =================
  registers_claim<V3_CONSUMER_REGS>();
  const int c = threadIdx.x / 128 - 1;  // consumer 0 or 1: rows 64c .. 64c + 63 of the tile
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;  // this thread holds rows g, g + 8 of its warp's 16
  const int my_row = c * 64 + warp * 16 + g;  // row (in the tile) of this thread's first row
  const int turn = V3_TURN_BARRIER + c, other_turn = V3_TURN_BARRIER + 1 - c;

  float m_i[2], l_i[2];  // running max of the raw scores; this thread's part of the running sum
  float a_i[D / 2];      // (64, D) per warpgroup: unnormalised output, wgmma's accumulator layout
  float S_ij[B_c / 2];   // (64, B_c) scores, then P_ij in fp32
  u32 P_ij[B_c / 16][4];  // P_ij rounded to the storage dtype, A fragments of 16 keys each
#pragma unroll
  for (int r = 0; r < 2; ++r) m_i[r] = SIMFLASH_NEG_INF, l_i[r] = 0.f;
#pragma unroll
  for (int k = 0; k < D / 2; ++k) a_i[k] = 0.f;
  const float scale_log2 = scale * LOG2E;  // exp(scale * x) = 2^(scale_log2 * x)

  // Issue S_ij = Q_i K_j^T from buffer s: D / 16 products of 16 columns; inside a 64-column box the
  // next 16 columns start 32 bytes on (the hardware applies the swizzle to the address it forms).
  auto issue_qk = [&](int s) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const u32 box = kk / 4, within = (kk % 4) * 32;
      const u64 q = smem_descriptor(Q_s + box * B_r * 128 + c * 64 * 128 + within, 16, 1024);
      const u64 k = smem_descriptor(K_s(s) + box * B_c * 128 + within, 16, 1024);
      wgmma_ss<DT, B_c>(S_ij, q, k, kk > 0);
    }
    wgmma_commit();
  };
  // Issue a_i += P_ij V_j from buffer s: B_c / 16 products of 16 keys (2048 bytes of V_j each); V_j
  // is MN-major for this product, its next 64 columns one box (B_c x 128 bytes) on.
  auto issue_pv = [&](int s) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < B_c / 16; ++kk)
      wgmma_rs<DT, D>(a_i, P_ij[kk], smem_descriptor(V_s(s) + kk * 2048, B_c * 128, 1024), 1);
    wgmma_commit();
  };

  // One KV tile j: S_ij (and, after the first, the P V product of tile j - 1), then the softmax of
  // tile j. FIRST and MASK are known at compile time, so every call has a fixed number of products in
  // flight (the compiler then lets them run asynchronously) and the unmasked loop carries no mask.
  auto kv_tile = [&](const int j, auto first, auto mask) {
    constexpr bool FIRST = decltype(first)::value, MASK = decltype(mask)::value;
    const int s = j % STAGES, prev = (j + STAGES - 1) % STAGES;
    mbarrier_wait(K_full(s), (j / STAGES) & 1);
    if constexpr (PINGPONG) named_sync(turn, 256);
    issue_qk(s);
    if constexpr (!FIRST) {
      mbarrier_wait(V_full(prev), ((j - 1) / STAGES) & 1);
      issue_pv(prev);
    }
    if constexpr (PINGPONG) named_arrive(other_turn, 256);
    wgmma_wait<FIRST ? 0 : 1>();  // S_ij is done; the P V product may still run
    fence_registers(S_ij);
    if (lane == 0) mbarrier_arrive(K_empty(s));

    // -- mask columns past n_kv and (causal) keys in a row's future, before the statistics see them
    const int col0 = j * B_c;
    if constexpr (MASK) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row_start + my_row + 8 * half;
        // the last column this row sees, counted from this thread's first column of the tile
        const int last = (causal ? min(n_kv - 1, row + diagonal_offset) : n_kv - 1) - (col0 + 2 * t);
#pragma unroll
        for (int n = 0; n < B_c / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (n * 8 + e > last) S_ij[4 * n + 2 * half + e] = SIMFLASH_NEG_INF;
      }
    }

    // -- update m_i, and P_ij = 2^(scale_log2 S_ij - m_base) in place, summed in fp32
    float m_base[2], alpha[2], row_sum[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float m_new = m_i[half];
#pragma unroll
      for (int n = 0; n < B_c / 8; ++n)
        m_new = fmaxf(m_new, fmaxf(S_ij[4 * n + 2 * half], S_ij[4 * n + 2 * half + 1]));
      m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));  // the 4 threads of a row
      m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 2));
      // Only a masked tile can leave a row with no visible key yet (m = -inf): base 0, so 2^-inf = 0.
      m_base[half] = MASK && m_new == SIMFLASH_NEG_INF ? 0.f : m_new * scale_log2;
      alpha[half] = ex2(m_i[half] * scale_log2 - m_base[half]);  // moves the old state onto the new max
      m_i[half] = m_new;
      row_sum[half] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < B_c / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e >> 1;
        S_ij[4 * n + e] = ex2(fmaf(S_ij[4 * n + e], scale_log2, -m_base[half]));
        row_sum[half] += S_ij[4 * n + e];
      }
#pragma unroll
    for (int half = 0; half < 2; ++half) l_i[half] = alpha[half] * l_i[half] + row_sum[half];

    // -- the P V product of tile j - 1 is done: free V_j-1, move a_i onto the new max, round P_ij
    if constexpr (!FIRST) {
      wgmma_wait<0>();
      fence_registers(a_i);
      if (lane == 0) mbarrier_arrive(V_empty(prev));
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) a_i[4 * n + e] *= alpha[e >> 1];
#pragma unroll
    for (int kk = 0; kk < B_c / 16; ++kk) {
      P_ij[kk][0] = St::pack(S_ij[8 * kk + 0], S_ij[8 * kk + 1]);  // row g, keys 16kk + 2t, + 1
      P_ij[kk][1] = St::pack(S_ij[8 * kk + 2], S_ij[8 * kk + 3]);  // row g + 8
      P_ij[kk][2] = St::pack(S_ij[8 * kk + 4], S_ij[8 * kk + 5]);  // row g, keys 16kk + 8 + 2t, + 1
      P_ij[kk][3] = St::pack(S_ij[8 * kk + 6], S_ij[8 * kk + 7]);  // row g + 8
    }

    if constexpr (INSTRUMENTED) {
      if (h == trace_head && i == trace_tile) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float l_row = l_i[half] + __shfl_xor_sync(0xffffffffu, l_i[half], 1);
          l_row += __shfl_xor_sync(0xffffffffu, l_row, 2);
          const int row = my_row + 8 * half;
          if (t == 0 && row < rows) {
            trace_m[j * B_r + row] = m_i[half] * scale;  // the simulator's m: max of the scaled scores
            trace_l[j * B_r + row] = l_row;
          }
        }
      }
    }
  };

  // A tile that visits no KV tile loads nothing; its a_i and l_i stay 0 and it writes zeros.
  if (T_c > 0) {
    mbarrier_wait(Q_full, 0);
    if (PINGPONG && c == 1) named_arrive(V3_TURN_BARRIER, 256);  // consumer 0 goes first
    if (T_full > 0) {
      kv_tile(0, Flag<true>{}, Flag<false>{});
    } else {
      kv_tile(0, Flag<true>{}, Flag<true>{});
    }
    int j = 1;
    for (; j < T_full; ++j) kv_tile(j, Flag<false>{}, Flag<false>{});
    for (; j < T_c; ++j) kv_tile(j, Flag<false>{}, Flag<true>{});
    // -- the last P V product
    const int s = (T_c - 1) % STAGES;
    mbarrier_wait(V_full(s), ((T_c - 1) / STAGES) & 1);
    if constexpr (PINGPONG) named_sync(turn, 256);
    issue_pv(s);
    if (PINGPONG && c == 0) named_arrive(other_turn, 256);  // consumer 1 takes no further turn after this
    wgmma_wait<0>();
    fence_registers(a_i);
  }

  // -- normalise once (a row that saw no key outputs 0) and stage this consumer's rows of O_i over
  // its rows of Q_i, in the TMA's swizzled layout: 16-byte chunk k of row r at chunk k ^ (r % 8)
  float inv_l[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l_row = l_i[half] + __shfl_xor_sync(0xffffffffu, l_i[half], 1);
    l_row += __shfl_xor_sync(0xffffffffu, l_row, 2);
    inv_l[half] = l_row > 0.f ? 1.f / l_row : 0.f;
  }
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = my_row + 8 * half;
      const u32 at = Q_s + (n / 8) * B_r * 128 + row * 128 + (((n % 8) ^ (row % 8)) << 4) + 4 * t;
      const u32 value = St::pack(a_i[4 * n + 2 * half] * inv_l[half], a_i[4 * n + 2 * half + 1] * inv_l[half]);
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(value) : "memory");
    }
  fence_async_shared();
  named_sync(V3_STORE_BARRIER + c, 128);
  const int valid = min(64, rows - c * 64);  // this consumer's rows inside n_q
  if (tid == 0 && valid > 0) {
    tensormap_acquire(map(MAP_O));
#pragma unroll
    for (int b = 0; b < BOXES; ++b)
      tma_store_3d(map(MAP_O), b * V3_BOX, row_start + c * 64, h, Q_s + b * B_r * 128 + c * 64 * 128);
    tma_store_commit_and_wait();
    if constexpr (INSTRUMENTED) atomicAdd(bytes_moved + 3, (u64)valid * D * 2);
  }
}
