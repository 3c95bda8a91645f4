#include "model/gemma4_ple.h"

#include <cmath>

#include "core/dtype.h"
#include "core/error.h"

namespace sf {

void ple_fill_permutations(int32_t* order, int32_t* inverse, int64_t N, int64_t L) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t l = 0; l < L; ++l) {
      order[l * N + n] = int32_t(n * L + l);
      inverse[n * L + l] = int32_t(l * N + n);
    }
}

// H^-1/2 as transformers has it: the Python double rounded once to fp32 (1/sqrt(float(H)) rounds
// twice and differs by an ulp for some H, e.g. the E2B's 1536).
static float inv_sqrt_hidden(const ModelSpec& s) { return float(1.0 / std::sqrt(double(s.hidden))); }

float PleProgram::table_scale() const {
  const float f = std::sqrt(float(s_.gemma4.ple_dim));
  return act_ == DType::BF16 ? bf16_to_float(float_to_bf16(f)) : f;
}

void PleProgram::inputs_forward(Tensor pli, Tensor ids, Tensor e, Tensor table, Tensor proj, Tensor norm_w,
                                const PleModelBuffers& b, Stream& st) const {
  const int64_t N = e.rows(), P = s_.gemma4.ple_dim, LP = int64_t(s_.n_layer) * P;
  const Tensor tok = b.tok.view({N, LP}), ctx = b.ctx.view({N, LP});
  ops_.embedding_forward(tok, ids, table, st);
  ops_.scale(tok, table_scale(), st);
  ops_.matmul(ctx, e, proj, false, true, 1.f, 0.f, st);
  ops_.scale(ctx, inv_sqrt_hidden(s_), st);  // HF: the product, then the scale
  // The normalised projection goes through pli (free until the permutation writes it).
  const Tensor normed = pli.view({N * s_.n_layer, P});
  ops_.rmsnorm_forward(normed, b.rstd, ctx.view({N * s_.n_layer, P}), norm_w, float(s_.rms_eps), st);
  ops_.add(tok, tok, normed.view({N, LP}), st);
  ops_.scale(tok, float(M_SQRT1_2), st);
  ops_.moe_gather(pli.view({N * s_.n_layer, P}), tok.view({N * s_.n_layer, P}), b.order, 1, st);
}

void PleProgram::inputs_backward(Tensor de, Tensor dtable, Tensor dproj, Tensor dnorm_w, Tensor dpli, Tensor ids,
                                 Tensor e, Tensor proj, Tensor norm_w, const PleModelBuffers& b, Stream& st) const {
  const int64_t N = e.rows(), P = s_.gemma4.ple_dim, L = s_.n_layer, LP = L * P;
  const Tensor dsum = b.tok.view({N * L, P});
  ops_.moe_gather_backward(dsum, dpli.view({N * L, P}), b.inverse, 1, st);
  ops_.scale(dsum, float(M_SQRT1_2), st);
  // The norm's branch: d(ctx) into dpli (consumed above).
  const Tensor dctx = dpli.view({N * L, P});
  ops_.rmsnorm_backward(dctx, dnorm_w, dsum, b.ctx.view({N * L, P}), norm_w, b.rstd, false, st);
  ops_.scale(dctx, inv_sqrt_hidden(s_), st);
  ops_.matmul(dproj, dctx.view({N, LP}), e, true, false, 1.f, 1.f, st);
  ops_.matmul(de, dctx.view({N, LP}), proj, false, false, 1.f, 1.f, st);
  // The table's branch, with torch's padding_idx: the pad row keeps its value.
  ops_.scale(dsum, table_scale(), st);
  Tensor row;
  if (s_.pad_token_id >= 0) {
    SF_CHECK(dtable.dtype == DType::F32 && b.pad_row.bytes() >= size_t(LP) * 4, "ple inputs_backward: pad row");
    row = Tensor(static_cast<float*>(dtable.data) + int64_t(s_.pad_token_id) * LP, DType::F32, {LP});
    ops_.cast(b.pad_row.view({LP}), row, st);
  }
  ops_.embedding_backward(dtable, dsum.view({N, LP}), ids, st);
  if (!row.empty()) ops_.cast(row, b.pad_row.view({LP}), st);
}

void PleProgram::layer_forward(const LayerParams& p, Tensor y, Tensor pli_l, const PleLayerBuffers& b,
                               Stream& st) const {
  using P = LayerParam;
  ops_.cast(b.y_in, y, st);  // same dtype: a copy
  ops_.matmul(b.gate, b.y_in, p[P::PleGate], false, true, 1.f, 0.f, st);
  ops_.geglu_forward(b.act, b.gate, pli_l, st);
  ops_.matmul(b.u, b.act, p[P::PleProj], false, true, 1.f, 0.f, st);
  ops_.rmsnorm_forward(y, b.rstd, b.u, p[P::PleNorm], float(s_.rms_eps), st);
  ops_.add(y, y, b.y_in, st);  // residual
}

void PleProgram::layer_backward(const LayerParams& p, const LayerParams& g, Tensor dy, Tensor dpli_l, Tensor pli_l,
                                const PleLayerBuffers& b, Stream& st) const {
  using P = LayerParam;
  ops_.rmsnorm_backward(b.du, g[P::PleNorm], dy, b.u, p[P::PleNorm], b.rstd, false, st);
  ops_.matmul(g[P::PleProj], b.du, b.act, true, false, 1.f, 1.f, st);
  const Tensor dact = b.act;  // act is no longer needed
  ops_.matmul(dact, b.du, p[P::PleProj], false, false, 1.f, 0.f, st);
  ops_.geglu_backward(b.dgate, dpli_l, dact, b.gate, pli_l, st);
  ops_.matmul(g[P::PleGate], b.dgate, b.y_in, true, false, 1.f, 1.f, st);
  ops_.matmul(dy, b.dgate, p[P::PleGate], false, false, 1.f, 1.f, st);  // dy: the residual's + the gate's
}

}  // namespace sf
