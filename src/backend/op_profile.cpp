#include "backend/op_profile.h"

#include <algorithm>
#include <cstdio>

namespace sf {
namespace {

constexpr size_t kNoStop = size_t(-1);

double nb(const Tensor& t) { return t.empty() ? 0.0 : double(t.bytes()); }

std::string dims(const Tensor& t) {
  std::string s;
  for (int i = 0; i < t.ndim; ++i) s += (i ? "x" : "") + std::to_string(t.shape[i]);
  return s;
}

// Causal attention's matrix FLOPs a forward: QK^T and PV over the lower triangle (half the T x T
// scores), 2 FLOPs a multiply-add. Windows and packed rows do less; this counts the full triangle.
double attn_fwd_flops(const AttnDims& d) {
  return 2.0 * 2.0 * double(d.B) * d.n_head * d.head_dim * (double(d.T) * (d.T + 1) / 2.0);
}

// The recording table: times each call of the inner table with a pair of events on its stream and
// counts its FLOPs and bytes.
class ProfilingOps final : public Ops {
 public:
  ProfilingOps(ProfiledDevice& dev, Ops& inner) : dev_(dev), in_(inner) {}

  void matmul(Tensor out, Tensor a, Tensor b, bool ta, bool tb, float alpha, float beta, Stream& s) override {
    const int64_t K = ta ? a.rows() : a.cols();
    const std::string key = std::string("matmul ") + dims(out) + " K" + std::to_string(K) + (ta ? " T" : " N") +
                            (tb ? "T" : "N") + (out.dtype == DType::F32 ? " f32" : "") + (beta != 0.f ? " +=" : "");
    run(s, key, {2.0 * double(out.rows()) * out.cols() * K, nb(a) + nb(b) + nb(out) * (beta != 0.f ? 2 : 1)},
        [&] { in_.matmul(out, a, b, ta, tb, alpha, beta, s); });
  }
  void matmul_add(Tensor out, Tensor a, Tensor b, bool ta, bool tb, Tensor c, Stream& s) override {
    const int64_t K = ta ? a.rows() : a.cols();
    const std::string key = std::string("matmul_add ") + dims(out) + " K" + std::to_string(K) + (ta ? " T" : " N") +
                            (tb ? "T" : "N") + (out.dtype == DType::F32 ? " f32" : "");
    run(s, key, {2.0 * double(out.rows()) * out.cols() * K, nb(a) + nb(b) + nb(out) + nb(c)},
        [&] { in_.matmul_add(out, a, b, ta, tb, c, s); });
  }
  void add_bias(Tensor out, Tensor bias, Stream& s) override {
    run(s, "add_bias " + dims(out), {0, 2 * nb(out) + nb(bias)}, [&] { in_.add_bias(out, bias, s); });
  }
  void bias_backward(Tensor dbias, Tensor dout, Stream& s) override {
    run(s, "bias_backward " + dims(dout), {0, nb(dout) + 2 * nb(dbias)}, [&] { in_.bias_backward(dbias, dout, s); });
  }
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, Stream& s) override {
    norm_fwd("rmsnorm_forward ", &Ops::rmsnorm_forward, out, rstd, x, w, eps, s);
  }
  void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool acc,
                        Stream& s) override {
    norm_bwd("rmsnorm_backward ", &Ops::rmsnorm_backward, dx, dw, dout, x, w, rstd, acc, s);
  }
  void rmsnorm_1p_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, Stream& s) override {
    norm_fwd("rmsnorm_1p_forward ", &Ops::rmsnorm_1p_forward, out, rstd, x, w, eps, s);
  }
  void rmsnorm_1p_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool acc,
                           Stream& s) override {
    norm_bwd("rmsnorm_1p_backward ", &Ops::rmsnorm_1p_backward, dx, dw, dout, x, w, rstd, acc, s);
  }
  void rope_forward(Tensor x, Tensor cos, Tensor sin, int T, int nh, int hd, Tensor pos, Stream& s) override {
    run(s, "rope_forward " + dims(x), {0, 2 * nb(x) + nb(pos)},
        [&] { in_.rope_forward(x, cos, sin, T, nh, hd, pos, s); });
  }
  void rope_backward(Tensor dx, Tensor cos, Tensor sin, int T, int nh, int hd, Tensor pos, Stream& s) override {
    run(s, "rope_backward " + dims(dx), {0, 2 * nb(dx) + nb(pos)},
        [&] { in_.rope_backward(dx, cos, sin, T, nh, hd, pos, s); });
  }
  void swiglu_forward(Tensor out, Tensor gate, Tensor up, Stream& s) override {
    glu_fwd("swiglu_forward ", &Ops::swiglu_forward, out, gate, up, s);
  }
  void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, Stream& s) override {
    glu_bwd("swiglu_backward ", &Ops::swiglu_backward, dgate, dup, dout, gate, up, s);
  }
  void geglu_forward(Tensor out, Tensor gate, Tensor up, Stream& s) override {
    glu_fwd("geglu_forward ", &Ops::geglu_forward, out, gate, up, s);
  }
  void geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, Stream& s) override {
    glu_bwd("geglu_backward ", &Ops::geglu_backward, dgate, dup, dout, gate, up, s);
  }
  void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d, Stream& s) override {
    run(s, "attention_forward " + dims(q) + " hd" + std::to_string(d.head_dim),
        {attn_fwd_flops(d), nb(out) + nb(lse) + nb(q) + nb(k) + nb(v)},
        [&] { in_.attention_forward(out, lse, q, k, v, d, s); });
  }
  // Backward: five products of the forward's size (S = QK^T again, dP, dV, dQ, dK): 2.5x.
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                          Tensor lse, const AttnDims& d, Tensor ws, Stream& s) override {
    run(s, "attention_backward " + dims(q) + " hd" + std::to_string(d.head_dim),
        {2.5 * attn_fwd_flops(d), nb(dq) + nb(dk) + nb(dv) + nb(dout) + nb(q) + nb(k) + nb(v) + nb(out) + nb(lse)},
        [&] { in_.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d, ws, s); });
  }
  size_t attention_workspace_bytes(const AttnDims& d) const override { return in_.attention_workspace_bytes(d); }
  // x [N,H] @ w[V,H]^T a pass; dx and dw one product each more.
  void linear_cross_entropy(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels, float gs,
                            Tensor ws, Stream& s) override {
    const double one = 2.0 * double(x.rows()) * x.cols() * w.rows();
    const int passes = 1 + (dx.empty() ? 0 : 1) + (dw.empty() ? 0 : 1);
    run(s, "linear_cross_entropy " + dims(x) + " V" + std::to_string(w.rows()),
        {one * passes, nb(x) + nb(w) + nb(labels) + nb(dx) + 2 * nb(dw)},
        [&] { in_.linear_cross_entropy(loss_sum, dx, dw, x, w, labels, gs, ws, s); });
  }
  void linear_cross_entropy_capped(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels, float gs,
                                   float cap, Tensor ws, Stream& s) override {
    const double one = 2.0 * double(x.rows()) * x.cols() * w.rows();
    const int passes = 1 + (dx.empty() ? 0 : 1) + (dw.empty() ? 0 : 1);
    run(s, "linear_cross_entropy_capped " + dims(x) + " V" + std::to_string(w.rows()),
        {one * passes, nb(x) + nb(w) + nb(labels) + nb(dx) + 2 * nb(dw)},
        [&] { in_.linear_cross_entropy_capped(loss_sum, dx, dw, x, w, labels, gs, cap, ws, s); });
  }
  size_t linear_ce_workspace_bytes(int64_t N, int64_t H, int64_t V) const override {
    return in_.linear_ce_workspace_bytes(N, H, V);
  }
  void embedding_forward(Tensor out, Tensor ids, Tensor table, Stream& s) override {
    run(s, "embedding_forward " + dims(out), {0, 2 * nb(out) + nb(ids)},
        [&] { in_.embedding_forward(out, ids, table, s); });
  }
  void embedding_backward(Tensor dtable, Tensor dout, Tensor ids, Stream& s) override {
    // the rows it touches, read and written (the table's dtype), and the gradient read
    const double rows = double(dout.rows()) * dout.cols() * dtype_size(dtable.dtype);
    run(s, "embedding_backward " + dims(dout), {0, nb(dout) + nb(ids) + 2 * rows},
        [&] { in_.embedding_backward(dtable, dout, ids, s); });
  }
  void ids_or_zero(Tensor out, Tensor ids, int64_t limit, Stream& s) override {
    run(s, "ids_or_zero " + dims(out), {0, nb(out) + nb(ids)}, [&] { in_.ids_or_zero(out, ids, limit, s); });
  }
  void add(Tensor out, Tensor a, Tensor b, Stream& s) override {
    run(s, "add " + dims(out), {0, nb(out) + nb(a) + nb(b)}, [&] { in_.add(out, a, b, s); });
  }
  void scale(Tensor x, float alpha, Stream& s) override {
    run(s, "scale " + dims(x), {0, 2 * nb(x)}, [&] { in_.scale(x, alpha, s); });
  }
  void cast(Tensor out, Tensor in, Stream& s) override {
    run(s, std::string("cast ") + dtype_name(in.dtype) + "->" + dtype_name(out.dtype), {0, nb(out) + nb(in)},
        [&] { in_.cast(out, in, s); });
  }
  void zero(Tensor x, Stream& s) override {
    run(s, "zero", {0, nb(x)}, [&] { in_.zero(x, s); });
  }
  void sq_norm(Tensor out, Tensor x, Stream& s) override {
    run(s, "sq_norm", {0, nb(x)}, [&] { in_.sq_norm(out, x, s); });
  }
  void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, Tensor logits, bool renorm,
                 Stream& s) override {
    run(s, "moe_route", {0, nb(probs) + nb(idx) + nb(weights) + nb(stats) + nb(logits)},
        [&] { in_.moe_route(probs, idx, weights, stats, logits, renorm, s); });
  }
  void moe_route_backward(Tensor dlogits, Tensor dweights, Tensor probs, Tensor idx, bool renorm, Tensor counts,
                          float aux, Stream& s) override {
    run(s, "moe_route_backward", {0, nb(dlogits) + nb(dweights) + nb(probs) + nb(idx) + nb(counts)},
        [&] { in_.moe_route_backward(dlogits, dweights, probs, idx, renorm, counts, aux, s); });
  }
  void moe_permute(Tensor offsets, Tensor sorted_slot, Tensor slot_pos, Tensor idx, Stream& s) override {
    run(s, "moe_permute", {0, nb(offsets) + nb(sorted_slot) + nb(slot_pos) + nb(idx)},
        [&] { in_.moe_permute(offsets, sorted_slot, slot_pos, idx, s); });
  }
  void moe_gather(Tensor xs, Tensor x, Tensor sorted_slot, int k, Stream& s) override {
    run(s, "moe_gather " + dims(xs), {0, 2 * nb(xs) + nb(sorted_slot)},
        [&] { in_.moe_gather(xs, x, sorted_slot, k, s); });
  }
  void moe_gather_backward(Tensor dx, Tensor dxs, Tensor slot_pos, int k, Stream& s) override {
    run(s, "moe_gather_backward " + dims(dxs), {0, nb(dx) + nb(dxs) + nb(slot_pos)},
        [&] { in_.moe_gather_backward(dx, dxs, slot_pos, k, s); });
  }
  void moe_grouped_matmul(Tensor out, Tensor a, Tensor w, Tensor offsets, bool trans_w, float beta,
                          Stream& s) override {
    // every row of a meets one expert's [K, Nout]; the experts' weights are read once each
    const double f = 2.0 * double(a.rows()) * a.cols() * out.cols();
    run(s, "moe_grouped_matmul " + dims(out) + " K" + std::to_string(a.cols()),
        {f, nb(a) + nb(w) + nb(out) * (beta != 0.f ? 2 : 1)},
        [&] { in_.moe_grouped_matmul(out, a, w, offsets, trans_w, beta, s); });
  }
  void moe_grouped_matmul_wgrad(Tensor dw, Tensor dy, Tensor x, Tensor offsets, Stream& s) override {
    const double f = 2.0 * double(dy.rows()) * dy.cols() * x.cols();
    run(s, "moe_grouped_matmul_wgrad " + dims(dy) + " K" + std::to_string(x.cols()),
        {f, nb(dy) + nb(x) + 2 * nb(dw)}, [&] { in_.moe_grouped_matmul_wgrad(dw, dy, x, offsets, s); });
  }
  void moe_combine(Tensor y, Tensor ys, Tensor weights, Tensor slot_pos, Stream& s) override {
    run(s, "moe_combine " + dims(y), {0, nb(y) + nb(ys) + nb(weights) + nb(slot_pos)},
        [&] { in_.moe_combine(y, ys, weights, slot_pos, s); });
  }
  void moe_combine_backward(Tensor dys, Tensor dweights, Tensor dy, Tensor ys, Tensor weights, Tensor slot_pos,
                            Stream& s) override {
    run(s, "moe_combine_backward " + dims(dy), {0, nb(dys) + nb(dweights) + nb(dy) + nb(ys) + nb(weights)},
        [&] { in_.moe_combine_backward(dys, dweights, dy, ys, weights, slot_pos, s); });
  }
  void moe_aux_loss(Tensor loss_sum, Tensor stats, float scale, Stream& s) override {
    run(s, "moe_aux_loss", {0, nb(stats)}, [&] { in_.moe_aux_loss(loss_sum, stats, scale, s); });
  }
  void moe_expert_scale(Tensor out, Tensor w, Tensor idx, Tensor scale, Stream& s) override {
    run(s, "moe_expert_scale " + dims(w), {0, nb(out) + nb(w) + nb(idx)},
        [&] { in_.moe_expert_scale(out, w, idx, scale, s); });
  }
  void moe_expert_scale_backward(Tensor dw, Tensor dscale, Tensor dout, Tensor w, Tensor idx, Tensor scale,
                                 Stream& s) override {
    run(s, "moe_expert_scale_backward " + dims(w), {0, nb(dw) + nb(dout) + nb(w) + nb(idx)},
        [&] { in_.moe_expert_scale_backward(dw, dscale, dout, w, idx, scale, s); });
  }
  // param, m, v read and written; grad read; the copy written.
  void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor copy, const AdamWParams& p, Stream& s) override {
    run(s, "adamw", {0, 2 * (nb(param) + nb(m) + nb(v)) + nb(grad) + nb(copy)},
        [&] { in_.adamw(param, grad, m, v, copy, p, s); });
  }

 private:
  // The two RMSNorm flavours count alike: x, w read, out and rstd written; backward: dout, x, w,
  // rstd read, dx written (read too when accumulating), dw read and written.
  using NormFwd = void (Ops::*)(Tensor, Tensor, Tensor, Tensor, float, Stream&);
  using NormBwd = void (Ops::*)(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, bool, Stream&);
  void norm_fwd(const char* name, NormFwd f, Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, Stream& s) {
    run(s, name + dims(x), {0, nb(out) + nb(rstd) + nb(x) + nb(w)}, [&] { (in_.*f)(out, rstd, x, w, eps, s); });
  }
  void norm_bwd(const char* name, NormBwd f, Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd,
                bool acc, Stream& s) {
    run(s, name + dims(x), {0, nb(dx) * (acc ? 2 : 1) + 2 * nb(dw) + nb(dout) + nb(x) + nb(w) + nb(rstd)},
        [&] { (in_.*f)(dx, dw, dout, x, w, rstd, acc, s); });
  }
  // The gated units (SwiGLU, GeGLU): every tensor read or written once.
  using GluFwd = void (Ops::*)(Tensor, Tensor, Tensor, Stream&);
  using GluBwd = void (Ops::*)(Tensor, Tensor, Tensor, Tensor, Tensor, Stream&);
  void glu_fwd(const char* name, GluFwd f, Tensor out, Tensor gate, Tensor up, Stream& s) {
    run(s, name + dims(out), {0, nb(out) + nb(gate) + nb(up)}, [&] { (in_.*f)(out, gate, up, s); });
  }
  void glu_bwd(const char* name, GluBwd f, Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, Stream& s) {
    run(s, name + dims(dout), {0, nb(dgate) + nb(dup) + nb(dout) + nb(gate) + nb(up)},
        [&] { (in_.*f)(dgate, dup, dout, gate, up, s); });
  }
  template <class F>
  void run(Stream& s, std::string key, OpCount n, F&& f) {
    const size_t rec = dev_.begin(s);
    f();
    dev_.end(rec, s, std::move(key), n);
  }
  ProfiledDevice& dev_;
  Ops& in_;
};

std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
  char buf[96];
  std::snprintf(buf, sizeof buf, f, a, b, c, d);
  return buf;
}

}  // namespace

double OpRow::floor_seconds(const OpCeilings& c) const {
  return std::max(flops / c.matrix_flops, bytes / c.memory_bytes);
}

ProfiledDevice::ProfiledDevice(std::unique_ptr<Device> inner)
    : inner_(std::move(inner)), table_(std::make_unique<ProfilingOps>(*this, inner_->ops())) {}

ProfiledDevice::~ProfiledDevice() = default;

Ops& ProfiledDevice::ops() { return *table_; }

Event& ProfiledDevice::event_at(size_t i) {
  while (pool_.size() <= i) pool_.push_back(inner_->create_timing_event());
  return *pool_[i];
}

size_t ProfiledDevice::begin(Stream& s) {
  std::lock_guard<std::mutex> lk(mu_);
  Rec r;
  r.start = next_++;
  r.stop = kNoStop;
  inner_->record(event_at(r.start), s);
  recs_.push_back(r);
  return recs_.size() - 1;
}

void ProfiledDevice::end(size_t rec, Stream& s, std::string key, OpCount n) {
  std::lock_guard<std::mutex> lk(mu_);
  Rec& r = recs_[rec];
  r.stop = next_++;
  inner_->record(event_at(r.stop), s);
  auto it = row_of_.find(key);
  int si = 0;
  while (si < int(streams_.size()) && streams_[size_t(si)] != &s) ++si;
  if (si == int(streams_.size())) {
    streams_.push_back(&s);
    stream_s_.push_back(0);
  }
  if (it == row_of_.end()) {
    it = row_of_.emplace(key, int(rows_.size())).first;
    OpRow row;
    row.key = std::move(key);
    row.stream = si;
    rows_.push_back(std::move(row));
  }
  OpRow& row = rows_[size_t(it->second)];
  row.calls += 1;
  row.flops += n.flops;
  row.bytes += n.bytes;
  r.row = it->second;
  r.stream = si;
}

void ProfiledDevice::collect() {
  std::lock_guard<std::mutex> lk(mu_);
  for (const Rec& r : recs_) {
    if (r.stop == kNoStop) continue;  // the op threw
    inner_->synchronize(*pool_[r.stop]);
    const double t = inner_->elapsed_seconds(*pool_[r.start], *pool_[r.stop]);
    rows_[size_t(r.row)].seconds += t;
    stream_s_[size_t(r.stream)] += t;
  }
  recs_.clear();
  next_ = 0;
}

void ProfiledDevice::reset() {
  collect();
  std::lock_guard<std::mutex> lk(mu_);
  rows_.clear();
  row_of_.clear();
  std::fill(stream_s_.begin(), stream_s_.end(), 0.0);
}

std::vector<OpRow> ProfiledDevice::rows() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<OpRow> r = rows_;
  std::stable_sort(r.begin(), r.end(), [](const OpRow& a, const OpRow& b) { return a.seconds > b.seconds; });
  return r;
}

std::vector<double> ProfiledDevice::stream_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stream_s_;
}

std::string ProfiledDevice::table(const OpCeilings& c, int64_t steps, double step_seconds, size_t top) const {
  const std::vector<OpRow> rs = rows();
  const double per = 1.0 / double(std::max<int64_t>(steps, 1));
  std::string out = fmt("op profile: %.0f steps of %.1f ms; ceilings %.0f TFLOP/s matrix, %.0f GB/s memory\n",
                        double(steps), step_seconds * 1e3, c.matrix_flops * 1e-12, c.memory_bytes * 1e-9);
  char line[320];
  std::snprintf(line, sizeof line, "%-58s %6s %9s %6s %8s %8s %9s %6s %3s\n", "op", "calls", "ms/step", "%step",
                "TFLOP/s", "GB/s", "floor ms", "eff", "st");
  out += line;
  double sum = 0, floor_sum = 0;
  OpRow rest;
  rest.key = "(other ops)";
  for (size_t i = 0; i < rs.size(); ++i) {
    const OpRow& r = rs[i];
    sum += r.seconds;
    floor_sum += r.floor_seconds(c);
    if (i >= top) {
      rest.calls += r.calls, rest.seconds += r.seconds, rest.flops += r.flops, rest.bytes += r.bytes;
      continue;
    }
    const double t = std::max(r.seconds, 1e-12);
    std::snprintf(line, sizeof line, "%-58s %6.0f %9.2f %6.1f %8.1f %8.0f %9.2f %6.2f %3d\n", r.key.c_str(),
                  double(r.calls) * per, r.seconds * per * 1e3, 100.0 * r.seconds * per / step_seconds,
                  r.flops / t * 1e-12, r.bytes / t * 1e-9, r.floor_seconds(c) * per * 1e3,
                  r.floor_seconds(c) / t, r.stream);
    out += line;
  }
  if (rest.calls) {
    std::snprintf(line, sizeof line, "%-58s %6.0f %9.2f %6.1f %8s %8s %9.2f\n", rest.key.c_str(),
                  double(rest.calls) * per, rest.seconds * per * 1e3, 100.0 * rest.seconds * per / step_seconds, "",
                  "", rest.floor_seconds(c) * per * 1e3);
    out += line;
  }
  out += fmt("sum of ops %.1f ms/step (%.1f %% of the step), their floor %.1f ms/step\n", sum * per * 1e3,
             100.0 * sum * per / step_seconds, floor_sum * per * 1e3);
  const std::vector<double> ss = stream_seconds();
  for (size_t i = 0; i < ss.size(); ++i)
    out += fmt("stream %.0f: ops busy %.1f ms/step (%.1f %% of the step)\n", double(i), ss[i] * per * 1e3,
               100.0 * ss[i] * per / step_seconds);
  return out;
}

nlohmann::json ProfiledDevice::json(const OpCeilings& c, int64_t steps, double step_seconds) const {
  const double per = 1.0 / double(std::max<int64_t>(steps, 1));
  nlohmann::json rows = nlohmann::json::array();
  for (const OpRow& r : this->rows())
    rows.push_back({{"op", r.key},
                    {"calls_per_step", double(r.calls) * per},
                    {"ms_per_step", r.seconds * per * 1e3},
                    {"share_of_step", r.seconds * per / step_seconds},
                    {"flops_per_step", r.flops * per},
                    {"bytes_per_step", r.bytes * per},
                    {"floor_ms_per_step", r.floor_seconds(c) * per * 1e3},
                    {"stream", r.stream}});
  nlohmann::json streams = nlohmann::json::array();
  for (double s : stream_seconds()) streams.push_back(s * per * 1e3);
  return {{"rows", rows},
          {"stream_busy_ms_per_step", streams},
          {"matrix_tflops_ceiling", c.matrix_flops * 1e-12},
          {"memory_gbps_ceiling", c.memory_bytes * 1e-9}};
}

}  // namespace sf
