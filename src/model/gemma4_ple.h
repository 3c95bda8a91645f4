#pragma once
// Gemma 4's per-layer inputs (PLE, ModelSpec::gemma4.ple_dim P > 0; docs/GEMMA4.md section 2),
// forward and backward from existing ops only (no kernels of their own):
//   model level: pli = (norm_pln(e @ W_plp^T * H^-1/2) + E_pl[ids] * sqrt(P)) * 2^-1/2, per layer
//   layer l:     y <- y + norm_ppl(gelu_tanh(y @ Wg^T) * pli_l @ Wp^T)   (before layer_scalar)
// pli is kept layer-major, [L*N, P]: layer l's rows are the contiguous slice [l*N, (l+1)*N), so a
// layer reads (and its backward writes) one plain [N, P] tensor. The model-level maths runs token-
// major ([N, L*P], transformers' layout) and moe_gather with k = 1 permutes between the two.
#include "backend/ops.h"
#include "core/tensor.h"
#include "model/layout.h"
#include "model/spec.h"

namespace sf {

// The two permutations between token-major row n*L + l and layer-major row l*N + n (I32, device
// memory: they depend on N and L only, so they are filled once per batch shape).
// order [L*N]: layer-major row -> token-major row; inverse [N*L]: token-major row -> layer-major row.
void ple_fill_permutations(int32_t* order, int32_t* inverse, int64_t N, int64_t L);

struct PleModelBuffers {
  Tensor tok;      // [N, L*P] act: E_pl[ids] * sqrt(P), then the sum before the permutation; backward: its gradient
  Tensor ctx;      // [N, L*P] act: e @ W_plp^T * H^-1/2 (the norm's input, kept for backward)
  Tensor rstd;     // [N*L] F32
  Tensor order;    // [L*N] I32 (ple_fill_permutations)
  Tensor inverse;  // [N*L] I32
  Tensor pad_row;  // [L*P] F32: the table gradient's padding row meanwhile (torch's padding_idx)
};

struct PleLayerBuffers {
  Tensor y_in;   // [N, H] act: the layer's output before its per-layer input (the gate's input)
  Tensor gate;   // [N, P] act: y_in @ Wg^T
  Tensor act;    // [N, P] act: gelu_tanh(gate) * pli_l; in backward its gradient
  Tensor u;      // [N, H] act: act @ Wp^T (the norm's input)
  Tensor rstd;   // [N] F32
  Tensor du;     // [N, H] act: backward only
  Tensor dgate;  // [N, P] act: backward only
};

class PleProgram {
 public:
  PleProgram(const ModelSpec& s, Ops& ops, DType act) : s_(s), ops_(ops), act_(act) {}

  // pli [L*N, P] from ids [N] I32 and e [N, H] (the scaled token embedding). The model-level
  // parameters: table [V_pl, L*P], proj [L*P, H], norm_w [P] (the embedding blob's PleEntry views).
  void inputs_forward(Tensor pli, Tensor ids, Tensor e, Tensor table, Tensor proj, Tensor norm_w,
                      const PleModelBuffers& b, Stream& st) const;
  // dpli [L*N, P] (all layers' gradients; overwritten as scratch) into de [N, H] (+=) and the
  // gradients dtable (F32; row pad_token_id keeps its value), dproj, dnorm_w (+=).
  void inputs_backward(Tensor de, Tensor dtable, Tensor dproj, Tensor dnorm_w, Tensor dpli, Tensor ids, Tensor e,
                       Tensor proj, Tensor norm_w, const PleModelBuffers& b, Stream& st) const;

  // y [N, H] += norm_ppl(gelu_tanh(y @ Wg^T) * pli_l @ Wp^T), pli_l [N, P]; p: the layer's views.
  void layer_forward(const LayerParams& p, Tensor y, Tensor pli_l, const PleLayerBuffers& b, Stream& st) const;
  // dy [N, H]: in, the gradient of the layer_forward's output; out, that of its input y. dpli_l
  // [N, P] = the gradient of pli_l (overwritten); g: the layer's gradient views (+=).
  void layer_backward(const LayerParams& p, const LayerParams& g, Tensor dy, Tensor dpli_l, Tensor pli_l,
                      const PleLayerBuffers& b, Stream& st) const;

 private:
  float table_scale() const;  // sqrt(P) in the compute dtype (HF's scaled embedding)
  const ModelSpec& s_;
  Ops& ops_;
  DType act_;
};

}  // namespace sf
