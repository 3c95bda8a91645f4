#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_mask.cuh"
#include "backend/cuda/attention_sm90.cuh"
#include "backend/cuda/kernel_utils.cuh"
#include "core/align.h"

namespace sf::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Tests and benchmarks only (attention_force_path); Auto in the program.
std::atomic<AttnPath> g_path{AttnPath::Auto};

// An attribute of the current device, read once per device ordinal into `cache` (ordinals from 16
// on are read every call).
int cached_device_attr(cudaDeviceAttr attr, std::atomic<int> (&cache)[16]) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const bool cached = dev >= 0 && dev < 16;
  int v = cached ? cache[dev].load() : 0;
  if (v == 0) {
    CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    if (cached) cache[dev] = v;
  }
  return v;
}

// Compute capability major of the current device (the start-up choice of the kernel family: sm_90
// kernels on Hopper, the sm_80 ones elsewhere).
int device_cc_major() {
  static std::atomic<int> cache[16] = {};
  return cached_device_attr(cudaDevAttrComputeCapabilityMajor, cache);
}

// The shared memory a block may opt in to on this device (the sm_80 kernels' tile).
size_t device_smem_optin() {
  static std::atomic<int> cache[16] = {};
  return size_t(cached_device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, cache));
}

// ============================================================================================
// Flash kernels (BF16, head_dim 64 / 128 / 256)
// ============================================================================================

// Element offset of (row, col) in a [rows][HD] bf16 tile whose 16-byte chunks are XOR-swizzled
// by (row & 7): ldmatrix (8 rows, same logical chunk) and the cp.async writes are conflict-free.
template <int HD>
__device__ __forceinline__ int swz(int row, int col) {
  if constexpr (HD >= 64) {
    return row * HD + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
  } else if constexpr (HD == 32) {  // rows of 4 chunks (dS^T with query tiles of 32): two rows a 128-byte line
    return row * HD + ((((col >> 3) ^ ((row >> 1) & 3))) << 3) + (col & 7);
  } else {  // rows of 2 chunks (dS^T with query tiles of 16): four rows a 128-byte line
    static_assert(HD == 16, "rows of 16, 32 or of at least 64 elements");
    return row * HD + ((((col >> 3) ^ ((row >> 2) & 1))) << 3) + (col & 7);
  }
}

// rows [row0, row0 + ROWS) of a [T, stride] bf16 matrix (starting at g) -> swizzled smem tile;
// rows >= T are zero-filled.
template <int HD, int ROWS, int NT>
__device__ __forceinline__ void load_tile(bf16_t* s, const bf16_t* g, int64_t stride, int row0, int T, int tid) {
  constexpr int CH = HD / 8;
  static_assert((ROWS * CH) % NT == 0, "tile chunks must divide among threads");
#pragma unroll
  for (int i = 0; i < ROWS * CH / NT; ++i) {
    const int id = tid + i * NT;
    const int r = id / CH, c = id % CH;
    const int gr = row0 + r;
    const bool ok = gr < T;
    const bf16_t* src = g + int64_t(ok ? gr : 0) * stride + c * 8;
    cp_async16(s + r * HD + ((c ^ (r & 7)) << 3), src, ok);
  }
}

// ---- forward --------------------------------------------------------------------------------
// One tile shape: BR query rows of one (head, sequence) a block, NW warps, each owning MT =
// BR / (16 NW) m16 tiles (consecutive rows; MT = 2 reuses every K / V fragment loaded from shared
// memory for two MMAs, halving shared-memory traffic per FLOP, what limits mma.sync attention on
// Hopper); K / V tiles of BC rows, double-buffered. The shared-memory layout is defined here only.
template <int HD_, int BR_, int BC_, int NW_, int MINB_>
struct FwdTile {
  static constexpr int HD = HD_, BR = BR_, BC = BC_, NW = NW_, MINB = MINB_, NT = NW * 32;
  static constexpr int MT = BR / (NW * 16);
  static_assert(MT * NW * 16 == BR && MT >= 1, "BR must be a multiple of 16 * warps");
  // Q [BR][HD] | K [2][BC][HD] | V [2][BC][HD], bf16, 16-byte chunks swizzled (swz)
  static constexpr size_t q_off = 0, k_off = q_off + size_t(BR) * HD * 2, v_off = k_off + size_t(2) * BC * HD * 2;
  static constexpr size_t smem = v_off + size_t(2) * BC * HD * 2;
};

// The tile per head dim, the fastest measured (bench_kernels, H200, session 2 and later; issue 19
// removed the run-time variants): hd 64 BC 64 x 4 warps of 2 m-tiles; hd 128 BC 32 (fits 255
// registers without spills; BC 64 x 8 warps of 1 m-tile and BC 64 x 4 x 2 were slower); hd 256
// 8 warps x 1 m-tile (the O accumulator is HD/2 fp32 registers a thread; two m-tiles would spill;
// Q 64 KiB + double-buffered K, V 128 KiB of shared memory).
template <int HD>
using FwdTraits =
    std::conditional_t<HD == 64, FwdTile<64, 128, 64, 4, 2>,
                       std::conditional_t<HD == 128, FwdTile<128, 128, 32, 4, 2>, FwdTile<256, 128, 64, 8, 1>>>;
// The tile where FwdTraits' does not fit the device's shared memory a block: hd 256's 192 KiB is
// more than an A100's 163 KiB and an RTX 30x0 / 40x0's 99 KiB; 64 query rows (4 warps) and K, V
// tiles of 32 take 96 KiB (hd 64 and 128 fit everywhere: 48 and 64 KiB).
template <int HD>
using FwdTraitsSmall = std::conditional_t<HD == 256, FwdTile<256, 64, 32, 4, 1>, FwdTraits<HD>>;

template <class Tr>
__global__ void __launch_bounds__(Tr::NT, Tr::MINB)
    flash_fwd_kernel(bf16_t* __restrict__ out, float* __restrict__ lse, const bf16_t* __restrict__ q,
                     const bf16_t* __restrict__ k, const bf16_t* __restrict__ v, const int32_t* __restrict__ pos, int T,
                     int H, int KVH, float scale_log2, int window) {
  constexpr int HD = Tr::HD, BR = Tr::BR, BC = Tr::BC, NT = Tr::NT, MT = Tr::MT;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem_raw + Tr::q_off);
  bf16_t* Ks = reinterpret_cast<bf16_t*>(smem_raw + Tr::k_off);
  bf16_t* Vs = reinterpret_cast<bf16_t*>(smem_raw + Tr::v_off);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  // Blocks start in blockIdx order, longest-first: the last query tiles (heaviest: they see the
  // most keys) of every head and sequence start first and the light ones fill the tail (7% less
  // time than heavy-first within each head, by simulation; measured 1.067 -> 0.990 ms).
  const int n_qt = (T + BR - 1) / BR;
  const int n_hb = int(gridDim.x) / n_qt, bid = int(blockIdx.x);
  const int qt = n_qt - 1 - bid / n_hb;
  const int hb = bid % n_hb;
  const int h = hb % H, b = hb / H;
  const int kvh = h / (H / KVH);
  const int q0 = qt * BR;
  const int wr0 = warp * MT * 16;  // first row of this warp inside the tile
  const int64_t qstr = int64_t(H) * HD, kstr = int64_t(KVH) * HD;
  const bf16_t* qb = q + int64_t(b) * T * qstr + int64_t(h) * HD;
  const bf16_t* kb = k + int64_t(b) * T * kstr + int64_t(kvh) * HD;
  const bf16_t* vb = v + int64_t(b) * T * kstr + int64_t(kvh) * HD;
  const int kv_end = min(q0 + BR, T);
  const int n_kv = (kv_end + BC - 1) / BC;
  // Packed rows (pos [B*T], ops.h): row i sees keys i - pos[i] .. i. Segment starts never
  // decrease along a row, so the tile's first row has the lowest: key tiles wholly below it are
  // skipped; a tile below the warp's last row's start is masked element-wise, with the rows'
  // starts read (L1) only then, to keep registers for the unpacked path, which is unchanged
  // (pb null: j0 = 0 and warp_seg_max = 0). A sliding window moves the rows' first keys the same
  // way (first_key): key tiles wholly before the window of the tile's first row are skipped.
  const int32_t* pb = pos != nullptr ? pos + int64_t(b) * T : nullptr;
  int j0 = 0, warp_seg_max = 0;
  if (pb != nullptr || window > 0) {
    j0 = first_key(pb, window, q0) / BC;
    const int wlast = min(q0 + wr0 + MT * 16 - 1, T - 1);
    warp_seg_max = first_key(pb, window, wlast);
  }

  load_tile<HD, BR, NT>(Qs, qb, qstr, q0, T, tid);
  load_tile<HD, BC, NT>(Ks, kb, kstr, j0 * BC, T, tid);
  load_tile<HD, BC, NT>(Vs, vb, kstr, j0 * BC, T, tid);
  cp_async_commit();

  float o[MT][HD / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  float m_r[MT][2], l_r[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m_r[mt][0] = m_r[mt][1] = -INFINITY, l_r[mt][0] = l_r[mt][1] = 0.f;

  for (int j = j0; j < n_kv; ++j) {
    cp_async_wait<0>();
    __syncthreads();  // tile j landed; every warp is done with tile j-1's buffers
    if (j + 1 < n_kv) {
      const int st = (j + 1 - j0) & 1;
      load_tile<HD, BC, NT>(Ks + st * BC * HD, kb, kstr, (j + 1) * BC, T, tid);
      load_tile<HD, BC, NT>(Vs + st * BC * HD, vb, kstr, (j + 1) * BC, T, tid);
      cp_async_commit();
    }
    const bf16_t* Kt = Ks + ((j - j0) & 1) * BC * HD;
    const bf16_t* Vt = Vs + ((j - j0) & 1) * BC * HD;

    // S = Q K^T  (MT*16 x BC per warp)
    float s[MT][BC / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < BC / 8; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldsm_x4(a[mt], Qs + swz<HD>(wr0 + mt * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int nt = 0; nt < BC / 8; nt += 2) {
        uint32_t bb[4];
        ldsm_x4(bb, Kt + swz<HD>(nt * 8 + (lane >> 4) * 8 + (lane & 7), kk * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(s[mt][nt], a[mt], bb[0], bb[1]);
          mma_bf16(s[mt][nt + 1], a[mt], bb[2], bb[3]);
        }
      }
    }
    // scale into the log2 domain, causal (and segment) mask, online softmax
    const int kv0 = j * BC;
    const bool need_mask = kv0 + BC - 1 > q0 + wr0 || kv0 < warp_seg_max;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int row0 = q0 + wr0 + mt * 16 + g;  // this thread's rows: row0, row0 + 8
      if (need_mask) {
        int seg[2] = {0, 0};  // the rows' segment starts
        if (kv0 < warp_seg_max) {
          seg[0] = row0 < T ? first_key(pb, window, row0) : 0;
          seg[1] = row0 + 8 < T ? first_key(pb, window, row0 + 8) : 0;
        }
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = kv0 + nt * 8 + 2 * t4 + (e & 1);
            const bool masked = key > row0 + (e >> 1) * 8 || key < seg[e >> 1];
            s[mt][nt][e] = masked ? -INFINITY : s[mt][nt][e] * scale_log2;
          }
      } else {
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] *= scale_log2;
      }
      float mx[2] = {m_r[mt][0], m_r[mt][1]};
#pragma unroll
      for (int nt = 0; nt < BC / 8; ++nt) {
        mx[0] = fmaxf(mx[0], fmaxf(s[mt][nt][0], s[mt][nt][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[mt][nt][2], s[mt][nt][3]));
      }
      float corr[2], mu[2], rs[2] = {0.f, 0.f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        mu[r] = mx[r] == -INFINITY ? 0.f : mx[r];
        corr[r] = fast_exp2(m_r[mt][r] - mu[r]);
        m_r[mt][r] = mx[r];
      }
#pragma unroll
      for (int nt = 0; nt < BC / 8; ++nt) {
        s[mt][nt][0] = fast_exp2(s[mt][nt][0] - mu[0]);
        s[mt][nt][1] = fast_exp2(s[mt][nt][1] - mu[0]);
        s[mt][nt][2] = fast_exp2(s[mt][nt][2] - mu[1]);
        s[mt][nt][3] = fast_exp2(s[mt][nt][3] - mu[1]);
        rs[0] += s[mt][nt][0] + s[mt][nt][1];
        rs[1] += s[mt][nt][2] + s[mt][nt][3];
      }
      l_r[mt][0] = l_r[mt][0] * corr[0] + rs[0];  // thread-partial row sums; quad-reduced at the end
      l_r[mt][1] = l_r[mt][1] * corr[1] + rs[1];
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn) {
        o[mt][dn][0] *= corr[0], o[mt][dn][1] *= corr[0];
        o[mt][dn][2] *= corr[1], o[mt][dn][3] *= corr[1];
      }
    }
    // O += P V  (P from registers: two C fragments form one A fragment)
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dn = 0; dn < HD / 8; dn += 2) {
        uint32_t bb[4];
        ldsm_x4_t(bb, Vt + swz<HD>(kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), (dn + (lane >> 4)) * 8));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(o[mt][dn], a[mt], bb[0], bb[1]);
          mma_bf16(o[mt][dn + 1], a[mt], bb[2], bb[3]);
        }
      }
    }
  }

  // finalize: O / l, lse = (m + log2 l) * ln 2
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = l_r[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = q0 + wr0 + mt * 16 + g + r * 8;
      if (row >= T) continue;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      bf16_t* orow = out + (int64_t(b) * T + row) * qstr + int64_t(h) * HD + 2 * t4;
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn)
        *reinterpret_cast<uint32_t*>(orow + dn * 8) = pack_bf16(o[mt][dn][2 * r] * inv, o[mt][dn][2 * r + 1] * inv);
      if (lse != nullptr && t4 == 0) lse[(int64_t(b) * H + h) * T + row] = (m_r[mt][r] + log2f(l)) * kLn2;
    }
}

// ---- backward ---------------------------------------------------------------------------------
// D[b, h, t] = sum_d dO * O  (one warp per (token, head)).
__global__ void attn_bwd_dot_kernel(float* __restrict__ D, DIn dout, DIn out, int B, int T, int H, int hd) {
  const int64_t w = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (w >= int64_t(B) * T * H) return;
  const int h = int(w % H);
  const int64_t bt = w / H;  // b*T + t
  const int64_t base = w * hd;
  float acc = 0.f;
  for (int d = lane; d < hd; d += 32) acc += ld1(dout, base + d) * ld1(out, base + d);
  acc = warp_sum(acc);
  if (lane == 0) {
    const int64_t b = bt / T, t = bt % T;
    D[(b * H + h) * T + t] = acc;
  }
}

// D as attn_bwd_dot_kernel, for BF16 dO and O (16-byte aligned, HD 64 / 128 / 256): HD / 8 lanes a
// (row, head), one 16-byte load of each tensor a lane (a warp moves 512 bytes of each a load where
// the general kernel's 2-byte loads move 64: the pass reads 2 B T H HD bytes, 268 MB at B 8,
// T 2048, H 32, hd 128). Groups run over t fastest, so that D [B, H, T] is written contiguously.
template <int HD>
__global__ void attn_bwd_dot_bf16_kernel(float* __restrict__ D, const bf16_t* __restrict__ dout,
                                         const bf16_t* __restrict__ out, int B, int T, int H) {
  constexpr int L = HD / 8;  // lanes a row; divides 32
  static_assert(HD % 8 == 0 && 32 % L == 0, "head dim");
  const int64_t gid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t w = gid / L;  // (b * H + h) * T + t: D's index
  const int sub = int(gid % L);
  const bool live = w < int64_t(B) * H * T;
  float acc = 0.f;
  if (live) {
    const int t = int(w % T), h = int((w / T) % H);
    const int64_t b = w / (int64_t(T) * H);
    const int64_t off = ((b * T + t) * H + h) * HD + sub * 8;
    const uint4 a = *reinterpret_cast<const uint4*>(dout + off), c = *reinterpret_cast<const uint4*>(out + off);
    const uint32_t av[4] = {a.x, a.y, a.z, a.w}, cv[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = unpack_bf16(av[i]), y = unpack_bf16(cv[i]);
      acc = fmaf(x.x, y.x, fmaf(x.y, y.y, acc));
    }
  }
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (live && sub == 0) D[w] = acc;
}

// Position of column c inside its group of 16 in the permuted dQ accumulator: the four values a
// thread holds for one row of two adjacent n8 MMA tiles (columns 2t, 2t+1, 8+2t, 8+2t+1) are
// contiguous, so they go out as one float4 atomic.
__host__ __device__ constexpr int dq_permuted_pos(int c) {
  const int j = c & 15;
  return (c & ~15) + ((j & 7) >> 1) * 4 + (j >> 3) * 2 + (j & 1);
}

// Step 7 of the backward, DQV 1: dQ[q0 .. q0+BR) += dS K for one query tile. Warps: BR / 32 row
// groups x the rest over column groups of HD / (that many) columns, walked in chunks of <= 32.
template <int HD, int NW, int BR, int BC>
__device__ __forceinline__ void flash_bwd_dq_32(float* __restrict__ dq_acc, const bf16_t* dSs, const bf16_t* Ks, int q0,
                                                int T, int h, int b, int64_t qstr, int warp, int lane) {
  constexpr int QG = BR / 32, DG = NW / QG, CW = HD / DG, CC = CW < 32 ? CW : 32;
  static_assert(QG * DG == NW && CW % 16 == 0, "bad dQ split");
  const int g = lane >> 2, t4 = lane & 3;
  const int qg = warp % QG, dg = warp / QG;
  const int qr0 = q0 + qg * 32 + g;  // rows qr0 + 16 mt + 8 r
#pragma unroll 1
  for (int cb = dg * CW; cb < (dg + 1) * CW; cb += CC) {
    float acc[2][CC / 8][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < CC / 8; ++i) acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      uint32_t qa[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ldsm_x4_t(qa[mt],
                  dSs + swz<BR>(kk * 16 + (lane >> 4) * 8 + (lane & 7), qg * 32 + mt * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
      for (int n = 0; n < CC / 8; n += 2) {
        uint32_t bb[4];
        ldsm_x4_t(bb, Ks + swz<HD>(kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), cb + (n + (lane >> 4)) * 8));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_bf16(acc[mt][n], qa[mt], bb[0], bb[1]);
          mma_bf16(acc[mt][n + 1], qa[mt], bb[2], bb[3]);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = qr0 + mt * 16 + r * 8;
        if (row >= T) continue;
        float* base = dq_acc + (int64_t(b) * T + row) * qstr + int64_t(h) * HD + cb + t4 * 4;
#pragma unroll
        for (int n = 0; n < CC / 8; n += 2)
          atomicAdd(
              reinterpret_cast<float4*>(base + n * 8),
              make_float4(acc[mt][n][2 * r], acc[mt][n][2 * r + 1], acc[mt][n + 1][2 * r], acc[mt][n + 1][2 * r + 1]));
      }
  }
}

// One tile shape: BC = 16 * NW key rows of one (kv head, sequence) a block; it walks the query
// tiles (BR rows) of every query head of the GQA group. dS^T goes through shared memory for the
// dQ product.
// DQV 0: the warps split dQ as (BR / 16 query groups) x (NW * 16 / BR column groups), float2
//        atomics into the natural [B*T, H*HD] layout.
// DQV 1: 32-row warp tiles (two m16 tiles share every K fragment: fewer ldmatrix per MMA) and
//        float4 atomics (half the atomic instructions) into a layout permuted within each group
//        of 16 columns (dq_permuted_pos); the cast kernel undoes the permutation.
// SPLIT: steps 1-6 over SPLIT sub-tiles of BR / SPLIT query columns (fewer live registers).
// CS > 1 (head_dim 256: 2): the dK / dV accumulators of HD fp32 columns do not fit in registers;
//        block (.., y) accumulates only columns [y HD/CS, (y+1) HD/CS) of dK, dV and dQ, recomputing
//        S and dP in full (1.4x the MMA work of CS 1 at CS 2, no fallback kernel).
// STAGES: query tiles in shared memory at once: 2 (the next one lands during this one's work), or
//        1 (it lands during the dQ step only: half the Q / dO memory, so that two blocks share an
//        SM where one would not fit twice).
// The shared-memory layout is defined here only.
template <int HD_, int NW_, int BR_, int MINB_, int SPLIT_, int DQV_, int CS_, int STAGES_ = 2>
struct BwdTile {
  static constexpr int HD = HD_, NW = NW_, BR = BR_, MINB = MINB_, SPLIT = SPLIT_, DQV = DQV_, CS = CS_;
  static constexpr int STAGES = STAGES_;
  static constexpr int BC = NW * 16;   // key rows per block (16 per warp)
  static constexpr int HDA = HD / CS;  // accumulated columns of dK, dV, dQ per block
  static constexpr int NT = NW * 32;
  static_assert(CS == 1 || DQV == 0, "column splits use the DQV 0 dQ step");
  // K [BC][HD] | V [BC][HD] | Q [STAGES][BR][HD] | dO [STAGES][BR][HD] (bf16, swizzled) | dS^T [BC][BR]
  // (bf16, swizzled rows of BR) | L [STAGES][BR] (lse * log2 e, +inf past T) | D [STAGES][BR] (f32) |
  // S [STAGES][BR] (int: first key of each query, packed rows / window)
  static constexpr size_t k_off = 0, v_off = k_off + size_t(BC) * HD * 2, q_off = v_off + size_t(BC) * HD * 2;
  static constexpr size_t do_off = q_off + size_t(STAGES) * BR * HD * 2;
  static constexpr size_t ds_off = do_off + size_t(STAGES) * BR * HD * 2;
  static constexpr size_t l_off = ds_off + size_t(BC) * BR * 2, d_off = l_off + size_t(STAGES) * BR * 4;
  static constexpr size_t s_off = d_off + size_t(STAGES) * BR * 4, smem = s_off + size_t(STAGES) * BR * 4;
  static_assert(STAGES == 1 || STAGES == 2, "one or two query stages");
};

// The tile per head dim, the fastest measured (bench_kernels, H200; issue 19 removed the run-time
// variants): hd 64 / 128: 128 key rows (8 warps), query tiles of 64, the DQV 1 dQ step (3.329 ->
// 3.086 ms at hd 128, 1.864 -> 1.760 ms at hd 64 against DQV 0; 64 key rows with 4 warps and the
// split query tile were slower); hd 256: 64 key rows (4 warps), dK / dV / dQ columns split over two
// blocks, query tiles of 32 in one stage (K, V 64 KiB + Q, dO 32 KiB + dS 4 KiB: two blocks an SM;
// query tiles of 64 in two stages took 201.5 KiB, one 4-warp block an SM).
template <int HD>
using BwdTraits = std::conditional_t<HD == 256, BwdTile<256, 4, 32, 2, 1, 0, 2, 1>, BwdTile<HD, 8, 64, 1, 1, 1, 1>>;
// The tile where BwdTraits' does not fit (the 99 KiB a block of sm_86 / sm_89; hd 64's 64 KiB fits
// everywhere): hd 128 query tiles of 32 in one stage (145.5 -> 88 KiB); hd 256 query tiles of 16
// (100.4 -> 82 KiB: K and V of 64 rows are 64 KiB alone).
template <int HD>
using BwdTraitsSmall = std::conditional_t<
    HD == 64, BwdTraits<64>,
    std::conditional_t<HD == 128, BwdTile<128, 8, 32, 1, 1, 1, 1, 1>, BwdTile<256, 4, 16, 1, 1, 0, 2, 1>>>;

template <class Tr>
__global__ void __launch_bounds__(Tr::NT, Tr::MINB)
    flash_bwd_kernel(float* __restrict__ dq_acc, bf16_t* __restrict__ dk, bf16_t* __restrict__ dv,
                     const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                     const bf16_t* __restrict__ dO, const float* __restrict__ lse, const float* __restrict__ Dd,
                     const int32_t* __restrict__ pos, int T, int H, int KVH, float scale, float scale_log2,
                     int window) {
  constexpr int HD = Tr::HD, NW = Tr::NW, BR = Tr::BR, BC = Tr::BC, HDA = Tr::HDA, NT = Tr::NT;
  constexpr int DQV = Tr::DQV;
  constexpr int QG = BR / 16, DG = NW / QG;  // dQ split: query groups x column groups
  constexpr int BS = BR / Tr::SPLIT;
  static_assert(BS % 16 == 0, "sub-tile must be a multiple of 16");
  static_assert(QG * DG == NW && (HDA / DG) % 32 == 0, "bad dQ split");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16_t* Ks = reinterpret_cast<bf16_t*>(smem_raw + Tr::k_off);
  bf16_t* Vs = reinterpret_cast<bf16_t*>(smem_raw + Tr::v_off);
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem_raw + Tr::q_off);
  bf16_t* dOs = reinterpret_cast<bf16_t*>(smem_raw + Tr::do_off);
  bf16_t* dSs = reinterpret_cast<bf16_t*>(smem_raw + Tr::ds_off);
  float* Ls = reinterpret_cast<float*>(smem_raw + Tr::l_off);
  float* Ds = reinterpret_cast<float*>(smem_raw + Tr::d_off);
  int* Ss = reinterpret_cast<int*>(smem_raw + Tr::s_off);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  // Longest-first: the first key tiles (they see every query tile) of all kv heads and sequences
  // start first; the light last ones fill the tail (11% less time than heavy-first within each
  // head, by simulation; measured 3.673 -> 3.305 ms).
  const int n_jt = (T + BC - 1) / BC, n_hb = int(gridDim.x) / n_jt, bid = int(blockIdx.x);
  const int jt = bid / n_hb;
  const int hb = bid % n_hb;
  const int kvh = hb % KVH, b = hb / KVH;
  const int G = H / KVH;
  const int kv0 = jt * BC;
  const int coff = int(blockIdx.y) * HDA;  // first accumulated column
  const int64_t qstr = int64_t(H) * HD, kstr = int64_t(KVH) * HD;
  const bf16_t* kb = k + int64_t(b) * T * kstr + int64_t(kvh) * HD;
  const bf16_t* vb = v + int64_t(b) * T * kstr + int64_t(kvh) * HD;

  const int n_q = (T + BR - 1) / BR;
  const int i_start = kv0 / BR;
  // Packed rows / window: query tiles whose first row's first key (first_key) is after this
  // block's last key (and so every later tile: first keys never decrease) see none of its keys
  // and are skipped.
  const int32_t* pb = pos != nullptr ? pos + int64_t(b) * T : nullptr;
  const bool lower = pb != nullptr || window > 0;  // a first key other than 0 exists
  int i_end = n_q;
  if (lower) {
    const int kv_last = min(kv0 + BC, T) - 1;
    for (int i = i_start + 1; i < n_q; ++i)
      if (first_key(pb, window, i * BR) > kv_last) {
        i_end = i;
        break;
      }
  }
  const int per_head = i_end - i_start;
  const int total = G * per_head;

  load_tile<HD, BC, NT>(Ks, kb, kstr, kv0, T, tid);
  load_tile<HD, BC, NT>(Vs, vb, kstr, kv0, T, tid);

  auto issue = [&](int it, int st) {
    const int h = kvh * G + it / per_head;
    const int i = i_start + it % per_head;
    const int qq0 = i * BR;
    const bf16_t* qb = q + int64_t(b) * T * qstr + int64_t(h) * HD;
    const bf16_t* ob = dO + int64_t(b) * T * qstr + int64_t(h) * HD;
    load_tile<HD, BR, NT>(Qs + st * BR * HD, qb, qstr, qq0, T, tid);
    load_tile<HD, BR, NT>(dOs + st * BR * HD, ob, qstr, qq0, T, tid);
    for (int r = tid; r < BR; r += NT) {
      const int qr = qq0 + r;
      const int64_t li = (int64_t(b) * H + h) * T + qr;
      Ls[st * BR + r] = qr < T ? lse[li] * kLog2e : INFINITY;
      Ds[st * BR + r] = qr < T ? Dd[li] : 0.f;
      Ss[st * BR + r] = (lower && qr < T) ? first_key(pb, window, qr) : 0;
    }
  };
  issue(0, 0);
  cp_async_commit();

  float dk_acc[HDA / 8][4], dv_acc[HDA / 8][4];
#pragma unroll
  for (int i = 0; i < HDA / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[i][e] = dv_acc[i][e] = 0.f;
  const int kvr0 = kv0 + warp * 16 + g;  // this thread's key rows: kvr0, kvr0 + 8

  for (int it = 0; it < total; ++it) {
    const int st = Tr::STAGES == 2 ? (it & 1) : 0;
    const int h = kvh * G + it / per_head;
    const int q0 = (i_start + it % per_head) * BR;
    cp_async_wait<0>();
    __syncthreads();  // stage st (and K/V) landed; all warps done with the previous iteration
    if (Tr::STAGES == 2 && it + 1 < total) {
      issue(it + 1, st ^ 1);
      cp_async_commit();
    }
    const bf16_t* Qt = Qs + st * BR * HD;
    const bf16_t* dOt = dOs + st * BR * HD;
    const float* Lt = Ls + st * BR;
    const float* Dt = Ds + st * BR;
    const int* St = Ss + st * BR;
    // Some query of the tile starts its segment after this block's first key: mask by segment too.
    const bool seg_mask = lower && St[min(BR, T - q0) - 1] > kv0;

    // Steps 1-6 run over SPLIT sub-tiles of BS = BR / SPLIT query columns (SPLIT = 2 halves the
    // live S / dP registers, next to the 2 x HD/2 fp32 dK, dV accumulators).
#pragma unroll 1
    for (int c0 = 0; c0 < BR; c0 += BS) {
      // 1. S^T = K_w Q^T   (16 key rows x BS queries per warp)
      float s[BS / 8][4];
#pragma unroll
      for (int i = 0; i < BS / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        uint32_t a[4];
        ldsm_x4(a, Ks + swz<HD>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int nt = 0; nt < BS / 8; nt += 2) {
          uint32_t bb[4];
          ldsm_x4(bb, Qt + swz<HD>(c0 + nt * 8 + (lane >> 4) * 8 + (lane & 7), kk * 16 + ((lane >> 3) & 1) * 8));
          mma_bf16(s[nt], a, bb[0], bb[1]);
          mma_bf16(s[nt + 1], a, bb[2], bb[3]);
        }
      }
      // 2. P^T = exp2(S^T * scale*log2e - lse*log2e), causal mask (query < key -> 0), fp32 in s
#pragma unroll
      for (int nt = 0; nt < BS / 8; ++nt) {
        const int qc = c0 + nt * 8 + 2 * t4;
        const float2 l2 = *reinterpret_cast<const float2*>(Lt + qc);
        const int2 s2 = seg_mask ? *reinterpret_cast<const int2*>(St + qc) : make_int2(0, 0);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float val = fast_exp2(fmaf(s[nt][e], scale_log2, -((e & 1) ? l2.y : l2.x)));
          const int key = kvr0 + (e >> 1) * 8;
          bool masked = q0 + qc + (e & 1) < key;                           // causal
          if (seg_mask) masked = masked || ((e & 1) ? s2.y : s2.x) > key;  // key before the query's record
          s[nt][e] = masked ? 0.f : val;
        }
      }
      // 3. dP^T = V_w dO^T
      float dp[BS / 8][4];
#pragma unroll
      for (int i = 0; i < BS / 8; ++i) dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        uint32_t a[4];
        ldsm_x4(a, Vs + swz<HD>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int nt = 0; nt < BS / 8; nt += 2) {
          uint32_t bb[4];
          ldsm_x4(bb, dOt + swz<HD>(c0 + nt * 8 + (lane >> 4) * 8 + (lane & 7), kk * 16 + ((lane >> 3) & 1) * 8));
          mma_bf16(dp[nt], a, bb[0], bb[1]);
          mma_bf16(dp[nt + 1], a, bb[2], bb[3]);
        }
      }
      // 4. dS^T = P^T * (dP^T - D) * scale (fp32 P, one bf16 rounding) -> A fragments for dK and
      //    smem for dQ; P^T -> bf16 A fragments for dV. (Two C fragments form one A fragment.)
      uint32_t pa[BS / 16][4], dsa[BS / 16][4];
#pragma unroll
      for (int nt = 0; nt < BS / 8; ++nt) {
        const int qc = c0 + nt * 8 + 2 * t4;
        const float2 dd = *reinterpret_cast<const float2*>(Dt + qc);
        const uint32_t lo = pack_bf16(s[nt][0] * (dp[nt][0] - dd.x) * scale, s[nt][1] * (dp[nt][1] - dd.y) * scale);
        const uint32_t hi = pack_bf16(s[nt][2] * (dp[nt][2] - dd.x) * scale, s[nt][3] * (dp[nt][3] - dd.y) * scale);
        dsa[nt >> 1][(nt & 1) * 2] = lo;
        dsa[nt >> 1][(nt & 1) * 2 + 1] = hi;
        pa[nt >> 1][(nt & 1) * 2] = pack_bf16(s[nt][0], s[nt][1]);
        pa[nt >> 1][(nt & 1) * 2 + 1] = pack_bf16(s[nt][2], s[nt][3]);
        *reinterpret_cast<uint32_t*>(dSs + swz<BR>(warp * 16 + g, qc)) = lo;
        *reinterpret_cast<uint32_t*>(dSs + swz<BR>(warp * 16 + g + 8, qc)) = hi;
      }
      // 5. dV += P^T dO
#pragma unroll
      for (int kk = 0; kk < BS / 16; ++kk)
#pragma unroll
        for (int dn = 0; dn < HDA / 8; dn += 2) {
          uint32_t bb[4];
          ldsm_x4_t(bb,
                    dOt + swz<HD>(c0 + kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), coff + (dn + (lane >> 4)) * 8));
          mma_bf16(dv_acc[dn], pa[kk], bb[0], bb[1]);
          mma_bf16(dv_acc[dn + 1], pa[kk], bb[2], bb[3]);
        }
        // 6. dK += dS^T Q
#pragma unroll
      for (int kk = 0; kk < BS / 16; ++kk)
#pragma unroll
        for (int dn = 0; dn < HDA / 8; dn += 2) {
          uint32_t bb[4];
          ldsm_x4_t(bb, Qt + swz<HD>(c0 + kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), coff + (dn + (lane >> 4)) * 8));
          mma_bf16(dk_acc[dn], dsa[kk], bb[0], bb[1]);
          mma_bf16(dk_acc[dn + 1], dsa[kk], bb[2], bb[3]);
        }
    }
    __syncthreads();                          // dS^T of all warps in smem; (one stage) the query tile's last reads done
    if (Tr::STAGES == 1 && it + 1 < total) {  // the next query tile lands during the dQ step
      issue(it + 1, 0);
      cp_async_commit();
    }
    if constexpr (DQV == 1) {
      flash_bwd_dq_32<HD, NW, BR, BC>(dq_acc, dSs, Ks, q0, T, h, b, qstr, warp, lane);
      continue;
    }
    // 7. dQ (16 query rows x HD/DG columns per warp) += dS K, fp32 float2 atomics into the workspace
    const int qg = warp % QG, dg = warp / QG;
    const int qr0 = q0 + qg * 16 + g;
    float* dqrow0 = dq_acc + (int64_t(b) * T + qr0) * qstr + int64_t(h) * HD + 2 * t4;
    float* dqrow1 = dqrow0 + 8 * qstr;
#pragma unroll 1
    for (int dc = dg * (HDA / DG / 32); dc < (dg + 1) * (HDA / DG / 32); ++dc) {
      float acc[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        uint32_t qa[4];
        ldsm_x4_t(qa, dSs + swz<BR>(kk * 16 + (lane >> 4) * 8 + (lane & 7), qg * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
        for (int d2 = 0; d2 < 2; ++d2) {
          const int dn = coff / 8 + dc * 4 + d2 * 2;
          uint32_t bb[4];
          ldsm_x4_t(bb, Ks + swz<HD>(kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), (dn + (lane >> 4)) * 8));
          mma_bf16(acc[d2 * 2], qa, bb[0], bb[1]);
          mma_bf16(acc[d2 * 2 + 1], qa, bb[2], bb[3]);
        }
      }
#pragma unroll
      for (int n4 = 0; n4 < 4; ++n4) {
        const int d = coff + (dc * 4 + n4) * 8;
        if (qr0 < T) atomicAdd(reinterpret_cast<float2*>(dqrow0 + d), make_float2(acc[n4][0], acc[n4][1]));
        if (qr0 + 8 < T) atomicAdd(reinterpret_cast<float2*>(dqrow1 + d), make_float2(acc[n4][2], acc[n4][3]));
      }
    }
  }

  // dK, dV rows of this warp
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = kvr0 + r * 8;
    if (row >= T) continue;
    const int64_t off = (int64_t(b) * T + row) * kstr + int64_t(kvh) * HD + coff + 2 * t4;
#pragma unroll
    for (int dn = 0; dn < HDA / 8; ++dn) {
      *reinterpret_cast<uint32_t*>(dk + off + dn * 8) = pack_bf16(dk_acc[dn][2 * r], dk_acc[dn][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dv + off + dn * 8) = pack_bf16(dv_acc[dn][2 * r], dv_acc[dn][2 * r + 1]);
    }
  }
}

// The DQV 1 accumulator back to the natural layout, 16 columns (one permutation group) a thread.
__global__ void dq_unpermute_bf16_kernel(bf16_t* __restrict__ out, const float* __restrict__ in, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n / 16; i += stride) {
    float p[16], v[16];
    load_vec<16>(in + i * 16, p);
#pragma unroll
    for (int c = 0; c < 16; ++c) v[c] = p[dq_permuted_pos(c)];
    store_vec<16>(out + i * 16, v);
  }
}

__global__ void f32_to_bf16_kernel(bf16_t* __restrict__ out, const float* __restrict__ in, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n / 8; i += stride) {
    float v[8];
    load_vec<8>(in + i * 8, v);
    store_vec<8>(out + i * 8, v);
  }
}

const int32_t* pos_ptr(const AttnDims& d) { return d.pos.empty() ? nullptr : d.pos.ptr<int32_t>(); }

// Raises a kernel's dynamic shared-memory limit once per tile traits Tr (the device is fixed per
// process). Keyed by Tr, not by the kernel's type: every instantiation of one kernel template has
// the same function-pointer type, and one flag for all of them left the later ones unraised.
template <class Tr, class Kernel>
void raise_smem_once(Kernel kernel, size_t bytes) {
  static bool done = false;
  if (!done) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    done = true;
  }
}

template <class Tr>
void flash_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d, const Launch& L) {
  auto kernel = flash_fwd_kernel<Tr>;
  raise_smem_once<Tr>(kernel, Tr::smem);
  const unsigned grid = unsigned((d.T + Tr::BR - 1) / Tr::BR) * unsigned(d.n_head * d.B);
  kernel<<<grid, Tr::NT, Tr::smem, L.stream>>>(out.ptr<bf16_t>(), lse.empty() ? nullptr : lse.ptr<float>(),
                                               q.ptr<bf16_t>(), k.ptr<bf16_t>(), v.ptr<bf16_t>(), pos_ptr(d), d.T,
                                               d.n_head, d.n_kv_head, d.scale * kLog2e, d.window);
  CUDA_CHECK_LAUNCH();
}

template <class Tr>
void flash_backward(float* dq_acc, const float* D, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k,
                    Tensor v, Tensor lse, const AttnDims& d, const Launch& L) {
  const int64_t nq = int64_t(d.B) * d.T * d.n_head * Tr::HD;
  CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, size_t(nq) * sizeof(float), L.stream));
  auto kernel = flash_bwd_kernel<Tr>;
  raise_smem_once<Tr>(kernel, Tr::smem);
  if constexpr (Tr::MINB > 1) {  // the largest shared-memory carveout, so that MINB blocks fit an SM
    static bool carved = false;
    if (!carved) {
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      int(cudaSharedmemCarveoutMaxShared)));
      carved = true;
    }
  }
  const dim3 grid(unsigned((d.T + Tr::BC - 1) / Tr::BC) * unsigned(d.n_kv_head * d.B), Tr::CS);
  kernel<<<grid, Tr::NT, Tr::smem, L.stream>>>(
      dq_acc, dk.ptr<bf16_t>(), dv.ptr<bf16_t>(), q.ptr<bf16_t>(), k.ptr<bf16_t>(), v.ptr<bf16_t>(), dout.ptr<bf16_t>(),
      lse.ptr<float>(), D, pos_ptr(d), d.T, d.n_head, d.n_kv_head, d.scale, d.scale * kLog2e, d.window);
  CUDA_CHECK_LAUNCH();
  if constexpr (Tr::DQV == 1)
    dq_unpermute_bf16_kernel<<<grid_for(nq / 16, 256, L.num_sms), 256, 0, L.stream>>>(dq.ptr<bf16_t>(), dq_acc, nq);
  else
    f32_to_bf16_kernel<<<grid_for(nq / 8, 256, L.num_sms), 256, 0, L.stream>>>(dq.ptr<bf16_t>(), dq_acc, nq);
  CUDA_CHECK_LAUNCH();
}

// ============================================================================================
// Simple kernels (any F32/BF16 mix, head_dim <= 512): one warp per output row, exact softmax.
// MD: head-dim elements a lane holds (head_dim <= 32 * MD); 8 up to 256, 16 above (Gemma 4's
// 512-wide global heads: the flash tiles' fp32 O accumulators of 512 columns do not fit in a
// thread's registers, so those heads run here; simple_md picks by head_dim alone).
// ============================================================================================
constexpr int kMaxD = 16;  // head_dim <= 32 * kMaxD
int simple_md(int head_dim) { return head_dim <= 256 ? 8 : 16; }

// pos [B*T] I32 or null (packed rows, ops.h): query t sees keys t - pos[t] .. t.
template <int MD>
__global__ void attn_fwd_simple_kernel(DOut out, float* __restrict__ lse, DIn q, DIn k, DIn v,
                                       const int32_t* __restrict__ pos, int B, int T, int H, int KVH, int hd,
                                       float scale, int window) {
  const int64_t w = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (w >= int64_t(B) * H * T) return;
  const int t = int(w % T), h = int((w / T) % H), b = int(w / (int64_t(T) * H));
  const int kvh = h / (H / KVH);
  const int64_t qoff = ((int64_t(b) * T + t) * H + h) * hd;
  float qv[MD], o[MD];
#pragma unroll
  for (int i = 0; i < MD; ++i) {
    const int dd = lane + 32 * i;
    qv[i] = dd < hd ? ld1(q, qoff + dd) : 0.f;
    o[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int lo = first_key(pos != nullptr ? pos + int64_t(b) * T : nullptr, window, t);
  for (int j = lo; j <= t; ++j) {
    const int64_t koff = ((int64_t(b) * T + j) * KVH + kvh) * hd;
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < MD; ++i) {
      const int dd = lane + 32 * i;
      if (dd < hd) dot += qv[i] * ld1(k, koff + dd);
    }
    const float s = warp_sum(dot) * scale;
    const float mn = fmaxf(m, s);
    const float corr = expf(m - mn), p = expf(s - mn);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < MD; ++i) {
      const int dd = lane + 32 * i;
      o[i] = o[i] * corr + (dd < hd ? p * ld1(v, koff + dd) : 0.f);
    }
    m = mn;
  }
#pragma unroll
  for (int i = 0; i < MD; ++i) {
    const int dd = lane + 32 * i;
    if (dd < hd) st1(out, qoff + dd, o[i] / l);
  }
  if (lse != nullptr && lane == 0) lse[(int64_t(b) * H + h) * T + t] = m + logf(l);
}

template <int MD>
__global__ void attn_bwd_dq_simple_kernel(DOut dq, DIn dout, DIn q, DIn k, DIn v, const float* __restrict__ lse,
                                          const float* __restrict__ D, const int32_t* __restrict__ pos, int B, int T,
                                          int H, int KVH, int hd, float scale, int window) {
  const int64_t w = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (w >= int64_t(B) * H * T) return;
  const int t = int(w % T), h = int((w / T) % H), b = int(w / (int64_t(T) * H));
  const int kvh = h / (H / KVH);
  const int64_t qoff = ((int64_t(b) * T + t) * H + h) * hd;
  const int64_t li = (int64_t(b) * H + h) * T + t;
  const float Lr = lse[li], Dr = D[li];
  float qv[MD], gv[MD], acc[MD];
#pragma unroll
  for (int i = 0; i < MD; ++i) {
    const int dd = lane + 32 * i;
    qv[i] = dd < hd ? ld1(q, qoff + dd) : 0.f;
    gv[i] = dd < hd ? ld1(dout, qoff + dd) : 0.f;
    acc[i] = 0.f;
  }
  const int lo = first_key(pos != nullptr ? pos + int64_t(b) * T : nullptr, window, t);
  for (int j = lo; j <= t; ++j) {
    const int64_t koff = ((int64_t(b) * T + j) * KVH + kvh) * hd;
    float kv[MD], sdot = 0.f, pdot = 0.f;
#pragma unroll
    for (int i = 0; i < MD; ++i) {
      const int dd = lane + 32 * i;
      kv[i] = dd < hd ? ld1(k, koff + dd) : 0.f;
      sdot += qv[i] * kv[i];
      pdot += dd < hd ? gv[i] * ld1(v, koff + dd) : 0.f;
    }
    const float p = expf(warp_sum(sdot) * scale - Lr);
    const float ds = p * (warp_sum(pdot) - Dr);
#pragma unroll
    for (int i = 0; i < MD; ++i) acc[i] += ds * kv[i];
  }
#pragma unroll
  for (int i = 0; i < MD; ++i) {
    const int dd = lane + 32 * i;
    if (dd < hd) st1(dq, qoff + dd, acc[i] * scale);
  }
}

template <int MD>
__global__ void attn_bwd_dkdv_simple_kernel(DOut dk, DOut dv, DIn dout, DIn q, DIn k, DIn v,
                                            const float* __restrict__ lse, const float* __restrict__ D,
                                            const int32_t* __restrict__ pos, int B, int T, int H, int KVH, int hd,
                                            float scale, int window) {
  const int64_t w = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (w >= int64_t(B) * KVH * T) return;
  const int j = int(w % T), kvh = int((w / T) % KVH), b = int(w / (int64_t(T) * KVH));
  const int G = H / KVH;
  const int64_t koff = ((int64_t(b) * T + j) * KVH + kvh) * hd;
  float kv[MD], vv[MD], dka[MD], dva[MD];
#pragma unroll
  for (int i = 0; i < MD; ++i) {
    const int dd = lane + 32 * i;
    kv[i] = dd < hd ? ld1(k, koff + dd) : 0.f;
    vv[i] = dd < hd ? ld1(v, koff + dd) : 0.f;
    dka[i] = dva[i] = 0.f;
  }
  for (int gi = 0; gi < G; ++gi) {
    const int h = kvh * G + gi;
    for (int t = j; t < T; ++t) {
      // Later queries are in later records / windows.
      if (first_key(pos != nullptr ? pos + int64_t(b) * T : nullptr, window, t) > j) break;
      const int64_t qoff = ((int64_t(b) * T + t) * H + h) * hd;
      const int64_t li = (int64_t(b) * H + h) * T + t;
      float qv[MD], gv[MD], sdot = 0.f, pdot = 0.f;
#pragma unroll
      for (int i = 0; i < MD; ++i) {
        const int dd = lane + 32 * i;
        qv[i] = dd < hd ? ld1(q, qoff + dd) : 0.f;
        gv[i] = dd < hd ? ld1(dout, qoff + dd) : 0.f;
        sdot += qv[i] * kv[i];
        pdot += gv[i] * vv[i];
      }
      const float p = expf(warp_sum(sdot) * scale - lse[li]);
      const float ds = p * (warp_sum(pdot) - D[li]);
#pragma unroll
      for (int i = 0; i < MD; ++i) {
        dva[i] += p * gv[i];
        dka[i] += ds * qv[i];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < MD; ++i) {
    const int dd = lane + 32 * i;
    if (dd < hd) {
      st1(dk, koff + dd, dka[i] * scale);
      st1(dv, koff + dd, dva[i]);
    }
  }
}

// The kernels' own limit (the rest of the arguments: ops_check.h).
void check_head_dim(const char* op, const AttnDims& d) {
  SF_CHECK(d.head_dim <= 32 * kMaxD, std::string(op) + ": head_dim = " + std::to_string(d.head_dim) +
                                         ", the cuda kernels take at most " + std::to_string(32 * kMaxD));
}

bool all_bf16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->dtype != DType::BF16 || !aligned16(t->data)) return false;
  return true;
}

}  // namespace

void attention_force_path(AttnPath p) { g_path = p; }

namespace {
// The sm_80 family's tile for a head dim: the fastest measured where it fits the device's shared
// memory a block, else the small one (FwdTraitsSmall / BwdTraitsSmall: an A100's 163 KiB, a
// consumer GPU's 99 KiB), else none (the simple kernels). Chosen by the device, which fixes its
// shared memory (or forced: AttnPath::Sm80Small, so that the small tiles stay tested on Hopper).
// Every tile fits Hopper's 227 KiB, every small one 99 KiB (asserted).
constexpr size_t kHopperSmem = size_t(227) << 10, kConsumerSmem = size_t(99) << 10;
static_assert(FwdTraits<64>::smem <= kHopperSmem && FwdTraits<128>::smem <= kHopperSmem &&
                  FwdTraits<256>::smem <= kHopperSmem,
              "a forward tile beyond Hopper's shared memory");
static_assert(BwdTraits<64>::smem <= kHopperSmem && BwdTraits<128>::smem <= kHopperSmem &&
                  BwdTraits<256>::smem <= kHopperSmem,
              "a backward tile beyond Hopper's shared memory");
static_assert(FwdTraitsSmall<64>::smem <= kConsumerSmem && FwdTraitsSmall<128>::smem <= kConsumerSmem &&
                  FwdTraitsSmall<256>::smem <= kConsumerSmem,
              "a small forward tile beyond a consumer GPU's shared memory");
static_assert(BwdTraitsSmall<64>::smem <= kConsumerSmem && BwdTraitsSmall<128>::smem <= kConsumerSmem &&
                  BwdTraitsSmall<256>::smem <= kConsumerSmem,
              "a small backward tile beyond a consumer GPU's shared memory");
enum class Tile { Fast, Small, None };
Tile pick_tile(size_t fast, size_t small, AttnPath path) {
  if (path == AttnPath::Sm80Small) return Tile::Small;
  const size_t have = device_smem_optin();
  return fast <= have ? Tile::Fast : small <= have ? Tile::Small : Tile::None;
}
template <int HD>
Tile fwd_tile(AttnPath path) {
  return pick_tile(FwdTraits<HD>::smem, FwdTraitsSmall<HD>::smem, path);
}
template <int HD>
Tile bwd_tile(AttnPath path) {
  return pick_tile(BwdTraits<HD>::smem, BwdTraitsSmall<HD>::smem, path);
}
// flash_forward with the tile for HD; false where none fits
template <int HD>
bool flash_forward_hd(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d, const Launch& L,
                      AttnPath path) {
  const Tile t = fwd_tile<HD>(path);
  if (t == Tile::Fast) flash_forward<FwdTraits<HD>>(out, lse, q, k, v, d, L);
  if (t == Tile::Small) flash_forward<FwdTraitsSmall<HD>>(out, lse, q, k, v, d, L);
  return t != Tile::None;
}
template <int HD>
bool flash_backward_hd(float* dq_acc, const float* D, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k,
                       Tensor v, Tensor lse, const AttnDims& d, const Launch& L, AttnPath path) {
  const Tile t = bwd_tile<HD>(path);
  if (t == Tile::Fast) flash_backward<BwdTraits<HD>>(dq_acc, D, dq, dk, dv, dout, q, k, v, lse, d, L);
  if (t == Tile::Small) flash_backward<BwdTraitsSmall<HD>>(dq_acc, D, dq, dk, dv, dout, q, k, v, lse, d, L);
  return t != Tile::None;
}
}  // namespace

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d, const Launch& L) {
  check_head_dim("attention_forward", d);
  const int64_t rows = int64_t(d.B) * d.T;
  const AttnPath path = g_path.load();
  const bool flash = path != AttnPath::Simple && (d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256) &&
                     all_bf16({&out, &q, &k, &v});
  if (flash && path == AttnPath::Auto && device_cc_major() == 9 && attention_sm90_forward_supported(d)) {
    attention_forward_sm90(out, lse, q, k, v, d, L);
    return;
  }
  if (flash) {
    const bool done = d.head_dim == 64    ? flash_forward_hd<64>(out, lse, q, k, v, d, L, path)
                      : d.head_dim == 128 ? flash_forward_hd<128>(out, lse, q, k, v, d, L, path)
                                          : flash_forward_hd<256>(out, lse, q, k, v, d, L, path);
    if (done) return;
  }
  const int64_t warps = rows * d.n_head;
  auto fwd = [&](auto kernel) {
    kernel<<<unsigned((warps + 3) / 4), 128, 0, L.stream>>>(dout_(out), lse.empty() ? nullptr : lse.ptr<float>(),
                                                            din(q), din(k), din(v), pos_ptr(d), d.B, d.T, d.n_head,
                                                            d.n_kv_head, d.head_dim, d.scale, d.window);
    CUDA_CHECK_LAUNCH();
  };
  simple_md(d.head_dim) == 8 ? fwd(attn_fwd_simple_kernel<8>) : fwd(attn_fwd_simple_kernel<16>);
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                        Tensor lse, const AttnDims& d, Tensor ws, const Launch& L) {
  check_head_dim("attention_backward", d);
  const int64_t rows = int64_t(d.B) * d.T;
  const int64_t nq = rows * d.n_head * d.head_dim;  // ws holds attention_workspace_bytes(d) (ops_check.h)
  float* dq_acc = static_cast<float*>(ws.data);
  float* D = reinterpret_cast<float*>(static_cast<char*>(ws.data) + round256(size_t(nq) * 4));
  const bool dot_vec = dout.dtype == DType::BF16 && out.dtype == DType::BF16 && aligned16(dout.data) &&
                       aligned16(out.data) && (d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256);
  if (dot_vec) {
    const int64_t threads = rows * d.n_head * (d.head_dim / 8);
    const unsigned grid = unsigned((threads + 255) / 256);
    const bf16_t *g = dout.ptr<bf16_t>(), *o = out.ptr<bf16_t>();
    if (d.head_dim == 64)
      attn_bwd_dot_bf16_kernel<64><<<grid, 256, 0, L.stream>>>(D, g, o, d.B, d.T, d.n_head);
    else if (d.head_dim == 128)
      attn_bwd_dot_bf16_kernel<128><<<grid, 256, 0, L.stream>>>(D, g, o, d.B, d.T, d.n_head);
    else
      attn_bwd_dot_bf16_kernel<256><<<grid, 256, 0, L.stream>>>(D, g, o, d.B, d.T, d.n_head);
    CUDA_CHECK_LAUNCH();
  } else {
    const int64_t warps = rows * d.n_head;
    attn_bwd_dot_kernel<<<unsigned((warps + 7) / 8), 256, 0, L.stream>>>(D, din(dout), din(out), d.B, d.T, d.n_head,
                                                                         d.head_dim);
    CUDA_CHECK_LAUNCH();
  }
  const AttnPath path = g_path.load();
  // (the flash kernels add dQ into dq_acc by float4 atomics or TMA reduce-add: 16-byte aligned)
  const bool flash = path != AttnPath::Simple && (d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256) &&
                     all_bf16({&dq, &dk, &dv, &dout, &q, &k, &v}) && aligned16(dq_acc);
  if (flash && path == AttnPath::Auto && device_cc_major() == 9 && attention_sm90_backward_supported(d)) {
    CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, size_t(nq) * sizeof(float), L.stream));
    attention_backward_sm90(dq_acc, D, dk, dv, dout, q, k, v, lse, d, L);
    if (attention_sm90_dq_permuted(d.head_dim))
      dq_unpermute_bf16_kernel<<<grid_for(nq / 16, 256, L.num_sms), 256, 0, L.stream>>>(dq.ptr<bf16_t>(), dq_acc, nq);
    else
      f32_to_bf16_kernel<<<grid_for(nq / 8, 256, L.num_sms), 256, 0, L.stream>>>(dq.ptr<bf16_t>(), dq_acc, nq);
    CUDA_CHECK_LAUNCH();
    return;
  }
  if (flash) {
    const bool done = d.head_dim == 64 ? flash_backward_hd<64>(dq_acc, D, dq, dk, dv, dout, q, k, v, lse, d, L, path)
                      : d.head_dim == 128
                          ? flash_backward_hd<128>(dq_acc, D, dq, dk, dv, dout, q, k, v, lse, d, L, path)
                          : flash_backward_hd<256>(dq_acc, D, dq, dk, dv, dout, q, k, v, lse, d, L, path);
    if (done) return;
  }
  auto bwd = [&](auto dq_kernel, auto dkdv_kernel) {
    dq_kernel<<<unsigned((rows * d.n_head + 3) / 4), 128, 0, L.stream>>>(
        dout_(dq), din(dout), din(q), din(k), din(v), lse.ptr<float>(), D, pos_ptr(d), d.B, d.T, d.n_head, d.n_kv_head,
        d.head_dim, d.scale, d.window);
    CUDA_CHECK_LAUNCH();
    dkdv_kernel<<<unsigned((rows * d.n_kv_head + 3) / 4), 128, 0, L.stream>>>(
        dout_(dk), dout_(dv), din(dout), din(q), din(k), din(v), lse.ptr<float>(), D, pos_ptr(d), d.B, d.T, d.n_head,
        d.n_kv_head, d.head_dim, d.scale, d.window);
    CUDA_CHECK_LAUNCH();
  };
  if (simple_md(d.head_dim) == 8)
    bwd(attn_bwd_dq_simple_kernel<8>, attn_bwd_dkdv_simple_kernel<8>);
  else
    bwd(attn_bwd_dq_simple_kernel<16>, attn_bwd_dkdv_simple_kernel<16>);
}

}  // namespace sf::cuda
