#include "train/demo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "backend/device.h"
#include "core/error.h"
#include "core/log.h"
#include "data/dataset/dataset.h"
#include "engine/resident_engine.h"
#include "io/checkpoint.h"
#include "io/output_lock.h"
#include "train/model_io.h"
#include "train/schedule.h"

namespace sf {

namespace {

// Tokens: digits 0-9 are ids 0-9, '+' 10, '=' 11, end 12. A problem "a+b=" is followed by the
// sum's three digits least-significant first (the order a person adds in), then end:
// 07+35= -> 240$. Only the answer and end are trained.
constexpr int kPlus = 10, kEq = 11, kEnd = 12, kVocab = 16;
constexpr int kAnswer = 4;  // 3 digits + end

Record problem(int a, int b) {
  Record r;
  r.ids = {a / 10, a % 10, kPlus, b / 10, b % 10, kEq};
  int s = a + b;
  for (int i = 0; i < 3; ++i, s /= 10) r.ids.push_back(s % 10);
  r.ids.push_back(kEnd);
  r.labels.assign(r.ids.size(), kIgnoreIndex);
  for (size_t t = r.ids.size() - kAnswer; t < r.ids.size(); ++t) r.labels[t] = r.ids[t];
  return r;
}

nlohmann::json demo_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", kVocab},
          {"hidden_size", 64},
          {"intermediate_size", 192},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 16},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"initializer_range", 0.05},
          {"tie_word_embeddings", true},
          {"hidden_act", "silu"},
          {"torch_dtype", "float32"}};
}

struct Score {
  double loss = 0, accuracy = 0;
};

// Exact match under greedy decoding: with teacher forcing, the greedy answer is right exactly
// when every answer position's argmax is the right token.
Score score(ResidentEngine& e, const std::vector<Record>& set, int B) {
  Score s;
  int64_t correct = 0, trained = 0;
  double loss_sum = 0;
  for (size_t i = 0; i < set.size(); i += size_t(B)) {
    std::vector<const Record*> group;
    for (size_t j = i; j < std::min(set.size(), i + size_t(B)); ++j) group.push_back(&set[j]);
    Batch b = make_batch(group, 16);
    std::vector<float> logits = e.logits(b);
    for (int r = 0; r < b.B; ++r) {
      bool ok = true;
      for (int t = 0; t < b.T; ++t) {
        int32_t target = b.targets[size_t(r) * b.T + t];
        if (target == kIgnoreIndex) continue;
        const float* row = logits.data() + (size_t(r) * b.T + t) * kVocab;
        float mx = *std::max_element(row, row + kVocab);
        double z = 0;
        for (int v = 0; v < kVocab; ++v) z += std::exp(double(row[v] - mx));
        loss_sum += std::log(z) + mx - row[target];
        ++trained;
        ok = ok && int(std::max_element(row, row + kVocab) - row) == target;
      }
      correct += ok;
    }
  }
  s.loss = loss_sum / double(trained);
  s.accuracy = double(correct) / double(set.size());
  return s;
}

void write_jsonl(const std::string& path, const std::vector<Record>& set) {
  std::ofstream f(path);
  for (const Record& r : set) {
    f << nlohmann::json{{"input_ids", r.ids}, {"labels", r.labels}}.dump() << "\n";
  }
  if (!f) input_error(path, "cannot write");
}

}  // namespace

DemoResult run_demo(const DemoOptions& o) {
  const OutputLock lock(o.output);  // one run per output
  claim_output_dir(o.output);       // a directory that is not ours is refused before any work
  namespace fs = std::filesystem;
  auto t_start = std::chrono::steady_clock::now();
  // All 10,000 problems, split at random: 1,000 held out, never trained on.
  std::vector<std::pair<int, int>> all;
  for (int a = 0; a < 100; ++a)
    for (int b = 0; b < 100; ++b) all.push_back({a, b});
  std::mt19937_64 rng(o.seed);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<Record> heldout, train;
  for (size_t i = 0; i < all.size(); ++i) (i < 1000 ? heldout : train).push_back(problem(all[i].first, all[i].second));

  nlohmann::json cfg = demo_config();
  ModelSpec spec = parse_model_spec(cfg, "demo config");
  auto dev = make_device(o.device);
  const int B = 64;
  EngineOptions eo;
  eo.max_batch = B;
  eo.max_seq = 16;
  ResidentEngine engine(*dev, spec, eo);
  engine.init_random(o.seed);
  log_info(
      "demo: a %.0fK-parameter Llama-style model learns 2-digit addition on %s (%zu training problems, %zu "
      "held out)",
      double(spec.total_params()) / 1e3, dev->name().c_str(), train.size(), heldout.size());

  DemoResult r;
  Score before = score(engine, heldout, B);
  r.accuracy_before = before.accuracy;
  r.loss_before = before.loss;
  log_info("before: held-out loss %.4f, exact-match accuracy %.1f%%", before.loss, 100 * before.accuracy);

  RecordOrder order(train.size(), true, o.seed);
  uint64_t next = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    std::vector<const Record*> group;
    for (int i = 0; i < B; ++i) group.push_back(&train[order.at(next++)]);
    Batch b = make_batch(group, 16);
    Engine::StepParams sp;
    sp.adamw.lr = float(3e-3 * lr_multiplier(LrSchedule::Cosine, step, o.steps, 20));
    sp.adamw.beta2 = 0.98f;
    sp.adamw.weight_decay = 0.01f;
    sp.adamw.step = step + 1;
    sp.max_grad_norm = 1.0;
    const double loss = engine.step({b}, sp).loss;
    const AdamWParams& ap = sp.adamw;
    if ((step + 1) % 50 == 0 || step == 0) {
      log_info("step %lld/%lld loss %.4f lr %.2e", (long long)(step + 1), (long long)o.steps, loss, double(ap.lr));
    }
  }
  Score after = score(engine, heldout, B);
  r.accuracy_after = after.accuracy;
  r.loss_after = after.loss;
  log_info("after:  held-out loss %.4f, exact-match accuracy %.1f%%", after.loss, 100 * after.accuracy);

  StagedDir staged(o.output);
  save_hf_model(engine, cfg, "", staged.path(), DType::F32, 5'000'000'000);
  write_jsonl((fs::path(staged.path()) / "heldout.jsonl").string(), heldout);
  staged.commit();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  log_info("saved the model to %s (%.1f s); check it with:\n  slideformer eval --model %s --data %s/heldout.jsonl",
           o.output.c_str(), secs, o.output.c_str(), o.output.c_str());
  return r;
}

}  // namespace sf
