// Causal GQA attention forward on Hopper: wgmma + TMA, warp-specialised (FlashAttention-3's
// algorithm, written for this engine; attention_sm90.cuh).
//
// Forward: persistent, one CTA an SM taking query tiles (BR = 128 rows of one (head, sequence)),
// heaviest first within supergroups of kv heads (fwd_tile_order), from an atomic counter; 3
// warpgroups. Warpgroup 0 is the producer: one thread issues the TMA copies (each tile's Q into one
// of two buffers, then its K and V tiles from the diagonal down to tile 0) into rings of K and V
// stages, each with its own full / empty mbarriers; the other 127 threads give their registers back
// (setmaxnreg) and leave. Warpgroups 1 and 2 are the consumers, 64 query rows each: S = Q K^T by
// wgmma from shared memory, online softmax in registers (exp2 domain, O rescaled lazily), O += P V
// by wgmma with P as the register operand. Inside a consumer: the QK^T of tile j+1 and the PV of
// tile j are in flight while the softmax of tile j+1 runs; a K stage is freed after its QK^T, a V
// stage after its PV. Between the consumers: ping-pong (each issues its matrix products after the
// other's), continued across tiles.
// Backward: a block per key tile (below). Shared memory: 128-byte-swizzled 64-column boxes, the
// layout TMA writes and wgmma reads.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "backend/cuda/attention_mask.cuh"
#include "backend/cuda/attention_sm90.cuh"
#include "backend/cuda/kernel_utils.cuh"
#include "core/error.h"

namespace sf::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The traits (Sm90FwdTile, Sm90BwdTile below) define each kernel's tile shape and shared-memory
// layout once. Each operand tile is CH boxes of [rows][64] bf16 (128-byte rows, swizzled in
// 1024-byte atoms of 8 rows); every box starts 1024-aligned. BOUNDED: the mask kind, fixed at
// compile time. false: plain causal (no first-key bound, nothing of packed rows or windows in the
// code); true: each query also has a first key (packed rows, sliding window; attention_mask.cuh).
// The plain causal path pays nothing for the generality.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SF_SM90_DEVICE 1
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

#ifdef SF_SM90_DEVICE
// The dynamic shared memory, 1024-aligned: 128-byte swizzle atoms are 1024 bytes, and the tiles
// offsets (multiples of 1024) keep every box on an atom (the Tr::smem sizes include the slack).
// The pointer is smem_raw plus an offset (not an integer cast back): the compiler then knows it
// addresses shared memory and uses 32-bit shared loads and stores, where the cast made every
// access through it a generic one (64-bit address arithmetic, ~10 instructions a tile-column in
// the backward; session 23's SASS).
__device__ __forceinline__ unsigned char* smem_base() {
  extern __shared__ unsigned char smem_raw[];
  return smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
}
// The warpgroup of this thread, known warp-uniform to the compiler (a broadcast from lane 0): the
// wgmma descriptors built from it stay in uniform registers.
__device__ __forceinline__ int warpgroup_uniform() { return __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0); }

// ---- mbarrier and TMA ------------------------------------------------------------------------
__device__ __forceinline__ void bar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
  } while (!done);
}
// One [rows][64] box at (col, row, batch) of a 3-D tensor map into shared memory; completes on bar.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int col, int row, int b) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(b), "r"(smem_u32(bar))
      : "memory");
}

// dQ by TMA reduce-add (Sm90BwdTile's TMA_DQ): one [rows][32] f32 box of shared memory added into
// the global tensor at (col, row, batch), rows past T clipped; completes in the issuing thread's
// bulk group (committed by bulk_commit, waited for by bulk_wait_read / bulk_wait_all).
__device__ __forceinline__ void tma_reduce_add(const CUtensorMap* map, const void* src, int col, int row, int b) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_u32(src)), "r"(col), "r"(row), "r"(b)
      : "memory");
}
// One [rows][64] box of shared memory stored at (col, row, batch) of a 3-D tensor map, rows past T
// clipped; completes in the issuing thread's bulk group (as tma_reduce_add).
__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int col, int row, int b) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(col), "r"(row), "r"(b)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// The shared memory of this thread's committed reduces has been read (it may be written again).
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// This thread's committed reduces are complete in global memory.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// ---- wgmma -------------------------------------------------------------------------------------
// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte
// offsets (K-major: LBO unused, SBO = 1024 between 8-row groups; MN-major (V): LBO = the next
// 64-column box, SBO = 1024 between groups of 8 rows of K).
__device__ __forceinline__ uint64_t sdesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}
// Descriptor d with its start address moved by `bytes` (a multiple of 16): one add to the low word.
// The start field is the low 14 bits of addr >> 4 and shared addresses stay below 2^18, so the add
// never carries out of it. Built once from a base (sdesc) and moved by constants, a descriptor costs
// an add where sdesc costs ~6 instructions: ~8 an operand pair of every wgmma before (session 23).
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t bytes) {
  return (d & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(d) + (bytes >> 4));
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of async-MMA registers across a wait.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

// The wgmma variants differ only in N (the accumulator holds N / 2 floats a thread), so their
// operand lists and register names are generated once: SF_WG_ACC<n>(d) = "+f"(d[0]) .. "+f"(d[n - 1]),
// SF_WG_REGS<n> = "%0, .. %<n - 1>"; the operands after the accumulator are numbered from n.
#define SF_WG_ACC4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define SF_WG_ACC16_AT(d, i) SF_WG_ACC4(d, i), SF_WG_ACC4(d, i + 4), SF_WG_ACC4(d, i + 8), SF_WG_ACC4(d, i + 12)
#define SF_WG_ACC16(d) SF_WG_ACC16_AT(d, 0)
#define SF_WG_ACC32(d) SF_WG_ACC16_AT(d, 0), SF_WG_ACC16_AT(d, 16)
#define SF_WG_ACC64(d) SF_WG_ACC32(d), SF_WG_ACC16_AT(d, 32), SF_WG_ACC16_AT(d, 48)
#define SF_WG_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define SF_WG_REGS32 SF_WG_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SF_WG_REGS64                                                                                            \
  SF_WG_REGS32                                                                                                  \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SF_WG_STR(x) #x
#define SF_WG_OP(i) "%" SF_WG_STR(i)

// D[64 x N] (+)= A[64 x 16] B[16 x N], both from shared memory (acc = 0: D = A B): TA 0: A
// K-major, 1: M-major; TB 0: B K-major, 1: N-major. One overload per N; A, B, acc, TA, TB are
// operands F .. F + 4.
#define SF_WGMMA_SS(N, F, FB, FACC, FTA, FTB)                                                                         \
  template <int TA, int TB>                                                                                           \
  __device__ __forceinline__ void wgmma_ss(float(&d)[N / 2], uint64_t da, uint64_t db, int acc) {                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SF_WG_OP(FACC) ", 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" SF_WG_REGS##F "}, " SF_WG_OP(F) ", "     \
                 SF_WG_OP(FB) ", p, 1, 1, " SF_WG_OP(FTA) ", " SF_WG_OP(FTB) ";\n}\n"                                \
                 : SF_WG_ACC##F(d)                                                                                   \
                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB)); \
  }
SF_WGMMA_SS(128, 64, 65, 66, 67, 68)
SF_WGMMA_SS(64, 32, 33, 34, 35, 36)
SF_WGMMA_SS(32, 16, 17, 18, 19, 20)

// D[64 x N] += A[64 x 16] B[16 x N]: A in registers (the m16n8k16 A fragment of each warp's 16
// rows, operands F .. F + 3), B N-major in shared memory (operand F + 4).
template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db);

#define SF_WGMMA_RS(N, F, F1, F2, F3, FB)                                                                            \
  template <>                                                                                                        \
  __device__ __forceinline__ void wgmma_rs<N>(float(&d)[N / 2], const uint32_t(&a)[4], uint64_t db) {                \
    asm volatile(                                                                                                    \
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                                   \
        "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" SF_WG_REGS##F "}, {" SF_WG_OP(F) ", " SF_WG_OP( \
            F1) ", " SF_WG_OP(F2) ", " SF_WG_OP(F3) "}, " SF_WG_OP(FB) ", p, 1, 1, 1;\n}\n"                          \
        : SF_WG_ACC##F(d)                                                                                            \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                                      \
  }
SF_WGMMA_RS(64, 32, 33, 34, 35, 36)
SF_WGMMA_RS(128, 64, 65, 66, 67, 68)

#endif  // SF_SM90_DEVICE

// The softmaxes' first half: where `causal`, keys after the row set to -inf, and where (BOUNDED)
// `first`, keys before the row's first key; mx = the rows' running max m raised by this thread's
// elements (not yet quad-reduced). Two passes, so that a diagonal tile whose rows all start at or
// before its first key (packed rows: a tile inside one record) does the plain kernel's work.
template <int BC, bool BOUNDED>
__device__ __forceinline__ void mask_rowmax(float (&s)[BC / 2], float (&mx)[2], const float (&m)[2], bool causal,
                                            bool first, int key0, int row0, const int (&fk)[2]) {
  if (causal) {
#pragma unroll
    for (int j = 0; j < BC / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (key0 + j * 8 + (e & 1) > row0 + (e >> 1) * 8) s[j * 4 + e] = -INFINITY;
  }
  if (BOUNDED && first) {
#pragma unroll
    for (int j = 0; j < BC / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (key0 + j * 8 + (e & 1) < fk[e >> 1]) s[j * 4 + e] = -INFINITY;
  }
  mx[0] = m[0], mx[1] = m[1];
#pragma unroll
  for (int j = 0; j < BC / 8; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[j * 4], s[j * 4 + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[j * 4 + 2], s[j * 4 + 3]));
  }
}

// Online softmax of one S tile (64 x BC a warpgroup; this thread: rows row0 and row0 + 8, columns
// key0 + 8 j + {0, 1}, key0 = the tile's first key + 2 t4): where `causal`, keys after the row, and
// where (BOUNDED) `first`, keys before its first key fk (packed rows, window) are -inf; P left in s as fp32 (packed to
// bf16 by pack_p only once the previous PV is done, so one P buffer suffices: 32 registers fewer
// than two, which the lazy rescale needs) and the running max lazy: a row keeps its max until a tile raises it by more
// than kLazyRescaleLog2 in the exp2 domain (meanwhile P <= 2^8: in range for bf16 and the fp32 sums; l and O share the
// stale max, so O / l and lse are unchanged), corr = 1 then. Returns whether a row of the warp
// moved its max (the warp-uniform test for rescaling O).
constexpr float kLazyRescaleLog2 = 8.f;
template <int BC, bool BOUNDED>
__device__ __forceinline__ bool softmax_tile_lazy(float (&s)[BC / 2], float (&m)[2], float (&l)[2], float (&corr)[2],
                                                  bool causal, bool first, int key0, int row0, const int (&fk)[2],
                                                  float scale_log2) {
  float mx[2];
  mask_rowmax<BC, BOUNDED>(s, mx, m, causal, first, key0, row0, fk);
  float off[2];
  bool grew = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    // m = -inf the first time: +inf > the threshold; a row with no key yet (both -inf): NaN, false
    const bool g = (mx[r] - m[r]) * scale_log2 > kLazyRescaleLog2;
    corr[r] = g ? fast_exp2((m[r] - mx[r]) * scale_log2) : 1.f;  // m = -inf: 0
    if (g) m[r] = mx[r];
    off[r] = m[r] == -INFINITY ? 0.f : m[r] * scale_log2;  // a row with no key yet: P = 0
    grew |= g;
  }
  float rs[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < BC / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j * 4 + e] = fast_exp2(fmaf(s[j * 4 + e], scale_log2, -off[e >> 1]));
    rs[0] += s[j * 4] + s[j * 4 + 1];
    rs[1] += s[j * 4 + 2] + s[j * 4 + 3];
  }
  l[0] = l[0] * corr[0] + rs[0];  // thread-partial row sums; quad-reduced at the end
  l[1] = l[1] * corr[1] + rs[1];
  return __any_sync(0xffffffffu, grew);
}
// P (fp32, the C fragments of S) as the bf16 A fragments of P V: two n8 C fragments (columns
// 16 kk .. 16 kk + 15) form the A fragment of k-step kk.
template <int BC>
__device__ __forceinline__ void pack_p(const float (&s)[BC / 2], uint32_t (&p)[BC / 16][4]) {
#pragma unroll
  for (int j = 0; j < BC / 8; ++j) {
    p[j >> 1][(j & 1) * 2] = pack_bf16(s[j * 4], s[j * 4 + 1]);
    p[j >> 1][(j & 1) * 2 + 1] = pack_bf16(s[j * 4 + 2], s[j * 4 + 3]);
  }
}

// The forwards' epilogue: the row sums l of this thread's rows row0 and row0 + 8 of head h,
// sequence b completed over the quad, their inverses, and lse = m scale + ln l (rows past T not
// written)...
__device__ __forceinline__ void softmax_finish(const float (&m)[2], const float (&l)[2], float (&inv)[2],
                                               float* __restrict__ lse, int b, int h, int row0, int col0, int T, int H,
                                               float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lr = l[r];
    lr += __shfl_xor_sync(0xffffffffu, lr, 1);
    lr += __shfl_xor_sync(0xffffffffu, lr, 2);
    inv[r] = lr > 0.f ? 1.f / lr : 0.f;
    const int row = row0 + r * 8;
    if (lse != nullptr && col0 == 0 && row < T)
      lse[(int64_t(b) * H + h) * T + row] = (m[r] * scale_log2 + log2f(lr)) * kLn2;
  }
}
// ... and O / l (bf16) of those rows, columns col0 + 8 dn + {0, 1}, by 4-byte stores (hd 256; hd 64
// and 128 through shared memory: Sm90FwdTile::TMA_O).
template <int HD>
__device__ __forceinline__ void store_o_lse(const float (&o)[HD / 2], const float (&m)[2], const float (&l)[2],
                                            bf16_t* __restrict__ out, float* __restrict__ lse, int b, int h, int row0,
                                            int col0, int T, int H, float scale_log2) {
  const int64_t qstr = int64_t(H) * HD;
  float inv[2];
  softmax_finish(m, l, inv, lse, b, h, row0, col0, T, H, scale_log2);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + r * 8;
    if (row >= T) continue;
    bf16_t* orow = out + (int64_t(b) * T + row) * qstr + int64_t(h) * HD + col0;
#pragma unroll
    for (int dn = 0; dn < HD / 8; ++dn)
      *reinterpret_cast<uint32_t*>(orow + dn * 8) =
          pack_bf16(o[dn * 4 + 2 * r] * inv[r], o[dn * 4 + 2 * r + 1] * inv[r]);
  }
}

// ---- forward ------------------------------------------------------------------------------------
// Why persistent, with K and V released apart and O rescaled lazily: what it changed against the
// block-a-tile forward it replaced (session 11: hd 128 0.78 -> 0.58 ms, hd 64 0.50 -> 0.37 ms at
// B 8, T 2048; docs/PERFORMANCE.md), by the count (hd 128, B 8, T 2048: 34816 tiles
// of 128 x 128, 264 an SM; the tensor cores need 2048 cycles a tile, the softmax ~600 a
// warpgroup, hidden by the ping-pong; measured 0.737 ms = ~4750 cycles a tile at ~1.7 GHz):
// - K and V stages freed separately. Before, one `empty` barrier frees a stage once its PV is done,
//   and the PV of tile j runs with the QK^T of tile j + 1, so with 2 stages the load of tile j + 2
//   starts only when tile j + 1's products end, just when tile j + 2's QK^T wants it: every tile
//   waits for a TMA round trip (~1000-2000 cycles), about the gap measured. Here K stage frees
//   after its QK^T, V after its PV, and V has 3 stages (hd 64: 4 and 4): loads start a tile or
//   more ahead.
// - Persistent: one CTA an SM takes query tiles, heaviest first (session 21: within supergroups of
//   kv heads, fwd_tile_order), from an atomic counter (the
//   order and greed of the hardware's block scheduler); the producer loads the next tile's Q
//   (double-buffered) and first K/V while the consumers finish this one, and each consumer's
//   epilogue runs under the other's products (the ping-pong continues across tiles). A block a
//   tile paid the Q and K latency, the lone first QK^T and softmax and the last PV and epilogue
//   at every tile (8.5 key tiles on average at T 2048).
// - The O rescale skipped while no row's max grew by more than 2^8 (softmax_tile_lazy): at hd
//   128, 64 of ~350 instructions a thread a tile.
// hd 256: key tiles of 64 (a consumer's O is 128 fp32 registers a thread, S 32, P 16) and one Q
// buffer (64 KiB; the next tile's Q lands once both consumers' last QK^T is done, under the last
// PV and the epilogue): 64 + 2 K + 3 V stages of 32 KiB = 224 KiB. Its PV is two n128 products
// (the two 128-column halves of O), one instruction shape with hd 128's.
template <int HD_, bool BOUNDED_>
struct Sm90FwdTile {
  static constexpr int HD = HD_, BR = 128, BC = HD == 256 ? 64 : 128;
  // Stages of K and of V, each with its own full / empty barriers: a K stage is free once both
  // consumers' QK^T read it, a V stage once their PV did (a tile after: PV lags QK^T by one), so
  // the load of tile j + KSTAGES starts under tile j + 1's products, not after them. hd 128: 2 K +
  // 3 V + 2 Q buffers = 224 KiB (the most that fits); hd 64: 4 of each, 160 KiB.
  static constexpr int KSTAGES = HD == 64 ? 4 : 2, VSTAGES = HD == 64 ? 4 : 3;
  static constexpr int QSTAGES = HD == 256 ? 1 : 2;  // Q buffers: (2) the next tile's lands under this one
  static constexpr bool BOUNDED = BOUNDED_;
  static constexpr int CONSUMERS = 2;
  // Query tiles in supergroups of kv heads (fwd_tile_order; hd 64 and 128). hd 256 keeps longest
  // first over the whole grid: in supergroups (2 MiB of K and V a group: 128 tiles a supergroup at
  // B 8, T 2048, 8/4 heads, fewer than the SMs) 0.291-0.297 ms against 0.276-0.289 (session 21).
  static constexpr bool L2_ORDER = HD_ <= 128;
  // setmaxnreg, a thread: the consumers' increase is granted from what the producer gives back
  // out of the block's launch allocation (ptxas: 168 a thread at NT 384), never more; asking for
  // more waits forever.
  // The bounded hd 64 kernel: 40 / 232 (ptxas: 4 bytes spilled at 24 / 240, its producer holding
  // a tile's record starts across its wait; none at 40 / 232; its consumers need fewer than 232).
  static constexpr int PRODUCER_REGS = HD == 64 && BOUNDED_ ? 40 : 24, CONSUMER_REGS = HD == 64 && BOUNDED_ ? 232 : 240;
  static constexpr int NT = 128 * (1 + CONSUMERS);
  static constexpr int CH = HD / 64;
  static constexpr uint32_t q_bytes = BR * HD * 2, kv_bytes = BC * HD * 2;
  // Q [QSTAGES][CH][BR][64] | K [KSTAGES][CH][BC][64] | V [VSTAGES][CH][BC][64] | barriers | tile ids
  static constexpr size_t q_off = 0, k_off = q_off + size_t(QSTAGES) * q_bytes;
  static constexpr size_t v_off = k_off + size_t(KSTAGES) * kv_bytes, bar_off = v_off + size_t(VSTAGES) * kv_bytes;
  // barriers (8 bytes each): q_full[QSTAGES], q_empty[QSTAGES], k_full[KSTAGES], k_empty[KSTAGES],
  // v_full[VSTAGES], v_empty[VSTAGES]
  static constexpr size_t tile_off = bar_off + 8 * (2 * QSTAGES + 2 * KSTAGES + 2 * VSTAGES);
  // tile ids, [QSTAGES][TILE_INTS]: the tile (-1 = no more) and (BOUNDED) the record starts of its
  // first and last rows, loaded by the producer (its latency under its wait for the Q buffer)
  static constexpr int TILE_INTS = BOUNDED ? 3 : 1;
  // arrivals that complete a Q buffer's `full` barrier (with the copy's bytes): the producer's with
  // the byte count, before the copy, and (BOUNDED) one after it, once the tile ids are stored
  static constexpr int Q_ARRIVALS = BOUNDED ? 2 : 1;
  // O through shared memory (hd 64 / 128): each consumer writes its 64 rows of O, in bf16, over its
  // rows of the tile's Q buffer (the same boxes) and one thread stores them by TMA: whole 128-byte
  // rows, where each thread's 4-byte stores wrote 16 bytes of a row at a time. The Q buffer is then
  // released after the store has read it, not after the last QK^T: one arrival a consumer, made
  // under the next tile's first QK^T (its thread waiting for the store's read there, not before
  // the issue: packed hd 64 / 128 forwards 2-5 % faster, session 25). Needs QSTAGES 2: the
  // producer's next wait is for the buffer of the tile before.
  // hd 256 (one Q buffer, the next tile's Q landing under this one's last PV) stores directly.
  static constexpr bool TMA_O = HD <= 128;
  static constexpr int Q_EMPTY_ARRIVALS = TMA_O ? CONSUMERS : CONSUMERS * 4;
  static constexpr size_t smem = tile_off + 4 * TILE_INTS * QSTAGES + 1024;  // + alignment slack
  static_assert(HD % 64 == 0 && BR == 64 * CONSUMERS, "tile shape");
  static_assert(!TMA_O || QSTAGES >= 2, "a Q buffer released under the next tile's first QK^T needs another");
  static_assert(smem <= 227 * 1024, "shared memory");
  static_assert(PRODUCER_REGS + CONSUMERS * CONSUMER_REGS <= (1 + CONSUMERS) * (65536 / NT / 8 * 8), "registers");
};

// The forward's order of query tiles: supergroups of consecutive (sequence, kv head) groups whose
// K and V take about kSuperGroupBytes, and within a supergroup the longest tiles first. The tiles
// in flight then read the K and V of a few groups, which stay in L2 (50 MiB), while the end of
// the persistent grid is still short tiles. Longest first over the whole grid (before session 21)
// kept ~33-66 groups in flight: L2 hit rate 67 % against cuDNN's 87 % (ncu, hd 128, B 8, T 2048,
// 32/8 heads), DRAM traffic 2.3x its; in supergroups 88.5 % and 0.95x its traffic, the forward
// 0.543-0.562 ms against 0.597-0.608 (four rounds alternated, session 21).
constexpr int64_t kSuperGroupBytes = 8 << 20;
// The backward's supergroups: Q, dO and the dQ accumulator of the groups (sweep of session 22,
// hd 64 / 128 / 256 at B 8, T 2048: 32-128 MiB best, 1-2 groups and the whole grid slower).
constexpr int64_t kBwdSuperGroupBytes = 64 << 20;
// Work item `i` of n_hi heaviness levels x n_units units (of `unit` consecutive units a group),
// units grouped into supergroups of groups of `group_bytes` (about `sg_bytes` a supergroup): its
// level (0 the heaviest) and unit.
__device__ __forceinline__ void supergroup_order(int i, int n_hi, int n_units, int unit, int64_t group_bytes,
                                                 int64_t sg_bytes, int& hi, int& u) {
  const int groups = int(max(int64_t(1), sg_bytes / max(group_bytes, int64_t(1))));
  const int sgu = min(groups * unit, n_units);  // units of a full supergroup
  const int per_sg = n_hi * sgu;
  const int sg = i / per_sg, r = i - sg * per_sg;
  const int size = min(sgu, n_units - sg * sgu);  // the last supergroup may be short
  hi = r / size;
  u = sg * sgu + r % size;
}

// Query tile `tile` (longest first within its supergroup): its head, sequence,
// first row and the key tiles j0 .. n_kv - 1 it walks (downwards). lo: (BOUNDED) the record start
// of its first row (packed rows; else 0).
struct FwdTileCoord {
  int h, b, kvh, q0, n_kv, j0;
};
// qt, hb (head + H sequence) of query tile `tile`: the heads of a kv head are consecutive in hb
template <class Tr>
__device__ __forceinline__ void fwd_tile_order(int tile, int n_qt, int n_hb, int T, int H, int KVH, int& qt, int& hb) {
  if constexpr (Tr::L2_ORDER) {
    int lvl;
    supergroup_order(tile, n_qt, n_hb, H / KVH, int64_t(4) * T * Tr::HD, kSuperGroupBytes, lvl, hb);
    qt = n_qt - 1 - lvl;
  } else {
    qt = n_qt - 1 - tile / n_hb, hb = tile % n_hb;
  }
}
// (BOUNDED) the first key tile a query tile walks: the tile of its first row's first key (lo: the
// record start of that row), clamped to the walked tiles: positions that break AttnDims' precondition
// give wrong numbers, never a tile count <= 0 (the producer and the consumers would wait for each
// other forever)
template <class Tr>
__device__ __forceinline__ int fwd_first_tile(int lo, int window, int q0, int n_kv) {
  return Tr::BOUNDED ? min(max(window_key(lo, window, q0), 0) / Tr::BC, n_kv - 1) : 0;
}
template <class Tr>
__device__ __forceinline__ FwdTileCoord fwd_tile_coord(int tile, int n_qt, int n_hb, int T, int H, int KVH, int lo,
                                                       int window) {
  FwdTileCoord c;
  int qt, hb;
  fwd_tile_order<Tr>(tile, n_qt, n_hb, T, H, KVH, qt, hb);
  c.h = hb % H, c.b = hb / H;
  c.kvh = c.h / (H / KVH);
  c.q0 = qt * Tr::BR;
  c.n_kv = (min(c.q0 + Tr::BR, T) + Tr::BC - 1) / Tr::BC;
  c.j0 = fwd_first_tile<Tr>(lo, window, c.q0, c.n_kv);
  return c;
}

template <class Tr>
__global__ void __launch_bounds__(Tr::NT, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                          const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap to,
                          bf16_t* __restrict__ out, float* __restrict__ lse, const int32_t* __restrict__ pos,
                          int* __restrict__ tile_counter, int B, int T, int H, int KVH, float scale_log2, int window) {
#ifdef SF_SM90_DEVICE
  constexpr int HD = Tr::HD, BR = Tr::BR, BC = Tr::BC, KS = Tr::KSTAGES, VS = Tr::VSTAGES, QS = Tr::QSTAGES;
  constexpr int CH = Tr::CH;
  constexpr bool LB = Tr::BOUNDED;
  unsigned char* sm = smem_base();
  bf16_t* Qs = reinterpret_cast<bf16_t*>(sm + Tr::q_off);
  bf16_t* Ks = reinterpret_cast<bf16_t*>(sm + Tr::k_off);
  bf16_t* Vs = reinterpret_cast<bf16_t*>(sm + Tr::v_off);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(sm + Tr::bar_off);
  uint64_t* q_empty = q_full + QS;
  uint64_t* k_full = q_empty + QS;
  uint64_t* k_empty = k_full + KS;
  uint64_t* v_full = k_empty + KS;
  uint64_t* v_empty = v_full + VS;
  constexpr int TI = Tr::TILE_INTS;
  volatile int* tile_ids = reinterpret_cast<volatile int*>(sm + Tr::tile_off);  // [QS][TI], Tr's tile ids

  const int n_qt = (T + BR - 1) / BR, n_hb = H * B;
  const int n_tiles = n_qt * n_hb;

  const int wg = warpgroup_uniform();
  if (threadIdx.x == 0) {
    for (int s = 0; s < QS; ++s) {
      bar_init(q_full + s, Tr::Q_ARRIVALS);
      bar_init(q_empty + s, Tr::Q_EMPTY_ARRIVALS);
    }
    for (int s = 0; s < KS; ++s) {
      bar_init(k_full + s, 1);
      bar_init(k_empty + s, Tr::CONSUMERS * 4);
    }
    for (int s = 0; s < VS; ++s) {
      bar_init(v_full + s, 1);
      bar_init(v_empty + s, Tr::CONSUMERS * 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer: the tile id and Q into Q buffer n % QS, then the tile's K/V into the ring ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tr::PRODUCER_REGS) : "memory");
    if (threadIdx.x == 0) {
      int kv_it = 0;  // K/V tiles loaded so far (all tiles): K stage kv_it % KS, V stage kv_it % VS
      // The next tile's id is fetched a tile ahead: the atomic's round trip runs under this tile's loads.
      int next = atomicAdd(tile_counter, 1);
      for (int n = 0;; ++n) {
        const int qs = n % QS;
        const int tile = next;
        // (packed rows) the positions of the tile's first and last rows, loaded before the wait
        // below; their record starts are taken after the first copies are issued (the loads'
        // latency under the wait and the copies: taken before them, the producer waited for the
        // loads first) and handed to the consumers with the tile id: a tile of one record needs
        // no more of pos (the usual case), and the consumers load pos themselves only for a tile
        // where a record starts inside
        int p0 = 0, p1 = 0;
        if (LB && pos != nullptr && tile < n_tiles) {
          int qt, hb;
          fwd_tile_order<Tr>(tile, n_qt, n_hb, T, H, KVH, qt, hb);
          const int32_t* pb = pos + int64_t(hb / H) * T;
          p0 = pb[qt * BR], p1 = pb[min(qt * BR + BR, T) - 1];
        }
        bar_wait(q_empty + qs, ((n / QS) & 1) ^ 1);  // both consumers are done with tile n - QS's Q
        if (tile < n_tiles) next = atomicAdd(tile_counter, 1);
        if (tile >= n_tiles) {
          tile_ids[qs * TI] = -1;
          for (int a = 0; a < Tr::Q_ARRIVALS; ++a)
            bar_arrive(q_full + qs);  // release: the consumers read -1 after their wait
          break;
        }
        // published by the arrive below (release), read after q_full (acquire)
        if constexpr (!LB) tile_ids[qs * TI] = tile;
        FwdTileCoord c = fwd_tile_coord<Tr>(tile, n_qt, n_hb, T, H, KVH, 0, window);  // (LB) j0 below
        bar_expect_tx(q_full + qs, Tr::q_bytes);
        for (int ch = 0; ch < CH; ++ch)
          tma_load(Qs + (qs * CH + ch) * BR * 64, &tq, q_full + qs, c.h * HD + ch * 64, c.q0, c.b);
        auto load_kv = [&](int j) {  // key tile j's K and V into the ring (K/V tile kv_it)
          const int sk = kv_it % KS, sv = kv_it % VS;
          bar_wait(k_empty + sk, ((kv_it / KS) & 1) ^ 1);  // K of kv_it - KS: its QK^T done
          bar_expect_tx(k_full + sk, Tr::kv_bytes);
          for (int ch = 0; ch < CH; ++ch)
            tma_load(Ks + (sk * CH + ch) * BC * 64, &tk, k_full + sk, c.kvh * HD + ch * 64, j * BC, c.b);
          bar_wait(v_empty + sv, ((kv_it / VS) & 1) ^ 1);  // V of kv_it - VS: its PV done
          bar_expect_tx(v_full + sv, Tr::kv_bytes);
          for (int ch = 0; ch < CH; ++ch)
            tma_load(Vs + (sv * CH + ch) * BC * 64, &tv, v_full + sv, c.kvh * HD + ch * 64, j * BC, c.b);
        };
        if constexpr (LB) {
          // The diagonal key tile first (every tile walks it: j0 <= n_kv - 1), then the tile ids,
          // stored after the Q and the first K, V copies are issued, so that the record starts'
          // load latency runs under them (a tile of one key tile waited for it before its K);
          // this arrive (the second of Q_ARRIVALS) publishes them; then the key tiles down to j0
          // (the first that needs the record start).
          load_kv(c.n_kv - 1);
          ++kv_it;
          // (no pos: one record from key 0, the window alone bounds)
          const int lo0 = pos != nullptr ? c.q0 - p0 : 0, lo1 = pos != nullptr ? min(c.q0 + BR, T) - 1 - p1 : 0;
          c.j0 = fwd_first_tile<Tr>(lo0, window, c.q0, c.n_kv);
          tile_ids[qs * TI] = tile, tile_ids[qs * TI + 1] = lo0, tile_ids[qs * TI + 2] = lo1;
          bar_arrive(q_full + qs);
          for (int j = c.n_kv - 2; j >= c.j0; --j, ++kv_it) load_kv(j);
        } else {
          for (int j = c.n_kv - 1; j >= c.j0; --j, ++kv_it) load_kv(j);
        }
      }
    }
    return;
  }

  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tr::CONSUMER_REGS) : "memory");
  const int cw = wg - 1, tw = int(threadIdx.x) % 128, warp = tw / 32, lane = tw % 32;
  const int g = lane >> 2, t4 = lane & 3;
  const uint32_t q_base = smem_u32(Qs) + cw * 64 * 128;
  const uint32_t k_addr = smem_u32(Ks), v_addr = smem_u32(Vs);
  // wgmma descriptors of Q's k-step kk in the Q buffer qs (128-byte swizzle).
  // (each the buffer's descriptor, the same for every k-step, moved by the k-step's constant offset)
  auto q_desc = [&](int qs, int kk) {
    return desc_add(sdesc(q_base + qs * Tr::q_bytes, 16, 1024), (kk >> 2) * BR * 128 + (kk & 3) * 32);
  };
  auto k_desc = [&](int s, int kk) {
    return desc_add(sdesc(k_addr + s * CH * BC * 128, 16, 1024), (kk >> 2) * BC * 128 + (kk & 3) * 32);
  };
  // V as the N-major B of PV from column box c0 on
  auto v_desc = [&](int s, int kk, int c0 = 0) {
    return desc_add(sdesc(v_addr + s * CH * BC * 128, BC * 128, 1024), c0 * BC * 128 + kk * 2048);
  };

  float o[HD / 2];
  float sacc[BC / 2];
  uint32_t p[BC / 16][4];  // P of the tile whose PV is next
  float m[2], l[2], corr[2];
  auto issue_s = [&](int qs, int s) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) wgmma_ss<0, 0>(sacc, q_desc(qs, kk), k_desc(s, kk), kk > 0);
    wgmma_commit();
  };
  auto issue_pv = [&](int s) {
    wgmma_fence();
    if constexpr (HD == 256) {  // O's column halves: V's boxes 0-1 and 2-3
      float(&o_lo)[64] = *reinterpret_cast<float(*)[64]>(o);
      float(&o_hi)[64] = *reinterpret_cast<float(*)[64]>(o + 64);
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        wgmma_rs<128>(o_lo, p[kk], v_desc(s, kk));
        wgmma_rs<128>(o_hi, p[kk], v_desc(s, kk, 2));
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) wgmma_rs<HD>(o, p[kk], v_desc(s, kk));
    }
    wgmma_commit();
  };
  // Ping-pong, continued across tiles: consumer 1 opens, both pass
  // after every batch, and consumer 0 takes consumer 1's last pass when the tiles run out, so
  // every barrier completes.
  auto sched_wait = [&] { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + cw) : "memory"); };
  auto sched_pass = [&] { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - cw) : "memory"); };
  if (cw == 1) sched_pass();

  int kv_it = 0;       // K/V tiles consumed so far (all tiles), as the producer counts them
  int pending_q = -1;  // (TMA_O) the Q buffer of the last tile's O store, released under this tile's first QK^T
  for (int n = 0;; ++n) {
    const int qs = n % QS;
    bar_wait(q_full + qs, (n / QS) & 1);
    const int tile = tile_ids[qs * TI];
    if (tile < 0) break;
    const int lo0 = LB ? tile_ids[qs * TI + 1] : 0, lo1 = LB ? tile_ids[qs * TI + 2] : 0;
    // The tile's first QK^T (the diagonal key tile), in the bounded kernels issued before the
    // tile's own set-up, which then runs under the product (the plain kernels' compiler places
    // their set-up there itself; issued early in the source they measured 2-3 % slower, session 24)
    const int s0 = kv_it % KS;
    auto issue_first = [&] {
      bar_wait(k_full + s0, (kv_it / KS) & 1);
      sched_wait();
      issue_s(qs, s0);
      sched_pass();
    };
    if constexpr (LB) issue_first();
    const FwdTileCoord c = fwd_tile_coord<Tr>(tile, n_qt, n_hb, T, H, KVH, lo0, window);
    const int n_it = c.n_kv - c.j0;
    const int row0 = c.q0 + cw * 64 + warp * 16 + g;  // this thread's rows: row0, row0 + 8
    const int wg_row0 = c.q0 + cw * 64;
    int fk[2] = {0, 0};
    if constexpr (LB) {
      // one record over the tile's rows (first and last rows start at lo0): its start for all of
      // them, no loads; else each row's own from pos
      const int32_t* pb = pos != nullptr && lo0 != lo1 ? pos + int64_t(c.b) * T : nullptr;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        fk[r] = row >= T ? 0 : pb != nullptr ? first_key(pb, window, row) : window_key(lo0, window, row);
      }
    }
    const int fk_max = max(fk[0], fk[1]);
    auto causal = [&](int j) { return j * BC + BC - 1 > wg_row0; };  // key tile j reaches past a row
    auto first = [&](int j) { return LB && j * BC < fk_max; };       // ... starts before a first key
    auto release_q = [&] {  // (!TMA_O) this tile's last QK^T is done: Q buffer qs free
      if (!Tr::TMA_O && lane == 0) bar_arrive(q_empty + qs);
    };
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;

    {
      if constexpr (!LB) issue_first();
      if (Tr::TMA_O && tw == 0 && pending_q >= 0) {
        bulk_wait_read();  // the last tile's O store has read its Q buffer: the producer may load into it
        bar_arrive(q_empty + pending_q);
      }
      wgmma_wait<0>();
      reg_fence(sacc);
      if (lane == 0) bar_arrive(k_empty + s0);
      if (n_it == 1) release_q();
      softmax_tile_lazy<BC, LB>(sacc, m, l, corr, causal(c.n_kv - 1), first(c.n_kv - 1), (c.n_kv - 1) * BC + 2 * t4,
                                row0, fk, scale_log2);
      pack_p<BC>(sacc, p);  // O = 0: nothing to rescale
    }
    // One pipelined step: S_j = Q K_j^T and O += P_{j+1} V_{j+1} in
    // flight while the softmax of S_j runs (in place, fp32); once the PV is done, P_j packed into
    // the one P buffer and O rescaled, only if a row of the warp moved its max.
    for (int it = 1; it < n_it; ++it) {
      const int ki = kv_it + it, s = ki % KS, sp = (ki - 1) % VS, j = c.n_kv - 1 - it;
      bar_wait(k_full + s, (ki / KS) & 1);
      sched_wait();
      issue_s(qs, s);
      bar_wait(v_full + sp, ((ki - 1) / VS) & 1);
      issue_pv(sp);
      sched_pass();
      wgmma_wait<1>();  // S_j done: K stage s free
      reg_fence(sacc);
      if (lane == 0) bar_arrive(k_empty + s);
      if (it == n_it - 1) release_q();
      const bool grew =
          softmax_tile_lazy<BC, LB>(sacc, m, l, corr, causal(j), first(j), j * BC + 2 * t4, row0, fk, scale_log2);
      wgmma_wait<0>();  // PV done: O, P and V stage sp free
      reg_fence(o);
      reg_fence(p);
      if (lane == 0) bar_arrive(v_empty + sp);
      pack_p<BC>(sacc, p);
      if (grew) {
#pragma unroll
        for (int dn = 0; dn < HD / 8; ++dn) {
          o[dn * 4] *= corr[0], o[dn * 4 + 1] *= corr[0];
          o[dn * 4 + 2] *= corr[1], o[dn * 4 + 3] *= corr[1];
        }
      }
    }
    {  // the last PV
      const int ki = kv_it + n_it - 1, sl = ki % VS;
      bar_wait(v_full + sl, (ki / VS) & 1);
      sched_wait();
      issue_pv(sl);
      sched_pass();
      wgmma_wait<0>();
      reg_fence(o);
      reg_fence(p);
      if (lane == 0) bar_arrive(v_empty + sl);
    }
    kv_it += n_it;

    // the next tile's first QK^T is the other consumer's to overlap
    if constexpr (Tr::TMA_O) {
      // this consumer's rows of Q buffer qs: box ch at + ch * BR * 128 bytes, row warp * 16 + g
      // (+ 8: row & 7 = g), columns 8 dn + 2 t4: 16-byte chunk dn % 8 swizzled by g
      unsigned char* os = sm + Tr::q_off + qs * Tr::q_bytes + cw * 64 * 128;
      float inv[2];
      softmax_finish(m, l, inv, lse, c.b, c.h, row0, 2 * t4, T, H, scale_log2);
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<uint32_t*>(os + (dn / 8) * BR * 128 + (warp * 16 + g + 8 * r) * 128 +
                                       (((dn % 8) ^ g) << 4) + 4 * t4) =
              pack_bf16(o[dn * 4 + 2 * r] * inv[r], o[dn * 4 + 2 * r + 1] * inv[r]);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // visible to the TMA unit
      if (cw == 0)  // named barriers by immediates (1 and 2 are the ping-pong's)
        asm volatile("bar.sync 3, 128;\n" ::: "memory");
      else
        asm volatile("bar.sync 4, 128;\n" ::: "memory");
      if (tw == 0) {
#pragma unroll
        for (int ch = 0; ch < CH; ++ch) tma_store(&to, os + ch * BR * 128, c.h * HD + ch * 64, wg_row0, c.b);
        bulk_commit();
        pending_q = qs;
      }
    } else {
      store_o_lse<HD>(o, m, l, out, lse, c.b, c.h, row0, 2 * t4, T, H, scale_log2);
    }
  }
  if (Tr::TMA_O && tw == 0) bulk_wait_all();  // the last stores done before the block ends
  if (cw == 0) sched_wait();
#endif  // SF_SM90_DEVICE
}

// ---- backward ------------------------------------------------------------------------------------
// Block: BC = 128 key rows of one (kv head, sequence); it walks the causal query tiles (BQ = 64
// rows) of every query head of the GQA group. Warpgroup 0 is the producer: its first warp waits
// for a free stage, one lane issues the TMA copies of the tile's Q and dO, and the 32 lanes stage
// lse * log2 e and D (+inf / 0 past T) beside them (BOUNDED: the second warp stages pos), all
// completing on the stage's `full` barrier (the lanes' arrivals + the copies' bytes). Warpgroups 1
// and 2 own 64 key rows each, with their dK and dV accumulators (64 x HD fp32) in registers for the
// whole block (no atomics; the GQA reduction is the loop). Per tile and consumer:
//   S^T = K_w Q^T, dP^T = V_w dO^T               (wgmma, both operands from shared memory)
//   P^T = exp2(S^T scale log2 e - lse log2 e), causal mask; dS^T = P^T (dP^T - D) (hd 64 / 128:
//                                                 the scale on dK and dQ, not on each element)
//   dS^T -> shared memory (bf16, the M-major A operand of dQ; two buffers, alternating)
//   dV += P^T dO, dK += dS^T Q                    (wgmma, P^T / dS^T from registers)
//   dQ[:, half w] = dS K[:, half w]               (wgmma from shared memory, after a barrier of the
//                                                 two consumers), added into the fp32 workspace
//                                                 (the caller zeroes it and casts it to bf16)
// hd 64 and 128 (TMA_DQ): dQ through shared memory and one TMA reduce-add a 32-column box: each
// thread writes its dQ fragment (float2 stores, conflict-free into the 128-byte-swizzled boxes)
// where it would issue as many float2 atomics to L2; the warpgroup meets at a named barrier and
// one thread issues HQ / 32 bulk reduces, which run under the next tile's S^T / dP^T. The staging
// is reused a tile later: its issuer waits for the reads before the dS barrier. Measured 1.12x
// at hd 128 (session 12); at hd 64 the backward 1.050-1.062 ms against 1.116-1.127 with atomics
// (session 23: the atomics' queue held the next tile's first instructions, 9 % of the stall
// samples).
// hd 128 (HALVES) besides:
// - P^T / dS^T and the dV, dK products in two halves of the query tile (the first half's products
//   under the second half's element-wise work).
// - S^T and dP^T in two groups, half of P^T computed while dP^T runs (the MUFU work, 8192 exp2 a
//   tile: ~512 cycles at 16 a cycle, under dP^T's ~512).
// hd 64 keeps one pass: those changes with the next tile's S^T / dP^T issued behind the dQ wgmma
// measured 0.90x there (session 12).
//
// hd 256 (SPLIT_COLS): a consumer's dK and dV of 64 keys x 256 columns would be 256 fp32 registers
// a thread. So a block owns BC = 64 key rows and the consumers split the columns: consumer c
// accumulates dK, dV and dQ in columns [128 c, 128 c + 128). S^T and dP^T (64 keys x 64 queries)
// are split by queries (consumer c: queries [32 c, 32 c + 32)), and P^T and dS^T reach the other
// consumer through shared memory (two buffers, alternating by tile), where the A operands of dV
// and dK are read from: every product is computed once (the sm_80 kernel's column split computes
// S^T and dP^T in both halves: 7/5 of the work). dQ goes out as float4 atomics into the permuted
// layout (attention.cu's dq_permuted_pos): the 64 KiB staging of a TMA reduce does not fit beside
// two Q / dO stages of 64 KiB each.
// A backward block's query tiles in order: head kvh G + hi, query tile i_start + qi (qi fastest).
// Counted, not divided out of the tile index: the division by the runtime per_head took ~40
// instructions a tile (session 23's SASS).
struct BwdTileWalk {
  int hi = 0, qi = 0;
  __device__ __forceinline__ void next(int per_head) {
    if (++qi == per_head) qi = 0, ++hi;
  }
};

template <int HD_, bool BOUNDED_>
struct Sm90BwdTile {
  static constexpr bool SPLIT_COLS = HD_ == 256;
  // Q / dO stages: hd 64 has the shared memory for 4 (128 KiB in all), measured 3.2 % faster than 2
  // (B 8, T 2048, 32/8 heads: backward medians 1.263 against 1.305 ms, five rounds alternated, each
  // faster; 3 stages 1.271; session 21); hd 128 and 256 fill the 227 KiB with 2.
  static constexpr int HD = HD_, BC = SPLIT_COLS ? 64 : 128, BQ = 64, STAGES = HD == 64 ? 4 : 2, CONSUMERS = 2;
  static constexpr bool BOUNDED = BOUNDED_;  // as Sm90FwdTile's
  static constexpr bool TMA_DQ = !SPLIT_COLS;
  // P^T under dP^T and the dV, dK products in two halves of the query tile (hd 128, below)
  static constexpr bool HALVES = HD == 128;
  static_assert(!(HALVES && SPLIT_COLS), "halves of the query tile: the consumers' own 64 keys");
  // the column groups of 8 queries whose P^T is computed under dP^T (ptxas: 5 spilled 24 bytes, 8: 56;
  // the bounded kernel at hd 128: 4 spilled 36 / 44 bytes stored / loaded, 3 20 / 28)
  static constexpr int P_EARLY = BOUNDED_ ? 3 : 4;
  // as Sm90FwdTile's; the bounded hd 64 kernel 40 / 232 (ptxas: spills at 24 / 240, none at 40 / 232;
  // hd 128's consumers need their 240)
  static constexpr int PRODUCER_REGS = HD == 64 && BOUNDED_ ? 40 : 24, CONSUMER_REGS = HD == 64 && BOUNDED_ ? 232 : 240;
  static constexpr int NT = 128 * (1 + CONSUMERS), CH = HD / 64;
  static constexpr uint32_t kv_bytes = BC * HD * 2, qt_bytes = BQ * HD * 2, ds_bytes = BC * BQ * 2;
  // K [CH][BC][64] | V [CH][BC][64] | Q [STAGES][CH][BQ][64] | dO [STAGES][CH][BQ][64] |
  // dS^T [2][BC][BQ] (swizzled rows of 64) | (SPLIT_COLS) P^T [2][BC][BQ] (as dS^T) |
  // (TMA_DQ) dQ [CONSUMERS][HD / 64][BQ][32] f32 (swizzled 128-byte rows) | L [STAGES][BQ] f32 |
  // D [STAGES][BQ] f32 | P [STAGES][BQ] int (packed rows: each query's pos) | barriers
  static constexpr int DQ_BOXES = HD / 64;  // 32-column f32 boxes of one consumer's HD / 2 dQ columns
  static constexpr uint32_t dq_box_bytes = BQ * 32 * 4;
  static constexpr size_t k_off = 0, v_off = k_off + kv_bytes, q_off = v_off + kv_bytes;
  static constexpr size_t do_off = q_off + size_t(STAGES) * qt_bytes, ds_off = do_off + size_t(STAGES) * qt_bytes;
  static constexpr size_t pt_off = ds_off + size_t(2) * ds_bytes;
  static constexpr size_t dq_off = pt_off + (SPLIT_COLS ? size_t(2) * ds_bytes : 0);
  static constexpr size_t l_off = dq_off + (TMA_DQ ? size_t(CONSUMERS) * DQ_BOXES * dq_box_bytes : 0);
  static constexpr size_t d_off = l_off + size_t(STAGES) * BQ * 4;
  static constexpr size_t f_off = d_off + size_t(STAGES) * BQ * 4, bar_off = f_off + size_t(STAGES) * BQ * 4;
  // barriers: kv_full, full[STAGES], empty[STAGES]
  static constexpr size_t smem = bar_off + 8 * (1 + 2 * STAGES) + 1024;
  // Arrivals that complete a stage's `full` barrier (with the copies' bytes): the first producer
  // warp's 32 lanes after their L, D stores; (BOUNDED) lane 0's arrive with the byte count, made
  // before those stores so that the Q, dO copies go first, and the second warp's 32 after its P
  // stores.
  static constexpr int FULL_ARRIVALS = BOUNDED ? 65 : 32;
  static_assert(HD % 64 == 0 && BC == (SPLIT_COLS ? 64 : 64 * CONSUMERS) && BQ == 64, "tile shape");
  static_assert(!SPLIT_COLS || (CONSUMERS == 2 && !TMA_DQ), "the column split: two consumers, dQ by atomics");
  static_assert(P_EARLY <= BQ / 8, "P^T column groups under dP^T");
  static_assert(smem <= 227 * 1024, "shared memory");
  static_assert(PRODUCER_REGS + CONSUMERS * CONSUMER_REGS <= (1 + CONSUMERS) * (65536 / NT / 8 * 8), "registers");
};

// The consumers of the hd-256 backward (Sm90BwdTile::SPLIT_COLS), per tile:
//   S^T, dP^T of the block's 64 keys x this consumer's 32 queries   (wgmma m64n32, from shared memory)
//   P^T, dS^T -> shared memory (bf16, both consumers' halves); a barrier of the two consumers
//   dV += P^T dO, dK += dS^T Q   (this consumer's 128 columns; both operands from shared memory)
//   dQ = dS K                    (its 128 columns; float4 atomics into the permuted fp32 workspace)
// qs, ks: the block's first query row of the tile and first key; this thread's S^T elements are keys
// key0 + 8 (e >> 1), queries q0 + qh + 8 j + 2 t4 + (e & 1).
template <class Tr>
__device__ __forceinline__ void bwd_consumer_split_cols(unsigned char* sm, uint64_t* kv_full, uint64_t* full,
                                                        uint64_t* empty, int per_head, int total, int i_start, int kvh,
                                                        int G, int b, int kv0, int T, int H, float scale,
                                                        float scale_log2, int window, float* __restrict__ dq_acc,
                                                        bf16_t* __restrict__ dk, bf16_t* __restrict__ dv, int KVH) {
#ifdef SF_SM90_DEVICE
  constexpr int HD = Tr::HD, BC = Tr::BC, BQ = Tr::BQ, ST = Tr::STAGES, CH = Tr::CH;
  constexpr int HC = HD / 2;  // dK, dV, dQ columns of one consumer
  constexpr int QH = BQ / 2;  // S^T, dP^T queries of one consumer
  const float* Ls = reinterpret_cast<const float*>(sm + Tr::l_off);
  const float* Ds = reinterpret_cast<const float*>(sm + Tr::d_off);
  const int* Ps = reinterpret_cast<const int*>(sm + Tr::f_off);
  const int cw = warpgroup_uniform() - 1, tw = int(threadIdx.x) % 128, warp = tw / 32, lane = tw % 32;
  const int g = lane >> 2, t4 = lane & 3;
  const int qh = cw * QH;                // this consumer's first query of S^T in the tile
  const int key0 = kv0 + warp * 16 + g;  // this thread's keys: key0, key0 + 8
  const uint32_t k_addr = smem_u32(sm + Tr::k_off), v_addr = smem_u32(sm + Tr::v_off);
  const uint32_t q_addr = smem_u32(sm + Tr::q_off), do_addr = smem_u32(sm + Tr::do_off);
  const uint32_t ds_addr = smem_u32(sm + Tr::ds_off), pt_addr = smem_u32(sm + Tr::pt_off);
  bf16_t* dsp = reinterpret_cast<bf16_t*>(sm + Tr::ds_off);
  bf16_t* ptp = reinterpret_cast<bf16_t*>(sm + Tr::pt_off);
  // A: K or V (all 64 rows), K-major over HD: k-step kk in box kk / 4, 32 bytes kk % 4 into the rows
  // (each descriptor: the buffer's, moved by the k-step's constant offset)
  auto kv_desc = [&](uint32_t base, int kk) {
    return desc_add(sdesc(base, 16, 1024), (kk >> 2) * BC * 128 + (kk & 3) * 32);
  };
  // B: this consumer's 32 rows of Q or dO (stage s), K-major (4096 bytes = 4 swizzle atoms in)
  auto qh_desc = [&](uint32_t base, int s, int kk) {
    return desc_add(sdesc(base + s * CH * BQ * 128 + qh * 128, 16, 1024), (kk >> 2) * BQ * 128 + (kk & 3) * 32);
  };
  // A: P^T or dS^T (buffer buf), K-major over the tile's 64 queries (one box)
  auto pt_desc = [&](uint32_t base, int buf, int kk) {
    return desc_add(sdesc(base + buf * Tr::ds_bytes, 16, 1024), (kk & 3) * 32);
  };
  // B: Q or dO (stage s), N-major: k-step kk = 16 query rows, this consumer's 128 columns (2 boxes)
  auto qn_desc = [&](uint32_t base, int s, int kk) {
    return desc_add(sdesc(base + (s * CH + 2 * cw) * BQ * 128, BQ * 128, 1024), kk * 2048);
  };
  // dQ: A = dS (M-major: queries along the rows of dS^T), k-step kk = 16 keys; B = K, N-major,
  // this consumer's 128 columns
  auto dsm_desc = [&](int buf, int kk) { return desc_add(sdesc(ds_addr + buf * Tr::ds_bytes, 8192, 1024), kk * 2048); };
  auto kn_desc = [&](int kk) { return desc_add(sdesc(k_addr + 2 * cw * BC * 128, BC * 128, 1024), kk * 2048); };

  float dka[HC / 2], dva[HC / 2];
#pragma unroll
  for (int i = 0; i < HC / 2; ++i) dka[i] = dva[i] = 0.f;
  const int64_t qstr = int64_t(H) * HD;
  bar_wait(kv_full, 0);
  BwdTileWalk w;
  for (int it = 0; it < total; ++it, w.next(per_head)) {
    const int s = it % ST, buf = it & 1;
    const int h = kvh * G + w.hi, q0 = (i_start + w.qi) * BQ;
    float st[QH / 2], dp[QH / 2];
    bar_wait(full + s, (it / ST) & 1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) wgmma_ss<0, 0>(st, kv_desc(k_addr, kk), qh_desc(q_addr, s, kk), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) wgmma_ss<0, 0>(dp, kv_desc(v_addr, kk), qh_desc(do_addr, s, kk), kk > 0);
    wgmma_commit();
    wgmma_wait<1>();
    reg_fence(st);
    // (LB) keys before a query's first key: S^T = -inf, in a pass only tiles with such a query
    // take (as the other consumers')
    if constexpr (Tr::BOUNDED) {
      auto fkey = [&](int r, int p) {
        const int q = q0 + r;
        return window_key(q - p, window, q);
      };
      const int rl = min(BQ, T - q0) - 1;
      if (fkey(rl, Ps[s * BQ + rl]) > kv0) {
#pragma unroll
        for (int j = 0; j < QH / 8; ++j) {
          const int qc = qh + j * 8 + 2 * t4;
          const int2 p2 = *reinterpret_cast<const int2*>(Ps + s * BQ + qc);
          const int f0 = fkey(qc, p2.x), f1 = fkey(qc + 1, p2.y);
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (((e & 1) ? f1 : f0) > key0 + (e >> 1) * 8) st[j * 4 + e] = -INFINITY;
        }
      }
    }
    // Causal: S^T = -inf after each query (P^T = 0), a pass only diagonal tiles take (as the
    // hd 64 / 128 consumers'); then P^T (fp32) in place of S^T, under dP^T
    if (q0 + qh < kv0 + BC - 1) {
#pragma unroll
      for (int j = 0; j < QH / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (q0 + qh + j * 8 + 2 * t4 + (e & 1) < key0 + (e >> 1) * 8) st[j * 4 + e] = -INFINITY;
    }
#pragma unroll
    for (int j = 0; j < QH / 8; ++j) {
      const int qc = qh + j * 8 + 2 * t4;
      const float2 l2 = *reinterpret_cast<const float2*>(Ls + s * BQ + qc);
#pragma unroll
      for (int e = 0; e < 4; ++e) st[j * 4 + e] = fast_exp2(fmaf(st[j * 4 + e], scale_log2, -((e & 1) ? l2.y : l2.x)));
    }
    wgmma_wait<0>();
    reg_fence(dp);
    // P^T and dS^T = P^T (dP^T - D) scale into the buffers: row = key within the block, 128-byte
    // rows of 64 queries, 16-byte chunks swizzled by row & 7
    bf16_t* ptb = ptp + buf * (BC * BQ);
    bf16_t* dsb = dsp + buf * (BC * BQ);
    const int r0 = warp * 16 + g, r1 = r0 + 8;
#pragma unroll
    for (int j = 0; j < QH / 8; ++j) {
      const int qc = qh + j * 8 + 2 * t4;
      const float2 d2 = *reinterpret_cast<const float2*>(Ds + s * BQ + qc);
      float dv4[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) dv4[e] = st[j * 4 + e] * (dp[j * 4 + e] - ((e & 1) ? d2.y : d2.x));
      const int c0 = r0 * 64 + (((qc >> 3) ^ (r0 & 7)) << 3) + (qc & 7);
      const int c1 = r1 * 64 + (((qc >> 3) ^ (r1 & 7)) << 3) + (qc & 7);
      *reinterpret_cast<uint32_t*>(ptb + c0) = pack_bf16(st[j * 4], st[j * 4 + 1]);
      *reinterpret_cast<uint32_t*>(ptb + c1) = pack_bf16(st[j * 4 + 2], st[j * 4 + 3]);
      *reinterpret_cast<uint32_t*>(dsb + c0) = pack_bf16(dv4[0], dv4[1]);
      *reinterpret_cast<uint32_t*>(dsb + c1) = pack_bf16(dv4[2], dv4[3]);
    }
    // both consumers' halves in shared memory, visible to the tensor cores (async proxy). The
    // buffer written here was last read a tile ago, by products both consumers waited for before
    // they met at the previous tile's barrier.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) wgmma_ss<0, 1>(dva, pt_desc(pt_addr, buf, kk), qn_desc(do_addr, s, kk), 1);
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) wgmma_ss<0, 1>(dka, pt_desc(ds_addr, buf, kk), qn_desc(q_addr, s, kk), 1);
    wgmma_commit();
    float dqa[HC / 2];
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) wgmma_ss<1, 1>(dqa, dsm_desc(buf, kk), kn_desc(kk), kk > 0);
    wgmma_commit();
    wgmma_wait<1>();
    reg_fence(dva);
    reg_fence(dka);
    if (lane == 0) bar_arrive(empty + s);  // Q, dO, L, D, P of stage s no longer read by this warp
    wgmma_wait<0>();
    reg_fence(dqa);
    // dQ rows q0 + warp * 16 + g (+ 8), columns cw * HC + 8 j + 2 t4 (+ 1): the four values of
    // two adjacent n8 column groups of a row are contiguous in the permuted layout, one float4
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = q0 + warp * 16 + g + r * 8;
      if (row >= T) continue;
      float* base = dq_acc + (int64_t(b) * T + row) * qstr + int64_t(h) * HD + cw * HC + 4 * t4;
#pragma unroll
      for (int j = 0; j < HC / 8; j += 2)
        atomicAdd(reinterpret_cast<float4*>(base + j * 8),
                  make_float4(dqa[j * 4 + 2 * r] * scale, dqa[j * 4 + 2 * r + 1] * scale,
                              dqa[j * 4 + 4 + 2 * r] * scale, dqa[j * 4 + 5 + 2 * r] * scale));
    }
  }
  // dK, dV rows key0, key0 + 8, this consumer's columns
  const int64_t kstr = int64_t(KVH) * HD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = key0 + r * 8;
    if (row >= T) continue;
    const int64_t off = (int64_t(b) * T + row) * kstr + int64_t(kvh) * HD + cw * HC + 2 * t4;
#pragma unroll
    for (int dn = 0; dn < HC / 8; ++dn) {
      *reinterpret_cast<uint32_t*>(dk + off + dn * 8) =
          pack_bf16(dka[dn * 4 + 2 * r] * scale, dka[dn * 4 + 2 * r + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv + off + dn * 8) = pack_bf16(dva[dn * 4 + 2 * r], dva[dn * 4 + 2 * r + 1]);
    }
  }
#endif  // SF_SM90_DEVICE
}

template <class Tr>
__global__ void __launch_bounds__(Tr::NT, 1)
    flash_bwd_sm90_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                          const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                          const __grid_constant__ CUtensorMap tdq, float* __restrict__ dq_acc, bf16_t* __restrict__ dk,
                          bf16_t* __restrict__ dv, const float* __restrict__ lse, const float* __restrict__ Dd,
                          const int32_t* __restrict__ pos, int T, int H, int KVH, float scale, float scale_log2,
                          int window) {
#ifdef SF_SM90_DEVICE
  constexpr int HD = Tr::HD, BC = Tr::BC, BQ = Tr::BQ, ST = Tr::STAGES, CH = Tr::CH;
  constexpr bool LB = Tr::BOUNDED;
  unsigned char* sm = smem_base();
  bf16_t* Ks = reinterpret_cast<bf16_t*>(sm + Tr::k_off);
  bf16_t* Vs = reinterpret_cast<bf16_t*>(sm + Tr::v_off);
  bf16_t* Qs = reinterpret_cast<bf16_t*>(sm + Tr::q_off);
  bf16_t* dOs = reinterpret_cast<bf16_t*>(sm + Tr::do_off);
  bf16_t* dSs = reinterpret_cast<bf16_t*>(sm + Tr::ds_off);
  float* Ls = reinterpret_cast<float*>(sm + Tr::l_off);
  float* Ds = reinterpret_cast<float*>(sm + Tr::d_off);
  int* Ps = reinterpret_cast<int*>(sm + Tr::f_off);
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(sm + Tr::bar_off);
  uint64_t* full = kv_full + 1;
  uint64_t* empty = full + ST;

  // A block a key tile jt of a (sequence, kv head) group hb; the work of key tile jt falls with jt
  // (causal: the query tiles from its diagonal on). The heavier three quarters of the key tiles go
  // in supergroups of groups (kBwdSuperGroupBytes of Q, dO and dQ accumulator: what the blocks in
  // flight read and add into stays in L2), heaviest first within each; the lightest quarter of
  // all groups after them, heaviest first over the whole grid, so that the grid still ends on
  // short blocks. Session 22, B 8, T 2048, alternated in one call: hd 128 backward 1.79-1.88 against
  // 1.91-1.93 ms; whole supergroups (no light tail) of 1-2 groups ran up to 10 % slower at hd 64: the
  // heavy blocks of the last ones start last.
  const int n_jt = (T + BC - 1) / BC, n_hb = int(gridDim.x) / n_jt, bid = int(blockIdx.x);
  const int cut = (n_jt * 3 + 3) / 4;  // key tiles 0 .. cut - 1 in supergroups
  int jt, hb;
  if (bid < n_hb * cut) {
    supergroup_order(bid, cut, n_hb, 1, int64_t(H / KVH) * T * HD * 8, kBwdSuperGroupBytes, jt, hb);
  } else {
    const int r = bid - n_hb * cut;
    jt = cut + r / n_hb, hb = r % n_hb;
  }
  const int kvh = hb % KVH, b = hb / KVH, G = H / KVH;
  const int kv0 = jt * BC;
  const int n_q = (T + BQ - 1) / BQ, i_start = kv0 / BQ;
  const int32_t* pb = LB && pos != nullptr ? pos + int64_t(b) * T : nullptr;
  // Packed rows / window (as the sm_80 kernel): query tiles whose first row's first key is past
  // this block's last key (and so every later tile: first keys never decrease) are skipped. The
  // first such tile is searched by each warp that needs it for itself (first_tile_past: one load's
  // latency up to 32 tiles, T <= 2048, where a bisection paid ~5 dependent ones before the block
  // could start), the producer's first warp's after it has issued the K, V copies, so the search
  // runs under their latency.
  // (plain causal: every query tile from the diagonal on, G heads of them; computed here, so that
  // the plain kernel's code is the shipped one's)
  const int causal_tiles = n_q - i_start, causal_total = G * causal_tiles;
  // the block's query tiles a head, and over the GQA group
  auto query_tiles = [&](int& per_head, int& total) {
    if constexpr (LB) {
      per_head = first_tile_past(pb, window, BQ, min(kv0 + BC, T) - 1, i_start + 1, n_q) - i_start;
      total = G * per_head;
    } else {
      per_head = causal_tiles, total = causal_total;
    }
  };

  const int wg = warpgroup_uniform();
  if (threadIdx.x == 0) {
    bar_init(kv_full, 1);
    for (int s = 0; s < ST; ++s) {
      bar_init(full + s, Tr::FULL_ARRIVALS);
      bar_init(empty + s, Tr::CONSUMERS * 4);  // one arrive per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tr::PRODUCER_REGS) : "memory");
    const int lane = int(threadIdx.x);
    if (lane < 32) {
      if (lane == 0) {
        bar_expect_tx(kv_full, 2 * Tr::kv_bytes);
        for (int c = 0; c < CH; ++c) {
          tma_load(Ks + c * BC * 64, &tk, kv_full, kvh * HD + c * 64, kv0, b);
          tma_load(Vs + c * BC * 64, &tv, kv_full, kvh * HD + c * 64, kv0, b);
        }
      }
      int per_head, total;
      query_tiles(per_head, total);
      BwdTileWalk w;
      for (int it = 0; it < total; ++it, w.next(per_head)) {
        const int s = it % ST, h = kvh * G + w.hi, q0 = (i_start + w.qi) * BQ;
        bar_wait(empty + s, ((it / ST) & 1) ^ 1);
        auto load_qdo = [&] {  // lane 0: the byte count (with an arrival) and the Q, dO copies
          bar_expect_tx(full + s, 2 * Tr::qt_bytes);
          for (int c = 0; c < CH; ++c) {
            tma_load(Qs + (s * CH + c) * BQ * 64, &tq, full + s, h * HD + c * 64, q0, b);
            tma_load(dOs + (s * CH + c) * BQ * 64, &tdo, full + s, h * HD + c * 64, q0, b);
          }
        };
        if constexpr (LB) {
          // The copies first, the L, D loads under their latency (issued after the loads, a
          // stage's latency was the two in turn); lane 0's arrive here is the 33rd.
          if (lane == 0) load_qdo();
          // The tile's rows of lse and D ([B, H, T]); nv: how many are rows of the sequence.
          const int64_t li0 = (int64_t(b) * H + h) * T + q0;
          const int nv = min(BQ, T - q0);
#pragma unroll
          for (int r = lane; r < BQ; r += 32) {
            Ls[s * BQ + r] = r < nv ? lse[li0 + r] * kLog2e : INFINITY;
            Ds[s * BQ + r] = r < nv ? Dd[li0 + r] : 0.f;
          }
          bar_arrive(full + s);  // each lane's arrive (release) follows its own stores
        } else {
          for (int r = lane; r < BQ; r += 32) {
            const int qr = q0 + r;
            const int64_t li = (int64_t(b) * H + h) * T + qr;
            Ls[s * BQ + r] = qr < T ? lse[li] * kLog2e : INFINITY;
            Ds[s * BQ + r] = qr < T ? Dd[li] : 0.f;
          }
          // Each lane's arrive (release) follows its own L, D stores; lane 0's carries the bytes.
          if (lane == 0)
            load_qdo();
          else
            bar_arrive(full + s);
        }
      }
    } else if (LB && lane < 64) {
      // The second warp stages each stage's pos (ordinary loads: pos needs no more than its
      // 4-byte alignment; rows past T 0; no packed rows: the row itself, one record a row), its 32
      // arrivals beside the first warp's 33, in a loop of its own: in one loop with L and D, the
      // producer's 24 registers spilled
      int per_head, total;
      query_tiles(per_head, total);
      BwdTileWalk w;
      for (int it = 0; it < total; ++it, w.next(per_head)) {
        const int s = it % ST, q0 = (i_start + w.qi) * BQ, nv = min(BQ, T - q0);
        bar_wait(empty + s, ((it / ST) & 1) ^ 1);
        for (int r = lane - 32; r < BQ; r += 32) Ps[s * BQ + r] = r >= nv ? 0 : pb != nullptr ? pb[q0 + r] : q0 + r;
        bar_arrive(full + s);
      }
    }
    return;
  }

  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tr::CONSUMER_REGS) : "memory");
  int per_head, total;
  query_tiles(per_head, total);
  if constexpr (Tr::SPLIT_COLS) {
    bwd_consumer_split_cols<Tr>(sm, kv_full, full, empty, per_head, total, i_start, kvh, G, b, kv0, T, H, scale,
                                scale_log2, window, dq_acc, dk, dv, KVH);
  } else {
    const int cw = wg - 1, tw = int(threadIdx.x) % 128, warp = tw / 32, lane = tw % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const int kw0 = kv0 + cw * 64;         // the warpgroup's first key
    const int key0 = kw0 + warp * 16 + g;  // this thread's keys: key0, key0 + 8
    const uint32_t k_addr = smem_u32(Ks), v_addr = smem_u32(Vs), q_addr = smem_u32(Qs), do_addr = smem_u32(dOs);
    const uint32_t ds_addr = smem_u32(dSs);
    // K-major operands, k-step kk over HD: box kk / 4, 32 bytes kk % 4 into the 128-byte rows.
    // (each descriptor: the buffer's, moved by the k-step's constant offset)
    auto kw_desc = [&](uint32_t base, int kk) {  // K or V rows of this warpgroup (A)
      return desc_add(sdesc(base + cw * 64 * 128, 16, 1024), (kk >> 2) * BC * 128 + (kk & 3) * 32);
    };
    auto qt_desc = [&](uint32_t base, int s, int kk) {  // Q or dO of stage s (B, K-major)
      return desc_add(sdesc(base + s * CH * BQ * 128, 16, 1024), (kk >> 2) * BQ * 128 + (kk & 3) * 32);
    };
    // N-major B operands, k-step kk = 16 rows (2048 bytes), N over the CH boxes (LBO apart).
    auto qt_ndesc = [&](uint32_t base, int s, int kk) {
      return desc_add(sdesc(base + s * CH * BQ * 128, BQ * 128, 1024), kk * 2048);
    };
    // dQ: A = dS (M-major: queries along the 128-byte rows, keys down them), B = this warpgroup's
    // half of K's columns (N-major).
    constexpr int HQ = HD / 2;  // dQ columns of one consumer
    auto ds_desc = [&](int buf, int kk) {
      return desc_add(sdesc(ds_addr + buf * Tr::ds_bytes, 8192, 1024), kk * 2048);
    };
    auto kn_desc = [&](int kk) {
      const int col = cw * HQ;  // first column: a box (hd 128) or 64 bytes into the rows (hd 64)
      return desc_add(sdesc(k_addr + (col >> 6) * BC * 128 + (col & 63) * 2, BC * 128, 1024), kk * 2048);
    };

    float dka[HD / 2], dva[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) dka[i] = dva[i] = 0.f;

    // S^T, dP^T of tile `it` (stage it % ST, waited for until loaded), committed by the caller.
    float st[BQ / 2], dp[BQ / 2];
    auto issue_s = [&](int it) {
      const int s = it % ST;
      bar_wait(full + s, (it / ST) & 1);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) wgmma_ss<0, 0>(st, kw_desc(k_addr, kk), qt_desc(q_addr, s, kk), kk > 0);
    };
    auto issue_dp = [&](int it) {  // right after issue_s(it): its wait and fence serve
      const int s = it % ST;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) wgmma_ss<0, 0>(dp, kw_desc(v_addr, kk), qt_desc(do_addr, s, kk), kk > 0);
    };
    bar_wait(kv_full, 0);
    BwdTileWalk w;
    for (int it = 0; it < total; ++it, w.next(per_head)) {
      const int s = it % ST, buf = it & 1;
      const int h = kvh * G + w.hi, q0 = (i_start + w.qi) * BQ;
      // (HALVES) S^T and dP^T in two groups, P^T computed while dP^T runs
      issue_s(it);
      if (Tr::HALVES) wgmma_commit();
      issue_dp(it);
      wgmma_commit();
      if constexpr (Tr::HALVES) {
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
        reg_fence(dp);
      }
      reg_fence(st);
      // P^T, dS^T (this thread: keys key0 + 8 (e >> 1), queries q0 + 8 j + 2 t4 + (e & 1))
      const bool mask = q0 < kw0 + 63;
      // (LB only: the plain causal kernel has no such test) Where some query of the tile sees its
      // first key after this warpgroup's first key (the last valid query has the largest), the keys
      // before each query's first key get S^T = -inf (P^T = 0), in a pass of its own that only such
      // tiles take (a record starting inside the query tile, a window's edge): the P^T / dS^T work
      // below is the plain kernel's, per element (it tested the first key in every tile before).
      if constexpr (LB) {
        // first key of the tile's query row r (its pos in Ps; rows past T hold 0, harmless: their
        // P^T is 0 through L = +inf)
        auto fkey = [&](int r, int p) {
          const int q = q0 + r;
          return window_key(q - p, window, q);
        };
        const int rl = min(BQ, T - q0) - 1;  // the last row of the sequence
        if (fkey(rl, Ps[s * BQ + rl]) > kw0) {
#pragma unroll
          for (int j = 0; j < BQ / 8; ++j) {
            const int2 p2 = *reinterpret_cast<const int2*>(Ps + s * BQ + j * 8 + 2 * t4);
            const int f0 = fkey(j * 8 + 2 * t4, p2.x), f1 = fkey(j * 8 + 2 * t4 + 1, p2.y);
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (((e & 1) ? f1 : f0) > key0 + (e >> 1) * 8) st[j * 4 + e] = -INFINITY;
          }
        }
      }
      // Causal: the keys after a query get S^T = -inf (P^T = exp2(-inf) = 0), in a pass only the
      // tiles on the diagonal take (a uniform branch); the element-wise work below has no mask
      // (it tested every element of every tile before: ~2 instructions an element).
      if (mask) {
#pragma unroll
        for (int j = 0; j < BQ / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (q0 + j * 8 + 2 * t4 + (e & 1) < key0 + (e >> 1) * 8) st[j * 4 + e] = -INFINITY;
      }
      uint32_t pa[BQ / 16][4], dsa[BQ / 16][4];
      bf16_t* dsb = dSs + buf * (BC * BQ);
      // P^T of columns 8 j .. 8 j + 7 (fp32) into pv
      auto p_cols = [&](int j, float(&pv)[4]) {
        const int qc = j * 8 + 2 * t4;
        const float2 l2 = *reinterpret_cast<const float2*>(Ls + s * BQ + qc);
#pragma unroll
        for (int e = 0; e < 4; ++e) pv[e] = fast_exp2(fmaf(st[j * 4 + e], scale_log2, -((e & 1) ? l2.y : l2.x)));
      };
      // P^T packed into pa; dS^T of the same columns from their P^T: into dsa and the dS^T buffer.
      // dS^T without the softmax scale: dK and dQ take it once each (at the block's end, and on
      // each tile's dQ before it is added), not once an element.
      auto ds_cols = [&](int j, const float(&pv)[4]) {
        pa[j >> 1][(j & 1) * 2] = pack_bf16(pv[0], pv[1]);
        pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(pv[2], pv[3]);
        const int qc = j * 8 + 2 * t4;
        const float2 d2 = *reinterpret_cast<const float2*>(Ds + s * BQ + qc);
        float dv4[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) dv4[e] = pv[e] * (dp[j * 4 + e] - ((e & 1) ? d2.y : d2.x));
        const uint32_t lo = pack_bf16(dv4[0], dv4[1]), hi = pack_bf16(dv4[2], dv4[3]);
        dsa[j >> 1][(j & 1) * 2] = lo;
        dsa[j >> 1][(j & 1) * 2 + 1] = hi;
        // dS^T row = key within the block, 128-byte rows of 64 queries, 16-byte chunks swizzled by row & 7
        const int r0 = cw * 64 + warp * 16 + g, r1 = r0 + 8;
        *reinterpret_cast<uint32_t*>(dsb + r0 * 64 + (((qc >> 3) ^ (r0 & 7)) << 3) + (qc & 7)) = lo;
        *reinterpret_cast<uint32_t*>(dsb + r1 * 64 + (((qc >> 3) ^ (r1 & 7)) << 3) + (qc & 7)) = hi;
      };
      // dV += P^T dO, dK += dS^T Q (registers A, N-major B), k-steps k0 .. k1 - 1 (16 queries each)
      auto issue_dvdk = [&](int k0, int k1) {
        wgmma_fence();
#pragma unroll
        for (int kk = k0; kk < k1; ++kk) wgmma_rs<HD>(dva, pa[kk], qt_ndesc(do_addr, s, kk));
#pragma unroll
        for (int kk = k0; kk < k1; ++kk) wgmma_rs<HD>(dka, dsa[kk], qt_ndesc(q_addr, s, kk));
        wgmma_commit();
      };
      // (HALVES) in two halves of the queries: the first half's dV, dK products run under
      // the second half's P^T, dS^T (the registers live as in one pass: P^T of the whole tile kept
      // for an early dV spilled at hd 128)
      constexpr int PARTS = Tr::HALVES ? 2 : 1;
      if constexpr (Tr::HALVES) {
        // P^T of the tile in place of S^T (the MUFU work under the dP^T products), then dP^T
#pragma unroll
        for (int j = 0; j < Tr::P_EARLY; ++j) {
          float pv[4];
          p_cols(j, pv);
#pragma unroll
          for (int e = 0; e < 4; ++e) st[j * 4 + e] = pv[e];
        }
        wgmma_wait<0>();
        reg_fence(dp);
      }
#pragma unroll
      for (int part = 0; part < PARTS; ++part) {
#pragma unroll
        for (int j = part * (BQ / 8 / PARTS); j < (part + 1) * (BQ / 8 / PARTS); ++j) {
          if (Tr::HALVES && j < Tr::P_EARLY) {
            const float pv[4] = {st[j * 4], st[j * 4 + 1], st[j * 4 + 2], st[j * 4 + 3]};
            ds_cols(j, pv);
          } else {
            float pv[4];
            p_cols(j, pv);
            ds_cols(j, pv);
          }
        }
        issue_dvdk(part * (BQ / 16 / PARTS), (part + 1) * (BQ / 16 / PARTS));
      }
      // dS^T of both consumers in shared memory, visible to the tensor cores (async proxy)
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      // the previous tile's dQ staging read by its reduces before anyone writes it again
      if (tw == 0) bulk_wait_read();
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      float dqa[HQ / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) wgmma_ss<1, 1>(dqa, ds_desc(buf, kk), kn_desc(kk), kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(dqa);
      reg_fence(dva);
      reg_fence(dka);
      reg_fence(pa);
      reg_fence(dsa);
      if (lane == 0) bar_arrive(empty + s);  // Q, dO, L, D of stage s no longer read
      // dQ rows q0 + warp * 16 + g (+ 8), columns cw * HQ + 8 j + 2 t4, into the staging:
      // Box j / 4 of this consumer, row warp * 16 + g + 8 r (row & 7 = g), column 8 (j % 4) + 2 t4:
      // 16-byte chunk 2 (j % 4) + t4 / 2, swizzled by g.
      float* dqs = reinterpret_cast<float*>(sm + Tr::dq_off) + cw * Tr::DQ_BOXES * (BQ * 32);
#pragma unroll
      for (int j = 0; j < HQ / 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = warp * 16 + g + r * 8, chunk = (2 * (j & 3) + (t4 >> 1)) ^ g;
          *reinterpret_cast<float2*>(dqs + (j >> 2) * (BQ * 32) + row * 32 + chunk * 4 + 2 * (t4 & 1)) =
              make_float2(dqa[j * 4 + 2 * r] * scale, dqa[j * 4 + 2 * r + 1] * scale);
        }
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // visible to the TMA unit
      if (cw == 0)  // named barriers by immediates: a register id reserves all 16
        asm volatile("bar.sync 2, 128;\n" ::: "memory");
      else
        asm volatile("bar.sync 3, 128;\n" ::: "memory");
      if (tw == 0) {
#pragma unroll
        for (int x = 0; x < Tr::DQ_BOXES; ++x)
          tma_reduce_add(&tdq, dqs + x * (BQ * 32), h * HD + cw * HQ + x * 32, q0, b);
        bulk_commit();
      }
    }

    if (tw == 0) bulk_wait_all();  // the last dQ reduces done before the block ends
    // dK (with the softmax scale dS^T left out), dV rows key0, key0 + 8
    const int64_t kstr = int64_t(KVH) * HD;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = key0 + r * 8;
      if (row >= T) continue;
      const int64_t off = (int64_t(b) * T + row) * kstr + int64_t(kvh) * HD + 2 * t4;
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn) {
        *reinterpret_cast<uint32_t*>(dk + off + dn * 8) =
            pack_bf16(dka[dn * 4 + 2 * r] * scale, dka[dn * 4 + 2 * r + 1] * scale);
        *reinterpret_cast<uint32_t*>(dv + off + dn * 8) = pack_bf16(dva[dn * 4 + 2 * r], dva[dn * 4 + 2 * r + 1]);
      }
    }
  }
#endif  // SF_SM90_DEVICE
}

// ---- host -------------------------------------------------------------------------------------
// cuTensorMapEncodeTiled through the runtime's driver entry point (no libcuda link), once.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    SF_CHECK(q == cudaDriverEntryPointSuccess && p != nullptr, "attention (sm_90): cuTensorMapEncodeTiled not found");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A [B, T, cols] bf16 tensor read in [rows][64] boxes, 128-byte swizzle; rows past T read as zeros.
// f32: an F32 tensor in [rows][32] boxes (128-byte rows as well: the dQ reduce-add's).
CUtensorMap make_map(const void* base, int B, int T, int64_t cols, int rows, bool f32 = false) {
  CUtensorMap map;
  const cuuint64_t es = f32 ? 4 : 2;
  const cuuint64_t dims[3] = {cuuint64_t(cols), cuuint64_t(T), cuuint64_t(B)};
  const cuuint64_t strides[2] = {cuuint64_t(cols) * es, cuuint64_t(cols) * es * cuuint64_t(T)};
  const cuuint32_t box[3] = {cuuint32_t(128 / es), cuuint32_t(rows), 1};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims,
      strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  SF_CHECK(r == CUDA_SUCCESS, "attention (sm_90): cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");
  return map;
}

// Packed rows or a window: the kernels with the first-key bound (BOUNDED); else plain causal.
bool bounded(const AttnDims& d) { return !d.pos.empty() || d.window > 0; }

// Every precondition of the kernels and their tensor maps, checked on the host (a failure is the
// caller's bug: attention.cu routes only calls that pass attention_sm90_*_supported and its own
// dtype / alignment test here). TMA: global addresses 16-byte aligned, row strides (heads * hd *
// 2 or 4 bytes) multiples of 16 (hd is 64 or 128); pos (packed rows) is read by ordinary loads: I32,
// B * T of them, 4-byte aligned.
void check_args(const char* op, std::initializer_list<const Tensor*> bf16s, const void* f32_aligned,
                const AttnDims& d) {
  const std::string w = std::string("attention (sm_90) ") + op + ": ";
  SF_CHECK(d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256, w + "head_dim " + std::to_string(d.head_dim));
  SF_CHECK(d.B >= 1 && d.T >= 1 && d.n_head >= 1 && d.n_kv_head >= 1 && d.n_head % d.n_kv_head == 0 && d.window >= 0,
           w + "bad dims");
  for (const Tensor* t : bf16s)
    SF_CHECK(t->dtype == DType::BF16 && aligned16(t->data), w + "tensors must be BF16 and 16-byte aligned");
  SF_CHECK(f32_aligned == nullptr || aligned16(f32_aligned), w + "dQ workspace must be 16-byte aligned");
  if (!d.pos.empty())
    SF_CHECK(d.pos.dtype == DType::I32 && d.pos.numel() == int64_t(d.B) * d.T &&
                 (reinterpret_cast<uintptr_t>(d.pos.data) & 3u) == 0,
             w + "pos must be B*T I32, 4-byte aligned");
}

// A forward kernel's launch setup: its shared memory allowed (once per kernel: the device is fixed
// per process) and the tensor maps of Q (BR-row boxes), K and V (BC-row boxes).
template <class Tr, class Kernel>
void allow_smem(Kernel kernel) {
  static bool done = false;
  if (!done) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tr::smem)));
    done = true;
  }
}
struct QkvMaps {
  CUtensorMap q, k, v;
};
template <class Tr>
QkvMaps qkv_maps(Tensor q, Tensor k, Tensor v, const AttnDims& d) {
  return {make_map(q.data, d.B, d.T, int64_t(d.n_head) * Tr::HD, Tr::BR),
          make_map(k.data, d.B, d.T, int64_t(d.n_kv_head) * Tr::HD, Tr::BC),
          make_map(v.data, d.B, d.T, int64_t(d.n_kv_head) * Tr::HD, Tr::BC)};
}

// The forward: one CTA an SM (at most one a tile); the tile counter (4 bytes of the
// stream's scratch, zeroed here) hands out the tiles.
template <int HD, bool BOUNDED>
void forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d, const Launch& L) {
  using Tr = Sm90FwdTile<HD, BOUNDED>;
  check_args("forward", {&out, &q, &k, &v}, nullptr, d);
  SF_CHECK(lse.empty() || (lse.dtype == DType::F32 && lse.numel() == int64_t(d.B) * d.n_head * d.T),
           "attention (sm_90) forward: lse must be empty or [B, n_head, T] F32");
  auto kernel = flash_fwd_sm90_kernel<Tr>;
  allow_smem<Tr>(kernel);
  SF_CHECK(L.scratch != nullptr && L.scratch->buf != nullptr && L.scratch->buf_bytes >= sizeof(int),
           "attention (sm_90): no stream scratch for the tile counter");
  int* counter = static_cast<int*>(L.scratch->buf);
  CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int), L.stream));
  const QkvMaps mp = qkv_maps<Tr>(q, k, v, d);
  const CUtensorMap &tq = mp.q, &tk = mp.k, &tv = mp.v;
  CUtensorMap to{};  // read only with TMA_O: a consumer's 64 rows a box
  if (Tr::TMA_O) to = make_map(out.data, d.B, d.T, int64_t(d.n_head) * HD, 64);
  const int64_t tiles = int64_t((d.T + Tr::BR - 1) / Tr::BR) * d.n_head * d.B;
  const unsigned grid = unsigned(std::min<int64_t>(tiles, std::max(L.num_sms, 1)));
  kernel<<<grid, Tr::NT, Tr::smem, L.stream>>>(tq, tk, tv, to, out.ptr<bf16_t>(),
                                               lse.empty() ? nullptr : lse.ptr<float>(),
                                               d.pos.empty() ? nullptr : d.pos.ptr<int32_t>(), counter, d.B, d.T,
                                               d.n_head, d.n_kv_head, d.scale * kLog2e, d.window);
  CUDA_CHECK_LAUNCH();
}

template <int HD, bool BOUNDED>
void backward(float* dq_acc, const float* D, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
              Tensor lse, const AttnDims& d, const Launch& L) {
  using Tr = Sm90BwdTile<HD, BOUNDED>;
  check_args("backward", {&dk, &dv, &dout, &q, &k, &v}, dq_acc, d);
  SF_CHECK(dq_acc != nullptr && D != nullptr && lse.dtype == DType::F32 && lse.numel() == int64_t(d.B) * d.n_head * d.T,
           "attention (sm_90) backward: needs the dQ workspace, D and lse [B, n_head, T] F32");
  auto kernel = flash_bwd_sm90_kernel<Tr>;
  static bool attr_set = false;  // once per instantiation
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tr::smem)));
    attr_set = true;
  }
  const CUtensorMap tq = make_map(q.data, d.B, d.T, int64_t(d.n_head) * HD, Tr::BQ);
  const CUtensorMap tdo = make_map(dout.data, d.B, d.T, int64_t(d.n_head) * HD, Tr::BQ);
  const CUtensorMap tk = make_map(k.data, d.B, d.T, int64_t(d.n_kv_head) * HD, Tr::BC);
  const CUtensorMap tv = make_map(v.data, d.B, d.T, int64_t(d.n_kv_head) * HD, Tr::BC);
  CUtensorMap tdq{};  // read only with TMA_DQ
  if (Tr::TMA_DQ) tdq = make_map(dq_acc, d.B, d.T, int64_t(d.n_head) * HD, Tr::BQ, true);
  const unsigned grid = unsigned((d.T + Tr::BC - 1) / Tr::BC) * unsigned(d.n_kv_head * d.B);
  kernel<<<grid, Tr::NT, Tr::smem, L.stream>>>(tq, tk, tv, tdo, tdq, dq_acc, dk.ptr<bf16_t>(), dv.ptr<bf16_t>(),
                                               lse.ptr<float>(), D, d.pos.empty() ? nullptr : d.pos.ptr<int32_t>(), d.T,
                                               d.n_head, d.n_kv_head, d.scale, d.scale * kLog2e, d.window);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

// The kernels count tiles in int: the forward's tile counter runs to its tiles + one a CTA, the
// backward's grid is one block a key tile (64 or 128 keys) and (kv head, sequence); larger calls
// take the sm_80 kernels.
bool attention_sm90_forward_supported(const AttnDims& d) {
  const int64_t fwd_tiles = (int64_t(d.T) + 127) / 128 * d.n_head * d.B;
  return (d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256) && fwd_tiles + 1024 < INT32_MAX;
}
bool attention_sm90_backward_supported(const AttnDims& d) {
  const int64_t bwd_blocks = (int64_t(d.T) + 63) / 64 * d.n_kv_head * d.B;
  return (d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256) && bwd_blocks < INT32_MAX;
}
bool attention_sm90_dq_permuted(int head_dim) { return head_dim == 256; }  // SPLIT_COLS: float4 atomics

void attention_forward_sm90(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d, const Launch& L) {
  const bool b = bounded(d);
  if (d.head_dim == 64)
    b ? forward<64, true>(out, lse, q, k, v, d, L) : forward<64, false>(out, lse, q, k, v, d, L);
  else if (d.head_dim == 128)
    b ? forward<128, true>(out, lse, q, k, v, d, L) : forward<128, false>(out, lse, q, k, v, d, L);
  else
    b ? forward<256, true>(out, lse, q, k, v, d, L) : forward<256, false>(out, lse, q, k, v, d, L);
}

void attention_backward_sm90(float* dq_acc, const float* D, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k,
                             Tensor v, Tensor lse, const AttnDims& d, const Launch& L) {
  const bool b = bounded(d);
  if (d.head_dim == 64)
    b ? backward<64, true>(dq_acc, D, dk, dv, dout, q, k, v, lse, d, L)
      : backward<64, false>(dq_acc, D, dk, dv, dout, q, k, v, lse, d, L);
  else if (d.head_dim == 128)
    b ? backward<128, true>(dq_acc, D, dk, dv, dout, q, k, v, lse, d, L)
      : backward<128, false>(dq_acc, D, dk, dv, dout, q, k, v, lse, d, L);
  else
    b ? backward<256, true>(dq_acc, D, dk, dv, dout, q, k, v, lse, d, L)
      : backward<256, false>(dq_acc, D, dk, dv, dout, q, k, v, lse, d, L);
}

}  // namespace sf::cuda
