#include "train/trainer.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/test_hooks.h"
#include "core/units.h"
#include "data/template/chat.h"
#include "data/dataset/dataset.h"
#include "data/dataset/pack.h"
#include "data/tokenizer/tokenizer.h"
#include "engine/make_engine.h"
#include "io/checkpoint.h"
#include "io/json_file.h"
#include "io/output_lock.h"
#include "io/safetensors.h"
#include "io/written_paths.h"
#include "model/layout.h"
#include "train/model_io.h"
#include "train/progress.h"
#include "train/schedule.h"
#include "train/step_fit.h"
#include "train/train_options_check.h"
#include "train/training_state.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

// SIGINT / SIGTERM while training: finish the step, save a resumable checkpoint, stop. A second
// signal gets the default action (the handler restores it), so a stuck save can still be killed.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
  std::signal(sig, SIG_DFL);
}
struct StopSignals {
  using Handler = void (*)(int);
  Handler old_int, old_term;
  StopSignals() {
    g_stop_signal = 0;
    old_int = std::signal(SIGINT, on_stop_signal);
    old_term = std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignals() {
    std::signal(SIGINT, old_int);
    std::signal(SIGTERM, old_term);
  }
};

// Everything a command needs, validated before anything large is allocated.
struct Session {
  ModelDir model;
  Dataset data;
  Dataset eval;       // train --eval-data (may be empty)
  int seq_len = 0;    // records are cut to this
  int max_batch = 0;  // the largest micro-batch the engine is built for
  int max_seq = 0;    // the longest batch the engine is built for
  bool pack = false;  // --pack: batches of packed rows
  std::unique_ptr<Device> dev;
  std::unique_ptr<Engine> engine;
  Plan plan;
};

// The __metadata__ entry that marks a gradient file as grad's own.
constexpr const char* kGradMarkerKey = "slideformer";
constexpr const char* kGradMarkerValue = "grad";

// The model's files checked before anything is built from them (verify_checkpoint), or a line in
// the log that they were not (--no-verify).
void verify_model_files(const CheckpointReader& r, bool verify, const char* what,
                        const std::vector<std::string>& required = {}) {
  if (!verify) {
    log_info("--no-verify: the checksums and values of %s %s are not checked", what, r.dir().c_str());
    return;
  }
  const Verified v = verify_checkpoint(r, required);
  for (const std::string& u : v.without_checksums)
    log_debug("%s has no checksums (not written by slideformer): only its values were checked", u.c_str());
  log_debug("verified %s %s: %.2f GB in %.2f s (%.2f GB/s)%s", what, r.dir().c_str(), double(v.bytes) / 1e9,
            v.seconds, v.seconds > 0 ? double(v.bytes) / 1e9 / v.seconds : 0.0,
            v.manifest ? ", manifest checked" : "");
}

// grad's --output replaces only a file slideformer's grad wrote (its __metadata__ carries
// kGradMarkerKey; gradients of versions before the marker: "loss", "tokens" and checksums).
void check_grad_output(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return;
  const std::string refuse = "; refusing to overwrite it (choose a new file name)";
  if (!S_ISREG(st.st_mode)) input_error("--output", path + ": exists and is not a regular file" + refuse);
  bool ours = false;
  try {
    const SafetensorsFile f = SafetensorsFile::open(path);
    const auto& md = f.metadata();
    auto it = md.find(kGradMarkerKey);
    ours = (it != md.end() && it->second == kGradMarkerValue) ||
           (md.count("loss") && md.count("tokens") && md.count(std::string(kChecksumKeyPrefix) + "lm_head.weight") +
                                                            md.count(std::string(kChecksumKeyPrefix) +
                                                                     "model.embed_tokens.weight") > 0);
  } catch (const InputError&) {
  }
  if (!ours) input_error("--output", path + ": exists and is not a gradient file slideformer wrote" + refuse);
}

// load_jsonl with its time in the log (reading, parsing, rendering, encoding: the data throughput
// tools/data_throughput.py compares with tokenizers').
Dataset load_data(const std::string& path, int64_t vocab, const LoadOptions& lo) {
  const auto t0 = std::chrono::steady_clock::now();
  Dataset d = load_jsonl(path, vocab, lo);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t tokens = 0;
  for (const Record& r : d.records) tokens += r.ids.size();
  log_debug("data: %zu records, %zu tokens from %s in %.3f s", d.records.size(), tokens, path.c_str(), s);
  return d;
}

// What a command's session is for.
struct SessionKind {
  bool training = false;   // gradients (grad, train)
  bool optimizer = false;  // AdamW state (train)
  int grad_accum = 1;      // micro-batches a step; -1: every batch of the data file in one step (grad)
  bool clip = false;       // --max-grad-norm > 0
  std::string eval_data{};  // train --eval-data (empty: none)
};

Session open_session(const DataOptions& o, const SessionKind& k) {
  const bool training = k.training, optimizer = k.optimizer;
  const int grad_accum = k.grad_accum;
  const std::string& eval_path = k.eval_data;
  Session s;
  check_step_ranges(o.batch_size, o.seq_len, 1);  // the CLI checked already; library callers too
  s.model = open_model_dir(o.model_dir);
  auto reader = CheckpointReader::open(o.model_dir);  // validates the safetensors before the data is read
  verify_model_files(reader, o.verify, "the model");
  // Text records are tokenized with the model's tokenizer.json, loaded at the first one.
  std::optional<Tokenizer> tok;
  auto tokenizer = [&]() -> const Tokenizer& {
    if (!tok) {
      const std::string path = (fs::path(o.model_dir) / "tokenizer.json").string();
      if (!fs::exists(path)) input_error(path, "missing (the data has text records)");
      tok = Tokenizer::load(path);
    }
    return *tok;
  };
  std::optional<std::optional<ChatTemplate>> chat;
  LoadOptions lo;
  lo.tokenizer = tokenizer;
  lo.chat_template = [&]() -> const ChatTemplate* {
    if (!chat) chat = ChatTemplate::load(o.model_dir);
    return *chat ? &**chat : nullptr;
  };
  lo.train_on_all = o.train_on == "all";
  lo.cache = o.data_cache;
  s.data = load_data(o.data, s.model.spec.vocab, lo);
  if (!eval_path.empty()) s.eval = load_data(eval_path, s.model.spec.vocab, lo);
  size_t longest = 0;
  for (const Dataset* d : {&s.data, &s.eval})
    for (const Record& r : d->records) longest = std::max(longest, r.ids.size());
  if (o.seq_len > 0) {
    s.seq_len = o.seq_len;
  } else {
    s.seq_len = int(longest);
    if (s.model.spec.max_position > 0) s.seq_len = int(std::min<int64_t>(s.seq_len, s.model.spec.max_position));
  }
  s.model.spec.check_seq_len(s.seq_len, s.model.config_path);
  s.pack = o.pack;
  // A packed row holds several records: up to seq_len tokens whatever the longest record.
  size_t row_tokens = longest;
  if (s.pack) {
    row_tokens = 0;
    for (const Dataset* d : {&s.data, &s.eval}) {
      size_t sum = 0;
      for (const Record& r : d->records) sum += size_t(packed_length(r, s.seq_len));
      row_tokens = std::max(row_tokens, sum);
    }
  }
  s.max_seq = int(std::min<size_t>(size_t(s.seq_len), row_tokens));
  EngineOptions eo;
  eo.max_batch = int(std::min<size_t>(size_t(o.batch_size), std::max(s.data.records.size(), s.eval.records.size())));
  s.max_batch = eo.max_batch;
  eo.max_seq = s.max_seq;
  eo.training = training;
  eo.optimizer = optimizer;
  eo.compute_dtype = o.compute_dtype;
  EngineRequest er = o.engine;
  er.device = o.device;
  // -1: every batch of the data file in one step (the grad command).
  er.grad_accum =
      grad_accum >= 0
          ? grad_accum
          : int(std::max<size_t>(1, (s.data.records.size() + size_t(eo.max_batch) - 1) / size_t(eo.max_batch)));
  er.clip = k.clip;
  // A training step's size is bounded by what the plan can hold (grad-accum x batch x seq-len):
  // refused here, naming the option, before the engine or any step is allocated.
  if (optimizer) check_step_fits(s.model.spec, eo, er);
  BuiltEngine built = build_engine(s.model.spec, eo, er);
  const Plan built_plan = built.plan;
  s.dev = std::move(built.dev);
  s.engine = std::move(built.engine);
  s.engine->load(reader);
  s.plan = built_plan;
  if (built_plan.micro_batch > 0) s.max_batch = std::min(s.max_batch, built_plan.micro_batch);  // maybe split
  log_debug("%s", plan_summary(s.plan).c_str());  // train prints it once its inputs are all checked
  log_debug("device %s, %zu records, seq_len %d", s.dev->name().c_str(), s.data.records.size(), s.seq_len);
  return s;
}

// A file's records in order, B at a time (packed: B rows at a time).
std::vector<Batch> file_batches(const Session& s, int B, const Dataset* d = nullptr) {
  std::vector<Batch> out;
  const auto& recs = (d ? *d : s.data).records;
  if (s.pack) {
    std::vector<const Record*> all;
    for (const Record& r : recs) all.push_back(&r);
    return make_packed_batches(all, s.seq_len, B);
  }
  for (size_t i = 0; i < recs.size(); i += size_t(B)) {
    std::vector<const Record*> group;
    for (size_t j = i; j < std::min(recs.size(), i + size_t(B)); ++j) group.push_back(&recs[j]);
    out.push_back(make_batch(group, s.seq_len));
  }
  return out;
}

// The records' trained target positions within seq_len (a label at position 0 trains nothing:
// it has no input before it): none at all is an input error, not a run with loss 0.
void check_some_label(const Dataset& d, int seq_len, const std::string& path) {
  for (const Record& r : d.records) {
    const size_t n = std::min(r.labels.size(), size_t(seq_len));
    for (size_t i = 1; i < n; ++i)
      if (r.labels[i] != -100) return;
  }
  input_error(path, "no trained target positions (every label is -100 or records have one token)");
}

int64_t total_trained(const std::vector<Batch>& batches, const std::string& path) {
  int64_t n = 0;
  for (const Batch& b : batches) n += b.trained;
  if (n == 0) input_error(path, "no trained target positions (every label is -100 or records have one token)");
  return n;
}

}  // namespace

EvalResult run_eval(const DataOptions& o) {
  Session s = open_session(o, {});
  auto batches = file_batches(s, s.max_batch);
  EvalResult r;
  r.engine = engine_name(s.plan.engine);
  r.tokens = total_trained(batches, o.data);
  r.loss = s.engine->loss_sum(batches) / double(r.tokens);
  return r;
}

EvalResult run_grad(const DataOptions& o, const std::string& out_path) {
  check_path_option("--output", out_path);
  check_written_apart({"--output", out_path}, {{"--model", o.model_dir}, {"--data", o.data}});
  check_grad_output(out_path);
  // One run per gradient file: a second grad on it is refused with the holder's pid (no waiting);
  // checked again under the lock (a run that ended meanwhile may have written it).
  const OutputLock lock(out_path, OutputLock::Kind::File, "--output");
  check_grad_output(out_path);
  Session s = open_session(o, {.training = true, .grad_accum = -1});
  auto batches = file_batches(s, s.max_batch);
  EvalResult r;
  r.engine = engine_name(s.plan.engine);
  r.tokens = total_trained(batches, o.data);
  r.loss = s.engine->compute_grads(batches);  // every batch of the file is one step's micro-batch
  const ModelLayout layout = make_layout(s.model.spec);
  std::vector<TensorWrite> tw;
  append_checkpoint_tensors(tw, *s.engine, layout, Engine::State::Grads);  // named as the model's file
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", r.loss);
  write_safetensors(out_path, tw,
                    {{"loss", buf}, {"tokens", std::to_string(r.tokens)}, {kGradMarkerKey, kGradMarkerValue}});
  return r;
}

namespace {

void save_model_dir(Session& s, const TrainOptions& o, DType dtype, const std::string& dir,
                    const TrainProgress* with_state) {
  // A checkpoint goes inside the output directory, which must exist (marked) first. The final save
  // keeps the checkpoints already in the output (StagedDir::commit links them into the new one).
  if (dir != o.output) ensure_output_dir(o.output);
  StagedDir staged(dir);
  save_hf_model(*s.engine, read_json_file(s.model.config_path), o.data.model_dir, staged.path(), dtype,
                o.max_shard_bytes);
  if (with_state)
    write_training_state(*s.engine, s.model.spec, o, s.data.records.size(), s.seq_len, *with_state, staged.path());
  staged.commit();
}

}  // namespace

namespace {

// What train writes (--output, --metrics) is none of what it reads, and an existing --metrics file
// is one slideformer wrote; checked before anything is read or written.
void check_written_paths(const TrainOptions& o) {
  const std::vector<NamedPath> inputs = {{"--model", o.data.model_dir},
                                         {"--data", o.data.data},
                                         {"--eval-data", o.eval_data},
                                         {"--resume", o.resume}};
  // The one input an output may hold: the checkpoint-N it continues from (the workflow the
  // interrupt message names). It is never replaced: this run saves only later steps, and the final
  // publish carries the output's checkpoints over by hard links.
  std::vector<NamedPath> output_inputs = inputs;
  if (!o.resume.empty()) {
    const fs::path r(resolved_path(o.resume));
    if (r.parent_path().string() == resolved_path(o.output) && r.filename().string().starts_with("checkpoint-"))
      output_inputs.pop_back();
  }
  check_written_apart({"--output", o.output}, output_inputs);
  if (o.metrics.empty()) return;
  // A --metrics file inside the output directory is fine (it is kept like a user's file).
  if (resolved_path(o.metrics) == resolved_path(o.output))
    input_error("--metrics", o.metrics + ": is the --output directory; choose a file");
  check_written_apart({"--metrics", o.metrics}, inputs);
  check_metrics_file(o.metrics);
}

// One optimizer step's micro-batches, counted before any runs: the loss is normalised by the step's
// trained tokens, so accumulation gives the same update as one large batch.
struct StepBatches {
  std::vector<Batch> mbs;
  int64_t trained = 0, tokens = 0;
};

// Packed: B rows a batch, each of the records the packer lays into it.
StepBatches next_packed_step_batches(const Session& s, RowPacker& packer, int grad_accum, int B) {
  StepBatches out;
  for (int j = 0; j < grad_accum; ++j) {
    std::vector<std::vector<const Record*>> rows;
    for (int i = 0; i < B; ++i) rows.push_back(packer.next_row());
    for (size_t i = 0; i < rows.size(); i += size_t(s.max_batch)) {  // the plan's micro-batches
      const std::vector<std::vector<const Record*>> part(
          rows.begin() + long(i), rows.begin() + long(std::min(rows.size(), i + size_t(s.max_batch))));
      out.mbs.push_back(make_packed_batch(part, s.seq_len));
      out.trained += out.mbs.back().trained;
    }
    for (const auto& row : rows)
      for (const Record* r : row) out.tokens += packed_length(*r, s.seq_len);
  }
  return out;
}

StepBatches next_step_batches(const Session& s, RecordOrder& order, int grad_accum, int B, uint64_t& next_record) {
  const auto& recs = s.data.records;
  StepBatches out;
  for (int j = 0; j < grad_accum; ++j) {
    std::vector<const Record*> group;
    for (int i = 0; i < B; ++i) group.push_back(&recs[order.at(next_record++)]);
    for (size_t i = 0; i < group.size(); i += size_t(s.max_batch)) {  // the plan's micro-batches
      const std::vector<const Record*> part(group.begin() + i,
                                            group.begin() + std::min(group.size(), i + size_t(s.max_batch)));
      out.mbs.push_back(make_batch(part, s.seq_len));
      out.trained += out.mbs.back().trained;
    }
    for (const Record* r : group) out.tokens += int64_t(std::min<size_t>(r->ids.size(), size_t(s.seq_len)));
  }
  return out;
}

Engine::StepParams step_params(const TrainOptions& o, LrSchedule sched, int64_t step) {
  Engine::StepParams sp;
  sp.adamw.lr = float(o.lr * lr_multiplier(sched, step, o.steps, o.warmup_steps));
  sp.adamw.beta1 = float(o.beta1);
  sp.adamw.beta2 = float(o.beta2);
  sp.adamw.eps = float(o.eps);
  sp.adamw.weight_decay = float(o.weight_decay);
  sp.adamw.step = step + 1;
  sp.adamw.round_seed = o.seed;  // bf16 optimizer state: the stochastic rounding's stream
  sp.max_grad_norm = o.max_grad_norm;
  return sp;
}

// A non-finite loss or gradient norm stops the run before the output is written.
void check_finite_step(double loss, double gnorm, int64_t step) {
  if (!std::isfinite(loss))
    throw std::runtime_error("loss is " + std::to_string(loss) + " at step " + std::to_string(step) +
                             "; stopping (the output directory was not written)");
  if (!std::isfinite(gnorm))
    throw std::runtime_error("gradient norm is " + std::to_string(gnorm) + " at step " + std::to_string(step) +
                             " (loss " + std::to_string(loss) + "); stopping before the update");
}

std::string checkpoint_path(const TrainOptions& o, int64_t step) {
  return (fs::path(o.output) / ("checkpoint-" + std::to_string(step))).string();
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// What a run shows and records each step and each evaluation.
struct Reporting {
  ProgressDisplay display;
  MetricsFile metrics;
  std::chrono::steady_clock::time_point t_start = std::chrono::steady_clock::now();
  explicit Reporting(const TrainOptions& o)
      : display(stderr, ProgressDisplay::stderr_is_tty(), o.log_every), metrics(o.metrics, !o.resume.empty()) {}
};

StepReport step_report(const Session& s, const TrainOptions& o, const Engine::StepParams& sp,
                       const Engine::StepResult& sr, int64_t step, int64_t first_step, int64_t tokens, double dt,
                       const Reporting& rep) {
  StepReport r;
  r.step = step + 1;
  r.total = o.steps;
  r.loss = sr.loss;
  r.lr = double(sp.adamw.lr);
  r.grad_norm = sr.grad_norm;
  r.tokens = tokens;
  r.tokens_per_s = dt > 0 ? double(tokens) / dt : 0;
  r.elapsed_s = seconds_since(rep.t_start);
  r.eta_s = r.elapsed_s / double(step + 1 - first_step) * double(o.steps - step - 1);
  // The engine's device memory is GPU memory only on a GPU (on the cpu it is the host's, in rss).
  if (!s.dev->is_host()) r.gpu_bytes = s.engine->device_bytes();
  r.rss_bytes = current_rss_bytes();
  return r;
}

}  // namespace

TrainResult run_train(const TrainOptions& o) {
  check_train_options(o);  // the one validation of the options, before anything is read
  check_written_paths(o);  // nothing written may be an input; an existing --metrics must be ours
  const OutputLock lock(o.output);  // one run per output, held to the end
  claim_output_dir(o.output);       // refuses a directory that is not ours before anything runs
  // And one run per metrics file (two runs on other outputs would truncate and interleave it);
  // after the claim: a metrics file inside an empty output directory must not fill it first.
  std::optional<OutputLock> metrics_lock;
  if (!o.metrics.empty()) {
    // A metrics file inside the output: the output becomes a (marked) output first, so that the
    // file and its lock are kept like a user's files and do not make the output look foreign.
    if (path_within(resolved_path(o.metrics), resolved_path(o.output))) ensure_output_dir(o.output);
    metrics_lock.emplace(o.metrics, OutputLock::Kind::File, "--metrics");
    check_metrics_file(o.metrics);  // again under the lock
  }
  const LrSchedule sched = parse_lr_schedule(o.lr_schedule);
  Session s = open_session(o.data, {.training = true,
                                    .optimizer = true,
                                    .grad_accum = o.grad_accum,
                                    .clip = o.max_grad_norm > 0,
                                    .eval_data = o.eval_data});
  check_some_label(s.data, s.seq_len, o.data.data);
  // Held-out loss: the eval file's records in order, as `slideformer eval` computes it.
  std::vector<Batch> eval_batches;
  int64_t eval_tokens = 0;
  if (!o.eval_data.empty()) {
    eval_batches = file_batches(s, int(std::min<size_t>(size_t(s.max_batch), s.eval.records.size())), &s.eval);
    eval_tokens = total_trained(eval_batches, o.eval_data);
  }
  const DType out_dtype = checkpoint_dtype(o.data.model_dir);
  const auto& recs = s.data.records;
  const int B = int(std::min<size_t>(size_t(o.data.batch_size), recs.size()));
  RecordOrder order(recs.size(), o.shuffle, o.seed);
  TrainProgress start;  // validated before anything is printed: bad input gives one line
  if (!o.resume.empty()) start = read_training_state(*s.engine, s.model.spec, o, recs.size(), o.resume);
  log_info(
      "training %s (%s, %.1fM parameters) on %s: %zu records, %lld steps x %d micro-batches x %d sequences, "
      "seq_len %d",
      o.data.model_dir.c_str(), s.model.spec.architecture.c_str(), double(s.model.spec.total_params()) / 1e6,
      s.dev->name().c_str(), recs.size(), (long long)o.steps, o.grad_accum, B, s.seq_len);
  if (!o.resume.empty()) log_info("resumed from %s at step %lld", o.resume.c_str(), (long long)start.step);
  log_info("%s", plan_summary(s.plan).c_str());
  Reporting rep(o);
  auto evaluate = [&](int64_t step) {
    const double loss = s.engine->loss_sum(eval_batches) / double(eval_tokens);
    rep.display.break_line();
    log_info("eval at step %lld: loss %.6f over %lld tokens", (long long)step, loss, (long long)eval_tokens);
    rep.metrics.eval(step, loss, eval_tokens, seconds_since(rep.t_start));
    return loss;
  };
  auto save_checkpoint = [&](int64_t step, uint64_t next_record, uint64_t pack_rows) {
    const std::string ck = checkpoint_path(o, step);
    const TrainProgress here{step, next_record, pack_rows};
    save_model_dir(s, o, out_dtype, ck, &here);
    return ck;
  };

  TrainResult result;
  uint64_t next_record = start.next_record;  // --pack: the packer's window start
  uint64_t pack_rows = start.pack_rows;      // --pack: rows of that window used
  std::optional<RowPacker> packer;           // --pack: rows from the records in `order`, resumable
  if (s.pack) packer.emplace(s.data, order, s.seq_len, next_record, pack_rows);
  const StopSignals stop_signals;  // from here on a signal stops after the step, with a checkpoint
  // Test hook: SF_RAISE_SIGINT_AT_STEP=N raises SIGINT at the start of step N (1-based), as a Ctrl-C
  // arriving during that step would.
  const int64_t raise_at = test_hooks::raise_sigint_at_step();
  // Test hook: SF_KILL_AT_STEP=N kills the process (SIGKILL, as a crash or the OOM killer would) at
  // the start of step N: what was written so far (the --metrics lines) must stay valid.
  const int64_t kill_at = test_hooks::kill_at_step();
  int64_t tokens_total = 0;
  for (int64_t step = start.step; step < o.steps; ++step) {
    if (step + 1 == raise_at) std::raise(SIGINT);
    if (step + 1 == kill_at) std::raise(SIGKILL);
    const auto t0 = std::chrono::steady_clock::now();
    const StepBatches sb = packer ? next_packed_step_batches(s, *packer, o.grad_accum, B)
                                  : next_step_batches(s, order, o.grad_accum, B, next_record);
    if (packer) {
      next_record = packer->window_start();
      pack_rows = packer->rows_taken();
    }
    const Engine::StepParams sp = step_params(o, sched, step);
    // The engine owns the step's order (docs/ARCHITECTURE.md §3): the update may still run on the host while
    // the next step starts (the sliding engine overlaps it); saving and exporting wait for it.
    Engine::StepResult sr = s.engine->step(sb.mbs, sp);
    if (sb.trained == 0) sr.loss = 0.0;
    check_finite_step(sr.loss, sr.grad_norm, step + 1);
    tokens_total += sb.tokens;
    if (step == start.step) result.first_loss = sr.loss;
    result.last_loss = sr.loss;
    result.steps = step + 1 - start.step;
    const StepReport report = step_report(s, o, sp, sr, step, start.step, sb.tokens, seconds_since(t0), rep);
    rep.metrics.train_step(report);
    rep.display.step(report);
    if (!eval_batches.empty() && (step + 1 == o.steps || (o.eval_every > 0 && (step + 1) % o.eval_every == 0)))
      result.eval_loss = evaluate(step + 1);
    if (g_stop_signal != 0 && step + 1 < o.steps) {
      const int sig = g_stop_signal;
      rep.display.break_line();
      log_info("%s at step %lld: saving %s", sig == SIGINT ? "interrupted" : "terminated", (long long)(step + 1),
               checkpoint_path(o, step + 1).c_str());
      result.checkpoint = save_checkpoint(step + 1, next_record, pack_rows);
      log_info("saved %s; continue with --resume %s", result.checkpoint.c_str(), result.checkpoint.c_str());
      result.interrupted_by = sig;
      return result;
    }
    if (o.save_every > 0 && (step + 1) % o.save_every == 0 && step + 1 < o.steps) {
      const std::string ck = save_checkpoint(step + 1, next_record, pack_rows);
      rep.display.break_line();
      log_info("saved %s", ck.c_str());
    }
  }
  s.engine->synchronize();  // the last update is done
  result.tokens_per_second = double(tokens_total) / seconds_since(rep.t_start);
  rep.display.break_line();
  save_model_dir(s, o, out_dtype, o.output, nullptr);
  log_info("saved %s", o.output.c_str());
  if (g_stop_signal != 0) {
    // A signal during the last step or the final save: the run is complete and saved, and the exit
    // status still says it was interrupted (128 + signal), as README promises.
    const int sig = g_stop_signal;
    log_info("%s during the last step: the run completed and %s is saved", sig == SIGINT ? "interrupted" : "terminated",
             o.output.c_str());
    result.interrupted_by = sig;
    result.checkpoint = o.output;
  }
  return result;
}

}  // namespace sf
