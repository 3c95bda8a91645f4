// Mixture-of-experts models (qwen3_moe, mixtral, olmoe) on the cpu backend: config parsing with
// transformers' defaults and names, the layer program's gradients (router, experts, q/k-norms and
// the load-balancing loss) against finite differences, and a checkpoint loaded and saved back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "backend/cpu/cpu_device.h"
#include "engine/blob_init.h"
#include "engine/resident_engine.h"
#include "io/checkpoint.h"
#include "model/layout.h"
#include "model/program.h"
#include "model/rope.h"
#include "model/spec.h"
#include "model_fixtures.h"
#include "test_util.h"
#include "train/model_io.h"
#include "train/presets.h"

namespace sf {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------- spec and layout

TEST(MoeSpec, FamiliesParseWithTransformersDefaults) {
  ModelSpec q = parse_model_spec(test::tiny_config("qwen3_moe"), "c.json");
  EXPECT_EQ(q.arch, Arch::Qwen3Moe);
  EXPECT_EQ(q.moe.n_expert, 5);
  EXPECT_EQ(q.moe.top_k, 2);
  EXPECT_EQ(q.moe.intermediate, 24);
  EXPECT_TRUE(q.moe.norm_topk);
  EXPECT_TRUE(q.qk_norm && !q.qk_norm_full);
  EXPECT_EQ(q.moe.is_moe, (std::vector<char>{1, 0, 1}));  // mlp_only_layers [1]
  EXPECT_TRUE(q.moe.aux_loss);
  EXPECT_DOUBLE_EQ(q.moe.aux_coef, 0.05);

  json c = test::tiny_config("qwen3_moe");
  c.erase("mlp_only_layers");
  c["decoder_sparse_step"] = 2;  // transformers: sparse iff (l + 1) % step == 0
  EXPECT_EQ(parse_model_spec(c, "c.json").moe.is_moe, (std::vector<char>{0, 1, 0}));
  c.erase("norm_topk_prob");
  c.erase("output_router_logits");
  c.erase("router_aux_loss_coef");
  const ModelSpec d = parse_model_spec(c, "c.json");
  EXPECT_FALSE(d.moe.norm_topk);
  EXPECT_FALSE(d.moe.aux_loss);
  EXPECT_DOUBLE_EQ(d.moe.aux_coef, 0.001);
  c["mlp_only_layers"] = {0, 1, 2};  // no sparse layer left: a dense model
  EXPECT_FALSE(parse_model_spec(c, "c.json").is_moe());

  ModelSpec m = parse_model_spec(test::tiny_config("mixtral"), "c.json");
  EXPECT_EQ(m.arch, Arch::Mixtral);
  EXPECT_EQ(m.moe.n_expert, 4);
  EXPECT_EQ(m.moe.intermediate, 20);
  EXPECT_TRUE(m.moe.norm_topk);  // mixtral always renormalises
  EXPECT_TRUE(m.moe.mixtral_names);
  json mc = test::tiny_config("mixtral");
  mc.erase("router_aux_loss_coef");
  EXPECT_DOUBLE_EQ(parse_model_spec(mc, "c.json").moe.aux_coef, 0.001);

  ModelSpec o = parse_model_spec(test::tiny_config("olmoe"), "c.json");
  EXPECT_EQ(o.arch, Arch::Olmoe);
  EXPECT_TRUE(o.qk_norm && o.qk_norm_full);
  EXPECT_FALSE(o.moe.norm_topk);
  EXPECT_FALSE(o.moe.aux_loss);
  json oc = test::tiny_config("olmoe");
  oc.erase("router_aux_loss_coef");
  EXPECT_DOUBLE_EQ(parse_model_spec(oc, "c.json").moe.aux_coef, 0.01);
}

TEST(MoeSpec, RefusesWhatIsNotSupported) {
  json c = test::tiny_config("mixtral");
  c["router_jitter_noise"] = 0.1;
  test::expect_input_error([&] { parse_model_spec(c, "c.json"); }, {"c.json", "router_jitter_noise"});
  json o = test::tiny_config("olmoe");
  o["clip_qkv"] = 8.0;
  test::expect_input_error([&] { parse_model_spec(o, "c.json"); }, {"c.json", "clip_qkv"});
  json q = test::tiny_config("qwen3_moe");
  q["num_experts_per_tok"] = 6;
  test::expect_input_error([&] { parse_model_spec(q, "c.json"); }, {"c.json", "num_experts_per_tok (6)"});
  q["num_experts_per_tok"] = 2;
  q["num_experts"] = 100000;
  test::expect_input_error([&] { parse_model_spec(q, "c.json"); }, {"c.json", "num_experts"});
  // OLMoE's and Mixtral's layers always route: no experts is refused (Qwen3-MoE's are then dense);
  // a sparse step of 0 is transformers' modulo by zero.
  o = test::tiny_config("olmoe");
  o["num_experts"] = 0;
  test::expect_input_error([&] { parse_model_spec(o, "c.json"); }, {"c.json: $.num_experts", "out of range [1,"});
  q = test::tiny_config("qwen3_moe");
  q["num_experts"] = 0;
  EXPECT_EQ(parse_model_spec(q, "c.json").moe.n_expert, 0);
  q = test::tiny_config("qwen3_moe");
  q["decoder_sparse_step"] = 0;
  test::expect_input_error([&] { parse_model_spec(q, "c.json"); }, {"c.json: $.decoder_sparse_step", "out of range"});
}

TEST(MoeLayout, HfNamesAndOneViewPerExpertMatrix) {
  const ModelSpec m = parse_model_spec(test::tiny_config("mixtral"), "c.json");
  const ModelLayout lm = make_layout(m);
  const BlobLayout& b = lm.layer(1);
  ASSERT_NE(b.entry(LayerParam::Router), nullptr);
  EXPECT_EQ(b.entry(LayerParam::Router)->name, "model.layers.1.block_sparse_moe.gate.weight");
  EXPECT_EQ(b.entry(LayerParam::ExpGate)->name, "model.layers.1.block_sparse_moe.experts.0.w1.weight");
  EXPECT_EQ(b.entry(LayerParam::ExpUp)->name, "model.layers.1.block_sparse_moe.experts.0.w3.weight");
  EXPECT_EQ(b.entry(LayerParam::ExpDown)->name, "model.layers.1.block_sparse_moe.experts.0.w2.weight");
  EXPECT_EQ(b.entry(LayerParam::ExpDown)->shape, (std::vector<int64_t>{32, 20}));
  EXPECT_EQ(b.entry(LayerParam::Wgate), nullptr);
  // The [E, stride] view covers the E consecutive entries of a kind, in expert order.
  std::vector<float> blob(size_t(b.numel));
  const LayerParams p = layer_views(b, blob.data(), DType::F32);
  const Tensor& up = p[LayerParam::ExpUp];
  ASSERT_EQ(up.ndim, 2);
  ASSERT_EQ(up.rows(), 4);
  ASSERT_EQ(up.cols(), 640);
  for (int e = 0; e < 4; ++e) {
    const BlobEntry* ent = nullptr;
    for (const auto& x : b.entries)
      if (x.name == "model.layers.1.block_sparse_moe.experts." + std::to_string(e) + ".w3.weight") ent = &x;
    ASSERT_NE(ent, nullptr) << e;
    EXPECT_EQ(static_cast<float*>(up.data) + e * 640, blob.data() + ent->offset) << e;
  }

  const ModelSpec q = parse_model_spec(test::tiny_config("qwen3_moe"), "c.json");
  const ModelLayout lq = make_layout(q);
  EXPECT_EQ(lq.layer(0).entry(LayerParam::Router)->name, "model.layers.0.mlp.gate.weight");
  EXPECT_EQ(lq.layer(0).entry(LayerParam::ExpGate)->name, "model.layers.0.mlp.experts.0.gate_proj.weight");
  EXPECT_EQ(lq.layer(1).entry(LayerParam::Router), nullptr);  // the dense layer
  EXPECT_EQ(lq.layer(1).entry(LayerParam::Wgate)->shape, (std::vector<int64_t>{48, 32}));
  const ModelSpec o = parse_model_spec(test::tiny_config("olmoe"), "c.json");
  EXPECT_EQ(make_layout(o).layer(0).entry(LayerParam::QNorm)->shape, (std::vector<int64_t>{32}));  // whole q
  EXPECT_EQ(make_layout(o).layer(0).entry(LayerParam::KNorm)->shape, (std::vector<int64_t>{16}));  // whole k

  for (const auto& fam : test::moe_families()) {  // every entry counted once, and nothing else
    const ModelSpec s = parse_model_spec(test::tiny_config(fam), "c.json");
    int64_t n = 0;
    for (const auto& bl : make_layout(s).blobs)
      for (const auto& e : bl.entries) n += e.numel;
    EXPECT_EQ(n, s.total_params()) << fam;
  }
}

// The published shapes: total and active parameters as their model cards give them.
TEST(MoeSpec, PresetParameterCounts) {
  auto counts = [](const std::string& name) {
    const ModelSpec s = parse_model_spec(preset_config(name), "preset " + name);
    int64_t active = 2 * s.vocab * s.hidden + s.hidden;  // untied embedding + head + final norm
    for (int l = 0; l < s.n_layer; ++l) active += s.layer_active_params(l);
    return std::pair<double, double>{double(s.total_params()) * 1e-9, double(active) * 1e-9};
  };
  auto [q_total, q_active] = counts("qwen3-30b-a3b");
  EXPECT_NEAR(q_total, 30.5, 0.1);
  EXPECT_NEAR(q_active, 3.3, 0.1);
  auto [m_total, m_active] = counts("mixtral-8x7b");
  EXPECT_NEAR(m_total, 46.7, 0.1);
  EXPECT_NEAR(m_active, 12.9, 0.1);
  auto [o_total, o_active] = counts("olmoe-1b-7b");
  EXPECT_NEAR(o_total, 6.9, 0.05);
  EXPECT_NEAR(o_active, 1.3, 0.05);
}

// ---------------------------------------------------------------- the layer program

// One MoE decoder layer through Program on the cpu device: L = <y, R> + the load-balancing loss
// of this layer's routing (weight w, counts held), against central differences of the program's
// own forward, for the input and a sample of every parameter. A step that changes a top-k choice
// would make the difference meaningless: such samples are detected (the routing is compared) and
// left out, and most must remain.
class MoeLayerGrad : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeLayerGrad, ProgramBackwardMatchesFiniteDifferences) {
  const ModelSpec s = parse_model_spec(test::tiny_config(GetParam()), "tiny");
  const ModelLayout lay = make_layout(s);
  const BlobLayout& blob = lay.layer(0);
  ASSERT_TRUE(s.moe_layer(0));
  auto dev = make_cpu_device();
  auto st = dev->create_stream();
  const int B = 2, T = 7;
  const int64_t N = B * T, H = s.hidden, E = s.moe.n_expert, k = s.moe.top_k;
  Workspace ws(*dev, s, B, T, DType::F32);
  const Program prog(s, dev->ops(), DType::F32);

  std::vector<float> params(size_t(blob.numel)), grads(size_t(blob.numel), 0.f);
  random_blob(blob, 1, 17, 0.3, params.data());
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const auto& e : blob.entries)  // non-trivial norms
    if (e.name.find("norm") != std::string::npos)
      for (int64_t i = 0; i < e.numel; ++i) params[size_t(e.offset + i)] = 1.f + 0.3f * nd(rng);
  std::vector<float> cos, sin;
  rope_tables(s, T, cos, sin);
  const RopeTables rope{test::view_of(cos, {T, s.head_dim / 2}), test::view_of(sin, {T, s.head_dim / 2}), {}, {}};
  auto x = test::randn(size_t(N * H), 5), R = test::randn(size_t(N * H), 6);
  std::vector<float> y(size_t(N * H)), dx(size_t(N * H)), stats(size_t(2 * E), 0.f);
  const float aux_w = 0.8f;  // large, so that the loss's gradient is a visible part of the total
  BatchDims d{B, T, {}};
  d.moe_stats = test::view_of(stats, {2 * E});
  d.moe_aux_weight = s.moe.aux_loss ? aux_w : 0.f;
  const double LN = double(s.moe.moe_layers()) * double(N);
  const double aux_scale = s.moe.aux_loss ? aux_w * double(E) / (LN * LN) : 0.0;
  const LayerBuffers w = ws.layer(d);

  std::vector<float> base_counts;
  std::vector<int32_t> base_idx;
  // Forward (statistics fresh); returns L with the counts held at the first forward's.
  auto forward = [&](std::vector<int32_t>* idx_out) {
    std::fill(stats.begin(), stats.end(), 0.f);
    d.moe_collect = true;
    prog.layer_forward(layer_views(blob, params.data(), DType::F32), test::view_of(x, {N, H}), test::view_of(y, {N, H}),
                       w, d, rope, *st);
    dev->synchronize(*st);
    d.moe_collect = false;
    if (idx_out) idx_out->assign(w.topk_idx.ptr<int32_t>(), w.topk_idx.ptr<int32_t>() + N * k);
    double l = test::dot(y, R);
    if (base_counts.empty()) base_counts.assign(stats.begin(), stats.begin() + E);
    for (int64_t e = 0; e < E; ++e) l += aux_scale * double(base_counts[size_t(e)]) * stats[size_t(E + e)];
    return l;
  };
  forward(&base_idx);
  prog.layer_backward(layer_views(blob, params.data(), DType::F32), layer_views(blob, grads.data(), DType::F32),
                      test::view_of(x, {N, H}), test::view_of(R, {N, H}), test::view_of(dx, {N, H}), w, d, rope, *st);
  dev->synchronize(*st);
  // With R = 0 the loss is the load-balancing term alone: its gradient (router and input) is
  // checked on its own below, where the expert path's larger gradient cannot hide a wrong scale.
  std::vector<float> g_aux(size_t(blob.numel), 0.f), dx_aux(size_t(N * H)), R0(size_t(N * H), 0.f);
  if (s.moe.aux_loss) {
    forward(nullptr);
    prog.layer_backward(layer_views(blob, params.data(), DType::F32), layer_views(blob, g_aux.data(), DType::F32),
                        test::view_of(x, {N, H}), test::view_of(R0, {N, H}), test::view_of(dx_aux, {N, H}), w, d, rope,
                        *st);
    dev->synchronize(*st);
    double norm = 0;
    for (float v : g_aux) norm += double(v) * v;
    EXPECT_GT(norm, 0.0) << "the load-balancing loss has no gradient";
  }

  const double eps = 1e-2;
  int skipped = 0, checked = 0;
  auto fd_check = [&](std::vector<float>& v, const std::vector<size_t>& idx, const std::vector<float>& g,
                      const std::string& what) {
    std::vector<double> num, ana;
    for (size_t i : idx) {
      const float v0 = v[i];
      std::vector<int32_t> ip, im;
      v[i] = v0 + float(eps);
      const double lp = forward(&ip);
      v[i] = v0 - float(eps);
      const double lm = forward(&im);
      v[i] = v0;
      if (ip != base_idx || im != base_idx) {
        ++skipped;
        continue;
      }
      ++checked;
      num.push_back((lp - lm) / (2 * eps));
      ana.push_back(g[i]);
    }
    EXPECT_LE(test::rel_err(ana, num), 5e-3) << GetParam() << " " << what;
  };
  fd_check(x, test::sample_indices(x.size(), 40, 1), dx, "dx");
  for (const auto& e : blob.entries) {
    std::vector<size_t> idx;
    for (size_t i : test::sample_indices(size_t(e.numel), 6, uint64_t(e.offset))) idx.push_back(size_t(e.offset) + i);
    fd_check(params, idx, grads, e.name);
  }
  if (s.moe.aux_loss) {
    R.assign(R.size(), 0.f);  // L = the load-balancing term alone
    fd_check(x, test::sample_indices(x.size(), 40, 2), dx_aux, "dx (load-balancing loss alone)");
    const BlobEntry* r = blob.entry(LayerParam::Router);
    std::vector<size_t> idx;
    for (size_t i : test::sample_indices(size_t(r->numel), 30, 3)) idx.push_back(size_t(r->offset) + i);
    fd_check(params, idx, g_aux, "router (load-balancing loss alone)");
  }
  EXPECT_GT(checked, 8 * skipped) << "too many finite-difference steps changed the routing";
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeLayerGrad, ::testing::ValuesIn(test::moe_families()));

// ---------------------------------------------------------------- checkpoints

// bf16 bits of normal(0, 0.5) values for every entry of `lay`, by name (a seed an entry).
std::map<std::string, std::vector<uint16_t>> random_bf16_entries(const ModelLayout& lay) {
  std::map<std::string, std::vector<uint16_t>> out;
  uint64_t seed = 0;
  for (const auto& b : lay.blobs)
    for (const auto& e : b.entries) {
      std::vector<uint16_t>& v = out[e.name];
      for (float f : test::randn(size_t(e.numel), ++seed, 0.5f)) v.push_back(float_to_bf16(f).bits);
    }
  return out;
}

// An engine that only loads and saves (no training buffers).
EngineOptions load_only() {
  EngineOptions eo;
  eo.max_batch = 1;
  eo.max_seq = 4;
  eo.training = false;
  return eo;
}

// A checkpoint under transformers' names (bf16, shuffled order) loads and saves back with the same
// names, shapes and bytes.
TEST(MoeCheckpoint, LoadAndSaveBackByteForByte) {
  for (const auto& fam : test::moe_families()) {
    SCOPED_TRACE(fam);
    test::TempDir dir;
    const json cfg = test::tiny_config(fam);
    const ModelSpec s = parse_model_spec(cfg, "tiny");
    const ModelLayout lay = make_layout(s);
    const auto bits = random_bf16_entries(lay);  // bf16 on disk
    std::vector<TensorWrite> tw;
    for (const auto& b : lay.blobs)
      for (const auto& e : b.entries) tw.push_back({e.name, DType::BF16, e.shape, bits.at(e.name).data()});
    std::mt19937_64 rng(9);
    std::shuffle(tw.begin(), tw.end(), rng);
    const std::string in = dir.file("in"), out = dir.file("out");
    write_checkpoint_tensors(in, tw);
    const EngineOptions eo = load_only();
    auto dev = make_cpu_device();
    ResidentEngine e(*dev, s, eo);
    e.load(CheckpointReader::open(in));
    save_hf_model(e, cfg, "", out, DType::BF16, size_t(1) << 30);
    const CheckpointReader a = CheckpointReader::open(in), b = CheckpointReader::open(out);
    auto sorted = [](std::vector<std::string> v) {
      std::sort(v.begin(), v.end());
      return v;
    };
    EXPECT_EQ(sorted(a.names()), sorted(b.names()));
    for (const auto& name : a.names()) {
      const TensorInfo* ta = a.find(name);
      const TensorInfo* tb = b.find(name);
      ASSERT_NE(tb, nullptr) << name;
      EXPECT_EQ(ta->shape, tb->shape) << name;
      EXPECT_EQ(tb->dtype, DType::BF16) << name;
      int64_t n = 1;
      for (int64_t dd : ta->shape) n *= dd;
      std::vector<float> va(static_cast<size_t>(n)), vb(static_cast<size_t>(n));
      a.read_f32(name, ta->shape, va.data());
      b.read_f32(name, tb->shape, vb.data());
      EXPECT_EQ(va, vb) << name;
    }
  }
}

// transformers v5's fused experts (save_pretrained(save_original_format=False)), made by hand from
// the per-expert tensors as transformers' conversion does it (stack the E matrices, then
// concatenate gate and up along dim 1): mlp.gate.weight [E, H] (Mixtral's block renamed mlp),
// mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]. Both layouts load to the
// same weights, each saves back in its own layout byte for byte, gradients are named as the file.
TEST(MoeCheckpoint, FusedExpertsLoadAndSaveBackInTheirLayout) {
  for (const auto& fam : test::moe_families()) {
    SCOPED_TRACE(fam);
    test::TempDir dir;
    const json cfg = test::tiny_config(fam);
    const ModelSpec s = parse_model_spec(cfg, "tiny");
    const ModelLayout lay = make_layout(s);
    const int64_t E = s.moe.n_expert, I = s.moe.intermediate, H = s.hidden;
    const std::string block = fam == "mixtral" ? "block_sparse_moe." : "mlp.";
    const char* kind[3] = {fam == "mixtral" ? "w1" : "gate_proj", fam == "mixtral" ? "w3" : "up_proj",
                           fam == "mixtral" ? "w2" : "down_proj"};
    const std::map<std::string, std::vector<uint16_t>> per = random_bf16_entries(lay);  // per-expert checkpoint
    std::map<std::string, std::vector<int64_t>> shape;
    for (const auto& b : lay.blobs)
      for (const auto& e : b.entries) shape[e.name] = e.shape;
    std::map<std::string, std::vector<uint16_t>> fused;
    std::map<std::string, std::vector<int64_t>> fshape;
    for (const auto& [name, v] : per) {
      if (name.find(".experts.") != std::string::npos) continue;
      std::string n = name;
      if (size_t at = n.find("block_sparse_moe.gate."); at != std::string::npos) n.replace(at, 16, "mlp");
      fused[n] = v;
      fshape[n] = shape[name];
    }
    int sparse_layers = 0;
    for (int l = 0; l < s.n_layer; ++l) {
      if (!s.moe_layer(l)) continue;
      ++sparse_layers;
      const std::string p = "model.layers." + std::to_string(l) + ".";
      auto expert = [&](int64_t e, int k) {
        return per.at(p + block + "experts." + std::to_string(e) + "." + kind[k] + ".weight");
      };
      std::vector<uint16_t> gu, dn;
      for (int64_t e = 0; e < E; ++e) {
        for (int k : {0, 1}) {
          const auto& m = expert(e, k);
          gu.insert(gu.end(), m.begin(), m.end());
        }
        const auto& d = expert(e, 2);
        dn.insert(dn.end(), d.begin(), d.end());
      }
      fused[p + "mlp.experts.gate_up_proj"] = gu;
      fshape[p + "mlp.experts.gate_up_proj"] = {E, 2 * I, H};
      fused[p + "mlp.experts.down_proj"] = dn;
      fshape[p + "mlp.experts.down_proj"] = {E, H, I};
    }
    ASSERT_GT(sparse_layers, 0);
    auto write = [&](const std::string& d, const std::map<std::string, std::vector<uint16_t>>& t,
                     const std::map<std::string, std::vector<int64_t>>& sh) {
      std::vector<TensorWrite> tw;
      for (const auto& [name, v] : t) tw.push_back({name, DType::BF16, sh.at(name), v.data()});
      write_checkpoint_tensors(d, tw);
    };
    const std::string in_per = dir.file("per"), in_fused = dir.file("fused");
    write(in_per, per, shape);
    write(in_fused, fused, fshape);

    ModelSpec sp = s, sf = s;
    adopt_checkpoint_names(sp, in_per);
    adopt_checkpoint_names(sf, in_fused);
    EXPECT_FALSE(sp.moe.fused_experts);
    ASSERT_TRUE(sf.moe.fused_experts);

    const EngineOptions eo = load_only();
    auto dev = make_cpu_device();
    ResidentEngine ep(*dev, sp, eo), ef(*dev, sf, eo);
    ep.load(CheckpointReader::open(in_per));
    ef.load(CheckpointReader::open(in_fused));
    for (size_t b = 0; b < lay.blobs.size(); ++b)
      for (size_t i = 0; i < lay.blobs[b].entries.size(); ++i) {
        std::vector<float> a(size_t(lay.blobs[b].entries[i].numel)), c(a.size());
        ep.read_state(Engine::State::Params, int(b), int(i), a.data());
        ef.read_state(Engine::State::Params, int(b), int(i), c.data());
        ASSERT_EQ(a, c) << lay.blobs[b].entries[i].name;
      }

    // Saved back: each in its own layout, the same names, shapes and bytes as its input.
    using Saved = std::tuple<ResidentEngine*, std::string, const std::map<std::string, std::vector<uint16_t>>*>;
    for (auto [engine, in, want] : {Saved{&ep, in_per, &per}, Saved{&ef, in_fused, &fused}}) {
      const std::string out = in + "_out";
      save_hf_model(*engine, cfg, "", out, DType::BF16, size_t(1) << 30);
      const CheckpointReader r = CheckpointReader::open(out);
      EXPECT_EQ(r.names().size(), want->size());
      for (const auto& [name, v] : *want) {
        const TensorInfo* t = r.find(name);
        ASSERT_NE(t, nullptr) << name;
        EXPECT_EQ(t->dtype, DType::BF16) << name;
        ASSERT_EQ(t->bytes, v.size() * 2) << name;
        EXPECT_EQ(std::memcmp(t->data, v.data(), t->bytes), 0) << name;
      }
    }

    // Gradient files are named as the model's file.
    const ModelLayout lf = make_layout(sf);
    std::vector<TensorWrite> tw;
    append_checkpoint_tensors(tw, ef, lf, Engine::State::Params);
    std::vector<std::string> names;
    for (const auto& w : tw) names.push_back(w.name);
    std::sort(names.begin(), names.end());
    std::vector<std::string> want;
    for (const auto& kv : fused) want.push_back(kv.first);
    EXPECT_EQ(names, want);
  }
}

// A fused checkpoint whose fused tensor has another shape (detected all the same), or one whose other layers keep the
// per-expert tensors, is refused naming the file and tensor.
TEST(MoeCheckpoint, FusedExpertsWithWrongShapesAreRefused) {
  test::TempDir dir;
  const json cfg = test::tiny_config("olmoe");
  ModelSpec s = parse_model_spec(cfg, "tiny");
  s.moe.fused_experts = true;
  const ModelLayout lay = make_layout(s);
  std::vector<std::vector<float>> vals;
  std::vector<TensorWrite> good;
  for (const auto& b : lay.blobs)
    for (const auto& t : b.stored) {
      int64_t n = 1;
      for (int64_t d : t.shape) n *= d;
      vals.push_back(std::vector<float>(size_t(n), 0.25f));
      good.push_back({t.name, DType::F32, t.shape, vals.back().data()});
    }
  const EngineOptions eo = load_only();
  auto dev = make_cpu_device();
  {  // gate_up holding the gate rows only ([E, I, H])
    std::vector<TensorWrite> tw = good;
    for (auto& w : tw)
      if (w.name == "model.layers.0.mlp.experts.gate_up_proj") w.shape[1] /= 2;
    const std::string d = dir.file("half");
    write_checkpoint_tensors(d, tw);
    ModelSpec sp = parse_model_spec(cfg, "tiny");
    adopt_checkpoint_names(sp, d);
    ResidentEngine e(*dev, sp, eo);
    test::expect_input_error([&] { e.load(CheckpointReader::open(d)); },
                             {"model.safetensors", "model.layers.0.mlp.experts.gate_up_proj", "has shape"});
  }
  {  // layer 1 keeps per-expert tensors: reported missing under the fused name
    std::vector<TensorWrite> tw;
    for (const auto& w : good)
      if (w.name.rfind("model.layers.1.mlp.experts.", 0) != 0) tw.push_back(w);
    const std::string d = dir.file("mixed");
    write_checkpoint_tensors(d, tw);
    ModelSpec sp = parse_model_spec(cfg, "tiny");
    adopt_checkpoint_names(sp, d);
    ResidentEngine e(*dev, sp, eo);
    test::expect_input_error([&] { e.load(CheckpointReader::open(d)); }, {"model.layers.1.mlp.experts.", "missing"});
  }
}

}  // namespace
}  // namespace sf
