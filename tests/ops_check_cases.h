// Calls of the kernel table with one bad argument each, every operation and every kind of bad
// argument (dtype, missing tensor, element count, shape, aliasing, scalar, workspace): the front
// (backend/ops_check.h) must refuse each one, on the caller's thread, naming the op and the
// argument. Shared by the cpu test (tests/test_ops_check.cpp) and the cuda one
// (tests/gpu/test_cuda_ops_check.cpp), so both backends' tables are held to the same list.
//
// `base` is device memory of the backend (at least kBadCallBytes); nothing reads or writes it when
// the front works, since no call reaches the backend.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "backend/device.h"
#include "test_util.h"

namespace sf::test_ops_check {

constexpr size_t kBadCallBytes = size_t(1) << 20;

struct BadCall {
  std::string name;      // for the failure report
  std::string expected;  // a part of the message
  std::function<void(Ops&, Stream&)> call;
};

inline std::vector<BadCall> bad_calls(char* base, Ops& ops) {
  constexpr DType F32 = DType::F32, BF16 = DType::BF16, I32 = DType::I32;
  // Tensors at 4 KiB slots of base: distinct slots never overlap; the same slot aliases.
  auto at = [base](int slot, DType t, std::initializer_list<int64_t> dims) {
    return Tensor(base + size_t(slot) * 4096, t, dims);
  };
  std::vector<BadCall> c;
  auto add = [&c](std::string name, std::string expected, std::function<void(Ops&, Stream&)> f) {
    c.push_back(BadCall{std::move(name), std::move(expected), std::move(f)});
  };

  // matmul
  add("matmul shapes", "matmul: shapes do not match", [=](Ops& o, Stream& s) {
    o.matmul(at(0, F32, {2, 2}), at(1, F32, {2, 3}), at(2, F32, {2, 3}), false, false, 1, 0, s);
  });
  add("matmul dtype", "matmul: a [2, 3] I32 must be a non-empty F32 or BF16", [=](Ops& o, Stream& s) {
    o.matmul(at(0, F32, {2, 2}), at(1, I32, {2, 3}), at(2, F32, {2, 3}), false, true, 1, 0, s);
  });
  add("matmul missing", "matmul: b (empty)", [=](Ops& o, Stream& s) {
    o.matmul(at(0, F32, {2, 2}), at(1, F32, {2, 3}), Tensor(), false, true, 1, 0, s);
  });
  add("matmul alias", "matmul: out overlaps b", [=](Ops& o, Stream& s) {
    o.matmul(at(0, F32, {2, 2}), at(1, F32, {2, 3}), at(0, F32, {2, 3}), false, true, 1, 0, s);
  });
  add("matmul_add shapes", "matmul_add: shapes do not match", [=](Ops& o, Stream& s) {
    o.matmul_add(at(0, F32, {2, 2}), at(1, F32, {2, 3}), at(2, F32, {2, 3}), false, false, at(3, F32, {2, 2}), s);
  });
  add("matmul_add c dtype", "matmul_add: c [2, 2] BF16", [=](Ops& o, Stream& s) {
    o.matmul_add(at(0, F32, {2, 2}), at(1, F32, {2, 3}), at(2, F32, {2, 3}), false, true, at(3, BF16, {2, 2}), s);
  });
  add("matmul_add c numel", "matmul_add: c", [=](Ops& o, Stream& s) {
    o.matmul_add(at(0, F32, {2, 2}), at(1, F32, {2, 3}), at(2, F32, {2, 3}), false, true, at(3, F32, {2, 3}), s);
  });
  add("matmul_add c overlaps out", "matmul_add: out overlaps c", [=](Ops& o, Stream& s) {
    o.matmul_add(at(0, F32, {2, 2}), at(1, F32, {2, 3}), at(2, F32, {2, 3}), false, true,
                 Tensor(static_cast<char*>(at(0, F32, {1}).data) + 4, F32, {2, 2}), s);
  });
  add("matmul_add c overlaps a", "matmul_add: c overlaps a", [=](Ops& o, Stream& s) {
    o.matmul_add(at(0, F32, {2, 2}), at(1, F32, {2, 3}), at(2, F32, {2, 3}), false, true, at(1, F32, {2, 2}), s);
  });
  // bias
  add("add_bias numel", "add_bias: bias [3] F32 has 3 elements, expected N (columns of out) = 2",
      [=](Ops& o, Stream& s) {
        o.add_bias(at(0, F32, {4, 2}), at(1, F32, {3}), s);
      });
  add("bias_backward numel", "bias_backward: dbias [3] BF16 has 3 elements", [=](Ops& o, Stream& s) {
    o.bias_backward(at(0, BF16, {3}), at(1, F32, {4, 2}), s);
  });
  // rmsnorm
  add("rmsnorm_forward w", "rmsnorm_forward: w [7] F32 has 7 elements, expected C = 8", [=](Ops& o, Stream& s) {
    o.rmsnorm_forward(at(0, F32, {4, 8}), at(1, F32, {4}), at(2, F32, {4, 8}), at(3, F32, {7}), 1e-5f, s);
  });
  add("rmsnorm_forward rstd dtype", "rmsnorm_forward: rstd [4] BF16 must be a non-empty F32", [=](Ops& o, Stream& s) {
    o.rmsnorm_forward(at(0, F32, {4, 8}), at(1, BF16, {4}), at(2, F32, {4, 8}), at(3, F32, {8}), 1e-5f, s);
  });
  add("rmsnorm_backward rstd missing", "rmsnorm_backward: rstd (empty) must be a non-empty F32",
      [=](Ops& o, Stream& s) {
        o.rmsnorm_backward(at(0, F32, {4, 8}), at(1, F32, {8}), at(2, F32, {4, 8}), at(3, F32, {4, 8}), at(4, F32, {8}),
                           Tensor(), false, s);
      });
  add("rmsnorm_backward dw", "rmsnorm_backward: dw [9] F32 has 9 elements, expected C = 8", [=](Ops& o, Stream& s) {
    o.rmsnorm_backward(at(0, F32, {4, 8}), at(1, F32, {9}), at(2, F32, {4, 8}), at(3, F32, {4, 8}), at(4, F32, {8}),
                       at(5, F32, {4}), false, s);
  });
  // rope: x [B*T = 4, 2 heads * 8], tables [T_max, 4]
  add("rope_forward head_dim", "rope_forward: T = 2, n_heads = 2, head_dim = 7", [=](Ops& o, Stream& s) {
    o.rope_forward(at(0, F32, {4, 14}), at(1, F32, {4, 3}), at(2, F32, {4, 3}), 2, 2, 7, Tensor(), s);
  });
  add("rope_forward x", "rope_forward: x [4, 12] F32 is not [B*T, n_heads*head_dim]", [=](Ops& o, Stream& s) {
    o.rope_forward(at(0, F32, {4, 12}), at(1, F32, {4, 4}), at(2, F32, {4, 4}), 2, 2, 8, Tensor(), s);
  });
  add("rope_forward pos", "rope_forward: pos [4] F32 must be a non-empty I32", [=](Ops& o, Stream& s) {
    o.rope_forward(at(0, F32, {4, 16}), at(1, F32, {4, 4}), at(2, F32, {4, 4}), 2, 2, 8, at(3, F32, {4}), s);
  });
  add("rope_backward table", "rope_backward: sin [1, 4] F32 is not [T_max >= T, head_dim/2]", [=](Ops& o, Stream& s) {
    o.rope_backward(at(0, BF16, {4, 16}), at(1, F32, {4, 4}), at(2, F32, {1, 4}), 2, 2, 8, Tensor(), s);
  });
  // swiglu
  add("swiglu_forward numel", "swiglu_forward: up [5] F32 has 5 elements, expected numel(gate) = 6",
      [=](Ops& o, Stream& s) { o.swiglu_forward(at(0, F32, {6}), at(1, F32, {6}), at(2, F32, {5}), s); });
  add("swiglu_backward dtype", "swiglu_backward: dout [6] I32 must be a non-empty F32 or BF16", [=](Ops& o, Stream& s) {
    o.swiglu_backward(at(0, F32, {6}), at(1, F32, {6}), at(2, I32, {6}), at(3, F32, {6}), at(4, F32, {6}), s);
  });
  // attention: B = 1, T = 4, n_head = 4, n_kv_head = 2, head_dim = 8 -> q, out [4, 32]; k, v [4, 16]; lse [16]
  AttnDims d;
  d.B = 1, d.T = 4, d.n_head = 4, d.n_kv_head = 2, d.head_dim = 8, d.scale = 0.35f;
  AttnDims d_bad = d;
  d_bad.n_kv_head = 3;
  add("attention_forward dims", "attention_forward: bad dims", [=](Ops& o, Stream& s) {
    o.attention_forward(at(0, F32, {4, 32}), at(1, F32, {16}), at(2, F32, {4, 32}), at(3, F32, {4, 24}),
                        at(4, F32, {4, 24}), d_bad, s);
  });
  add("attention_forward k", "attention_forward: k [4, 24] F32 is not [B*T, n_kv_head*head_dim]",
      [=](Ops& o, Stream& s) {
        o.attention_forward(at(0, F32, {4, 32}), at(1, F32, {16}), at(2, F32, {4, 32}), at(3, F32, {4, 24}),
                            at(4, F32, {4, 16}), d, s);
      });
  add("attention_forward lse", "attention_forward: lse (empty) must be a non-empty F32", [=](Ops& o, Stream& s) {
    o.attention_forward(at(0, F32, {4, 32}), Tensor(), at(2, F32, {4, 32}), at(3, F32, {4, 16}), at(4, F32, {4, 16}), d,
                        s);
  });
  add("attention_forward alias", "attention_forward: out overlaps q", [=](Ops& o, Stream& s) {
    o.attention_forward(at(2, BF16, {4, 32}), at(1, F32, {16}), at(2, BF16, {4, 32}), at(3, BF16, {4, 16}),
                        at(4, BF16, {4, 16}), d, s);
  });
  AttnDims d_pos = d;
  d_pos.pos = at(5, I32, {3});
  add("attention_forward pos", "attention_forward: pos [3] I32 has 3 elements, expected B*T = 4",
      [=](Ops& o, Stream& s) {
        o.attention_forward(at(0, F32, {4, 32}), at(1, F32, {16}), at(2, F32, {4, 32}), at(3, F32, {4, 16}),
                            at(4, F32, {4, 16}), d_pos, s);
      });
  const size_t attn_ws = ops.attention_workspace_bytes(d);
  const Tensor attn_ws_t = at(20, I32, {int64_t(attn_ws / 4)});
  add("attention_backward dk", "attention_backward: dk [4, 8] F32 has 32 elements, expected numel(k) = 64",
      [=](Ops& o, Stream& s) {
        o.attention_backward(at(6, F32, {4, 32}), at(7, F32, {4, 8}), at(8, F32, {4, 16}), at(9, F32, {4, 32}),
                             at(2, F32, {4, 32}), at(3, F32, {4, 16}), at(4, F32, {4, 16}), at(0, F32, {4, 32}),
                             at(1, F32, {16}), d, attn_ws_t, s);
      });
  add("attention_backward alias", "attention_backward: a gradient output", [=](Ops& o, Stream& s) {
    o.attention_backward(at(6, F32, {4, 32}), at(7, F32, {4, 16}), at(3, F32, {4, 16}), at(9, F32, {4, 32}),
                         at(2, F32, {4, 32}), at(3, F32, {4, 16}), at(4, F32, {4, 16}), at(0, F32, {4, 32}),
                         at(1, F32, {16}), d, attn_ws_t, s);
  });
  if (attn_ws > 0) {  // the cpu backend needs none
    add("attention_backward workspace", "attention_backward: workspace", [=](Ops& o, Stream& s) {
      o.attention_backward(at(6, F32, {4, 32}), at(7, F32, {4, 16}), at(8, F32, {4, 16}), at(9, F32, {4, 32}),
                           at(2, F32, {4, 32}), at(3, F32, {4, 16}), at(4, F32, {4, 16}), at(0, F32, {4, 32}),
                           at(1, F32, {16}), d, at(20, I32, {int64_t(attn_ws / 4) - 1}), s);
    });
  }
  // linear cross-entropy: x [N = 4, H = 8], w [V = 16, 8], labels [4]
  const size_t ce_ws = ops.linear_ce_workspace_bytes(4, 8, 16);
  const Tensor ce_ws_t = at(40, I32, {int64_t(ce_ws / 4)});
  add("linear_ce labels", "linear_cross_entropy: labels [4] F32 must be a non-empty I32", [=](Ops& o, Stream& s) {
    o.linear_cross_entropy(at(0, F32, {1}), Tensor(), Tensor(), at(1, F32, {4, 8}), at(2, F32, {16, 8}),
                           at(3, F32, {4}), 1.f, ce_ws_t, s);
  });
  add("linear_ce w", "linear_cross_entropy: w [16, 6] F32 is not [V, H]", [=](Ops& o, Stream& s) {
    o.linear_cross_entropy(at(0, F32, {1}), Tensor(), Tensor(), at(1, F32, {4, 8}), at(2, F32, {16, 6}),
                           at(3, I32, {4}), 1.f, ce_ws_t, s);
  });
  add("linear_ce loss_sum", "linear_cross_entropy: loss_sum [2] F32 has 2 elements, expected 1",
      [=](Ops& o, Stream& s) {
        o.linear_cross_entropy(at(0, F32, {2}), Tensor(), Tensor(), at(1, F32, {4, 8}), at(2, F32, {16, 8}),
                               at(3, I32, {4}), 1.f, ce_ws_t, s);
      });
  add("linear_ce dx alias", "linear_cross_entropy: dx overlaps w", [=](Ops& o, Stream& s) {
    o.linear_cross_entropy(at(0, F32, {1}), at(2, F32, {4, 8}), Tensor(), at(1, F32, {4, 8}), at(2, F32, {16, 8}),
                           at(3, I32, {4}), 1.f, ce_ws_t, s);
  });
  add("linear_ce dw", "linear_cross_entropy: dw [16, 7] F32 has 112 elements, expected V*H (of w) = 128",
      [=](Ops& o, Stream& s) {
        o.linear_cross_entropy(at(0, F32, {1}), Tensor(), at(5, F32, {16, 7}), at(1, F32, {4, 8}), at(2, F32, {16, 8}),
                               at(3, I32, {4}), 1.f, ce_ws_t, s);
      });
  add("linear_ce workspace", "linear_cross_entropy: workspace", [=](Ops& o, Stream& s) {
    o.linear_cross_entropy(at(0, F32, {1}), Tensor(), Tensor(), at(1, F32, {4, 8}), at(2, F32, {16, 8}),
                           at(3, I32, {4}), 1.f, at(40, I32, {int64_t(ce_ws / 4) - 1}), s);
  });
  // embedding: table [V = 10, H = 8], ids [N = 4]
  add("embedding_forward ids dtype", "embedding_forward: ids [4] F32 must be a non-empty I32", [=](Ops& o, Stream& s) {
    o.embedding_forward(at(0, F32, {4, 8}), at(1, F32, {4}), at(2, F32, {10, 8}), s);
  });
  add("embedding_forward out", "embedding_forward: out [4, 6] F32 is not [N, H]", [=](Ops& o, Stream& s) {
    o.embedding_forward(at(0, F32, {4, 6}), at(1, I32, {4}), at(2, F32, {10, 8}), s);
  });
  add("embedding_forward ids numel", "embedding_forward: ids [5] I32 has 5 elements, expected N (rows of out) = 4",
      [=](Ops& o, Stream& s) {
        o.embedding_forward(at(0, F32, {4, 8}), at(1, I32, {5}), at(2, F32, {10, 8}), s);
      });
  add("embedding_backward dout", "embedding_backward: dout [4, 6] BF16 is not [N, H]", [=](Ops& o, Stream& s) {
    o.embedding_backward(at(0, F32, {10, 8}), at(1, BF16, {4, 6}), at(2, I32, {4}), s);
  });
  add("ids_or_zero dtype", "ids_or_zero: ids [4] F32 must be a non-empty I32",
      [=](Ops& o, Stream& s) { o.ids_or_zero(at(0, I32, {4}), at(1, F32, {4}), 10, s); });
  add("ids_or_zero numel", "ids_or_zero: ids [5] I32 has 5 elements, expected the elements of out = 4",
      [=](Ops& o, Stream& s) { o.ids_or_zero(at(0, I32, {4}), at(1, I32, {5}), 10, s); });
  add("ids_or_zero limit", "ids_or_zero: limit 0 must be at least 1",
      [=](Ops& o, Stream& s) { o.ids_or_zero(at(0, I32, {4}), at(1, I32, {4}), 0, s); });
  // element-wise
  add("add numel", "add: b [5] F32 has 5 elements, expected numel(out) = 6",
      [=](Ops& o, Stream& s) { o.add(at(0, F32, {6}), at(1, F32, {6}), at(2, F32, {5}), s); });
  add("add dtype", "add: a [6] I32 must be a non-empty F32 or BF16",
      [=](Ops& o, Stream& s) { o.add(at(0, F32, {6}), at(1, I32, {6}), at(2, F32, {6}), s); });
  add("scale dtype", "scale: x [6] I32 must be a non-empty F32 or BF16",
      [=](Ops& o, Stream& s) { o.scale(at(0, I32, {6}), 2.f, s); });
  add("cast numel", "cast: in [5] F32 has 5 elements, expected numel(out) = 6",
      [=](Ops& o, Stream& s) { o.cast(at(0, BF16, {6}), at(1, F32, {5}), s); });
  add("cast dtypes", "cast: cannot convert in [6] I32 to out [6] F32",
      [=](Ops& o, Stream& s) { o.cast(at(0, F32, {6}), at(1, I32, {6}), s); });
  add("cast alias", "cast: out overlaps in",
      [=](Ops& o, Stream& s) { o.cast(at(0, BF16, {6}), Tensor(base + 2, F32, {6}), s); });
  add("zero no data", "zero: x (empty) has no data", [=](Ops& o, Stream& s) { o.zero(Tensor(nullptr, F32, {6}), s); });
  add("sq_norm out dtype", "sq_norm: out [1] BF16 must be a non-empty F32",
      [=](Ops& o, Stream& s) { o.sq_norm(at(0, BF16, {1}), at(1, F32, {6}), s); });
  add("sq_norm out numel", "sq_norm: out [2] F32 has 2 elements, expected 1",
      [=](Ops& o, Stream& s) { o.sq_norm(at(0, F32, {2}), at(1, F32, {6}), s); });
  // adamw
  AdamWParams p;
  p.lr = 1e-3f;
  AdamWParams p0 = p;
  p0.step = 0;
  add("adamw step", "adamw: step must be >= 1 (1-based), got 0", [=](Ops& o, Stream& s) {
    o.adamw(at(0, F32, {6}), at(1, BF16, {6}), at(2, F32, {6}), at(3, F32, {6}), Tensor(), p0, s);
  });
  // m and v: both F32, or both BF16 (compact optimizer state)
  add("adamw m, v dtypes differ", "adamw: v [6] F32 must be a non-empty BF16 tensor", [=](Ops& o, Stream& s) {
    o.adamw(at(0, F32, {6}), at(1, BF16, {6}), at(2, BF16, {6}), at(3, F32, {6}), Tensor(), p, s);
  });
  add("adamw m dtype", "adamw: m [6] I32 must be a non-empty F32 or BF16 tensor", [=](Ops& o, Stream& s) {
    o.adamw(at(0, F32, {6}), at(1, BF16, {6}), at(2, I32, {6}), at(3, I32, {6}), Tensor(), p, s);
  });
  add("adamw grad numel", "adamw: grad [5] F32 has 5 elements, expected numel(param) = 6", [=](Ops& o, Stream& s) {
    o.adamw(at(0, F32, {6}), at(1, F32, {5}), at(2, F32, {6}), at(3, F32, {6}), Tensor(), p, s);
  });
  add("adamw param_copy numel", "adamw: param_copy [7] BF16 has 7 elements", [=](Ops& o, Stream& s) {
    o.adamw(at(0, F32, {6}), at(1, F32, {6}), at(2, F32, {6}), at(3, F32, {6}), at(4, BF16, {7}), p, s);
  });
  // mixture of experts
  add("moe_route probs dtype", "moe_route: probs [3, 4] BF16 must be a non-empty F32 tensor", [=](Ops& o, Stream& s) {
    o.moe_route(at(0, BF16, {3, 4}), at(1, I32, {3, 2}), at(2, F32, {3, 2}), Tensor(), at(3, F32, {3, 4}), true, s);
  });
  add("moe_route k > E", "moe_route: logits [3, 2] F32 is not [N, E] with E >= k", [=](Ops& o, Stream& s) {
    o.moe_route(at(0, F32, {3, 2}), at(1, I32, {3, 3}), at(2, F32, {3, 3}), Tensor(), at(3, F32, {3, 2}), true, s);
  });
  add("moe_route stats numel", "moe_route: stats [4] F32 has 4 elements, expected 2*E = 8", [=](Ops& o, Stream& s) {
    o.moe_route(at(0, F32, {3, 4}), at(1, I32, {3, 2}), at(2, F32, {3, 2}), at(4, F32, {4}), at(3, F32, {3, 4}), false,
                s);
  });
  add("moe_route_backward counts", "moe_route_backward: counts [3] F32 has 3 elements, expected E = 4",
      [=](Ops& o, Stream& s) {
        o.moe_route_backward(at(0, F32, {3, 4}), at(1, F32, {3, 2}), at(2, F32, {3, 4}), at(3, I32, {3, 2}), true,
                             at(4, F32, {3}), 1.f, s);
      });
  add("moe_permute slots", "moe_permute: slot_pos [5] I32 has 5 elements, expected N*k = 6", [=](Ops& o, Stream& s) {
    o.moe_permute(at(0, I32, {5}), at(1, I32, {6}), at(2, I32, {5}), at(3, I32, {3, 2}), s);
  });
  add("moe_gather rows", "moe_gather: xs [5, 4] F32 is not [N*k, H]", [=](Ops& o, Stream& s) {
    o.moe_gather(at(0, F32, {5, 4}), at(1, F32, {3, 4}), at(2, I32, {5}), 2, s);
  });
  add("moe_gather_backward alias", "moe_gather_backward: dx overlaps dxs", [=](Ops& o, Stream& s) {
    o.moe_gather_backward(at(0, F32, {3, 4}), at(0, F32, {6, 4}), at(2, I32, {6}), 2, s);
  });
  add("moe_grouped_matmul stride", "moe_grouped_matmul: w [2, 10] F32 is not [E, stride >= 12]",
      [=](Ops& o, Stream& s) {
        o.moe_grouped_matmul(at(0, F32, {5, 4}), at(1, F32, {5, 3}), at(2, F32, {2, 10}), at(3, I32, {3}), true, 0, s);
      });
  add("moe_grouped_matmul offsets", "moe_grouped_matmul: offsets [2] I32 has 2 elements, expected E+1",
      [=](Ops& o, Stream& s) {
        o.moe_grouped_matmul(at(0, F32, {5, 4}), at(1, F32, {5, 3}), at(2, F32, {2, 12}), at(3, I32, {2}), true, 0, s);
      });
  add("moe_grouped_matmul_wgrad rows", "moe_grouped_matmul_wgrad: dy [4, 4] F32 is not [M, Nout]",
      [=](Ops& o, Stream& s) {
        o.moe_grouped_matmul_wgrad(at(0, F32, {2, 12}), at(1, F32, {4, 4}), at(2, F32, {5, 3}), at(3, I32, {3}), s);
      });
  add("moe_combine weights dtype", "moe_combine: weights [3, 2] BF16 must be a non-empty F32 tensor",
      [=](Ops& o, Stream& s) {
        o.moe_combine(at(0, F32, {3, 4}), at(1, F32, {6, 4}), at(2, BF16, {3, 2}), at(3, I32, {6}), s);
      });
  add("moe_combine_backward dweights", "moe_combine_backward: dweights [5] F32 has 5 elements", [=](Ops& o, Stream& s) {
    o.moe_combine_backward(at(0, F32, {6, 4}), at(4, F32, {5}), at(5, F32, {3, 4}), at(1, F32, {6, 4}),
                           at(2, F32, {3, 2}), at(3, I32, {6}), s);
  });
  add("moe_aux_loss stats", "moe_aux_loss: stats [3] F32 is not [2, E]",
      [=](Ops& o, Stream& s) { o.moe_aux_loss(at(0, F32, {1}), at(1, F32, {3}), 1.f, s); });
  add("moe_expert_scale idx dtype", "moe_expert_scale: idx [3, 2] F32 must be a non-empty I32 tensor",
      [=](Ops& o, Stream& s) {
        o.moe_expert_scale(at(0, F32, {3, 2}), at(1, F32, {3, 2}), at(2, F32, {3, 2}), at(3, F32, {4}), s);
      });
  add("moe_expert_scale_backward dscale", "moe_expert_scale_backward: dscale [5] F32 has 5 elements",
      [=](Ops& o, Stream& s) {
        o.moe_expert_scale_backward(at(0, F32, {3, 2}), at(4, F32, {5}), at(1, F32, {3, 2}), at(2, F32, {3, 2}),
                                    at(3, I32, {3, 2}), at(5, F32, {4}), s);
      });
  return c;
}

// Every bad call is refused by the front (ops_check.h) with its message; nothing reaches the stream.
inline void expect_all_refused(Device& dev) {
  char* base = static_cast<char*>(dev.alloc(kBadCallBytes));
  auto s = dev.create_stream();
  Ops& ops = dev.ops();
  const auto calls = bad_calls(base, ops);
  EXPECT_GE(calls.size(), size_t(46));
  for (const BadCall& bc : calls) {
    SCOPED_TRACE(bc.name);
    test::expect_check_failure([&] { bc.call(ops, *s); }, "ops_check.h", bc.expected);
  }
  dev.synchronize(*s);  // nothing was queued, nothing failed on the stream
  dev.free(base);
}

}  // namespace sf::test_ops_check
