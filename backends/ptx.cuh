// The few PTX instructions the simflash kernels are built from, and the tile copies between HBM and
// swizzled shared memory they share.
//
// Self-contained (no CUDA headers), so the same text compiles under NVRTC (CuPy RawModule) and nvcc.
// 16-bit storage values travel as raw bits (storage_t); Storage<DT> converts and multiplies them.
#pragma once

typedef unsigned short storage_t;  // one fp16 or bf16 value, as bits
typedef unsigned int u32;
typedef unsigned long long u64;

#define SIMFLASH_NEG_INF (__int_as_float(0xff800000))
#define SIMFLASH_POS_INF (__int_as_float(0x7f800000))

enum StorageType { FLOAT16 = 0, BFLOAT16 = 1 };

template <int DT>
struct Storage;

template <>
struct Storage<FLOAT16> {
  // Two floats rounded to nearest into one 32-bit register: lo in the low half.
  static __device__ __forceinline__ u32 pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  static __device__ __forceinline__ float to_float(storage_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
  }
  static __device__ __forceinline__ storage_t from_float(float f) {
    storage_t x;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f));
    return x;
  }
  // c (16x8, fp32) += a (16x16, row) * b (16x8, col) on the tensor cores.
  static __device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Storage<BFLOAT16> {
  static __device__ __forceinline__ u32 pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
  }
  static __device__ __forceinline__ float to_float(storage_t x) {
    return __uint_as_float(((u32)x) << 16);
  }
  static __device__ __forceinline__ storage_t from_float(float f) {
    storage_t x;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(x) : "f"(f));
    return x;
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// 2^x with the special-function unit; 2^-inf = 0.
static __device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

static __device__ __forceinline__ u32 shared_address(const void* p) {
  u64 a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return (u32)a;
}

// The KV tiles of B_c keys that query rows row_start .. row_start + rows - 1 visit (causal: row r sees
// keys c <= r + diagonal_offset): T_c, up to the last column any of them may see (the skip bound), of
// which the first T_full need no mask (all B_c keys inside n_kv and visible to the first row).
struct KvTiles {
  int T_c, T_full;
};
template <int B_c>
static __device__ __forceinline__ KvTiles kv_tiles_visited(int row_start, int rows, int n_kv, int causal,
                                                           int diagonal_offset) {
  const int last_col = causal ? min(row_start + rows - 1 + diagonal_offset, n_kv - 1) : n_kv - 1;
  const int T_c = last_col >= 0 ? last_col / B_c + 1 : 0;
  int T_full = n_kv / B_c;
  if (causal) T_full = min(T_full, (row_start + diagonal_offset + 1) / B_c);
  return {T_c, max(0, min(T_full, T_c))};
}

// Asynchronous 16-byte copy HBM -> shared memory; src_bytes = 0 reads nothing and writes zeros.
static __device__ __forceinline__ void cp_async_16(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING>
static __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
}

// Four 8x8 16-bit matrices from shared memory; lanes 8k..8k+7 give the row addresses of matrix k.
static __device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
static __device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Element offset of (row, 16-byte chunk ch) in a shared tile of D columns. The chunk index is XORed
// with the row so the 8 rows an ldmatrix reads hit 8 different bank groups.
template <int D>
static __device__ __forceinline__ int swizzle(int row, int ch) {
  return row * D + ((ch ^ (row & 7)) << 3);
}

// Copy ROWS x D values (valid_rows of them real, the rest zero-filled) from HBM into a swizzled shared
// tile; src(row) is where a valid row starts, so the rows need not be contiguous. Returns the bytes this
// thread read from HBM.
template <int ROWS, int D, int THREADS, typename RowStart>
static __device__ __forceinline__ u32 load_tile(u32 dst, RowStart src, int valid_rows) {
  constexpr int CHUNKS = D / 8;
  u32 read_bytes = 0;
#pragma unroll
  for (int k = 0; k < (ROWS * CHUNKS + THREADS - 1) / THREADS; ++k) {
    const int c = threadIdx.x + k * THREADS;
    if (ROWS * CHUNKS % THREADS != 0 && c >= ROWS * CHUNKS) break;
    const int row = c / CHUNKS, ch = c % CHUNKS;
    const bool valid = row < valid_rows;
    cp_async_16(dst + 2 * swizzle<D>(row, ch), valid ? src(row) + ch * 8 : src(0), valid ? 16 : 0);
    read_bytes += valid ? 16 : 0;
  }
  return read_bytes;
}

// load_tile for ROWS contiguous rows of D values from src.
template <int ROWS, int D, int THREADS>
static __device__ __forceinline__ u32 load_tile(u32 dst, const storage_t* src, int valid_rows) {
  return load_tile<ROWS, D, THREADS>(dst, [=](int row) { return src + row * D; }, valid_rows);
}

// The inverse of ldmatrix_x4 (sm_90): lane 4 row + c/2 holds row `row`, columns c, c + 1 of matrix k in
// r[k]; lanes 8k..8k+7 give the row addresses of matrix k.
static __device__ __forceinline__ void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};" ::"r"(addr), "r"(r0), "r"(r1), "r"(r2),
               "r"(r3)
               : "memory");
}

// Copy the first valid_rows rows of a swizzled shared tile of D columns to HBM in 16-byte stores.
// Returns the bytes this thread wrote.
template <int ROWS, int D, int THREADS>
static __device__ __forceinline__ u32 store_tile(storage_t* dst, const storage_t* src, int valid_rows) {
  constexpr int CHUNKS = D / 8;
  u32 written_bytes = 0;
#pragma unroll
  for (int k = 0; k < (ROWS * CHUNKS + THREADS - 1) / THREADS; ++k) {
    const int c = threadIdx.x + k * THREADS;
    if (ROWS * CHUNKS % THREADS != 0 && c >= ROWS * CHUNKS) break;
    const int row = c / CHUNKS, ch = c % CHUNKS;
    if (row < valid_rows) {
      *reinterpret_cast<uint4*>(dst + (size_t)row * D + ch * 8) = *reinterpret_cast<const uint4*>(src + swizzle<D>(row, ch));
      written_bytes += 16;
    }
  }
  return written_bytes;
}

// p[0] += a, p[1] += b in HBM, atomically, nothing returned: one vector reduction (sm_90).
static __device__ __forceinline__ void red_add_f32x2(float* p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
}

// In one warp's (16, 8N) fp32 scores whose first row is row0 and first column col0, set to -inf those of
// keys past n_kv and, causal, of keys in a row's future (col > row + diagonal_offset).
template <int N>
static __device__ __forceinline__ void mask_scores(float (&S)[N][4], int row0, int col0, int n_kv, int causal,
                                                   int diagonal_offset) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;  // rows g, g + 8; columns 2t, 2t + 1
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = col0 + n * 8 + 2 * t + (e & 1);
      const int row = row0 + g + (e >> 1) * 8;
      if (col >= n_kv || (causal && col > row + diagonal_offset)) S[n][e] = SIMFLASH_NEG_INF;
    }
}

// Sum of a per-thread byte count over the block; thread 0 adds it to *total (one atomic per call).
template <int THREADS>
static __device__ __forceinline__ void block_count(u64* total, u64 mine, u64* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, offset);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    u64 sum = 0;
    for (int w = 0; w < THREADS / 32; ++w) sum += scratch[w];
    atomicAdd(total, sum);
  }
}
