#include "train/training_state.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/json_file.h"
#include "io/manifest.h"
#include "io/safetensors.h"
#include "model/layout.h"
#include "train/model_io.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFile = "training_state.safetensors";
constexpr const char* kTrainerFile = "trainer_state.json";
// The saved states and their tensor-name prefixes in kStateFile.
const std::pair<Engine::State, std::string> kSavedStates[] = {
    {Engine::State::Params, "master."}, {Engine::State::AdamM, "adam_m."}, {Engine::State::AdamV, "adam_v."}};

// The moments are saved in the run's --optimizer-state dtype (bf16 values are saved exactly);
// trainer_state.json names it ("optimizer_state"; absent in checkpoints from before: fp32). A
// resume with another --optimizer-state is refused rather than converted: bf16 -> fp32 would be
// exact but fp32 -> bf16 would round the moments once more, outside the run's random stream.
const char* state_name(DType t) { return t == DType::BF16 ? "bf16" : "fp32"; }
DType saved_dtype(Engine::State kind, DType moments) { return kind == Engine::State::Params ? DType::F32 : moments; }

}  // namespace

void write_training_state(Engine& engine, const ModelSpec& spec, const TrainOptions& o, size_t records, int seq_len,
                          const TrainProgress& p, const std::string& dir) {
  // One tensor at a time from the engine (no copy of the whole state in host memory).
  const ModelLayout layout = make_layout(spec);
  std::vector<TensorWrite> tw;
  const DType sd = o.data.engine.state_dtype;
  for (const auto& [kind, prefix] : kSavedStates)
    append_engine_tensors(tw, engine, layout, kind, saved_dtype(kind, sd), prefix);
  write_safetensors((fs::path(dir) / kStateFile).string(), tw, {{"step", std::to_string(p.step)}});
  nlohmann::json j = {{"step", p.step},
                      {"next_record", p.next_record},
                      {"pack_rows", p.pack_rows},
                      {"records", records},
                      {"batch_size", o.data.batch_size},
                      {"grad_accum", o.grad_accum},
                      {"seq_len", seq_len},
                      {"shuffle", o.shuffle},
                      {"seed", o.seed},
                      {"optimizer_state", state_name(sd)},
                      {"steps", o.steps},
                      {"lr", o.lr},
                      {"lr_schedule", o.lr_schedule},
                      {"warmup_steps", o.warmup_steps},
                      {"data", o.data.data}};
  write_json_file((fs::path(dir) / kTrainerFile).string(), j);
}

TrainProgress read_training_state(Engine& engine, const ModelSpec& spec, const TrainOptions& o, size_t records,
                                  const std::string& dir) {
  const std::string tpath = (fs::path(dir) / kTrainerFile).string();
  if (!fs::exists(tpath))
    input_error(dir, "not a checkpoint with training state (no " + std::string(kTrainerFile) + ")");
  // Every file checked before any is used: the manifest (trainer_state.json's step and record
  // position, the configs), the tensors' checksums and values (the state and the model files: a
  // flipped bit there would surface only when the checkpoint is used as a model).
  const CheckpointReader model_files = CheckpointReader::open(dir);
  auto f = SafetensorsFile::open((fs::path(dir) / kStateFile).string());
  if (o.data.verify) {
    const Verified v = verify_checkpoint(model_files, {kTrainerFile, kStateFile});
    std::vector<std::string> unverified = v.without_checksums;
    if (!f.verify_checksums(/*check_finite=*/true)) unverified.push_back(f.path());
    for (const std::string& u : unverified)
      log_info("warning: %s has no checksums (written by an older slideformer?); resuming without verifying it",
               u.c_str());
    if (!v.manifest)
      log_info("warning: %s has no %s (written by an older slideformer?); its %s is not verified", dir.c_str(),
               kManifestName, kTrainerFile);
  } else {
    log_info("--no-verify: the checksums and values of the checkpoint %s are not checked", dir.c_str());
  }
  const nlohmann::json j = read_json_file(tpath);  // depth-limited; typed reads below name the JSON path
  const JsonRef st(j, tpath);
  st.expect_object();
  auto same = [&](const char* key, const nlohmann::json& now) {
    const std::optional<JsonRef> saved = st.get(key);
    if (!saved || saved->json() != now) {
      input_error(tpath, std::string("--resume needs the same ") + key + " as the saved run (saved " +
                             (saved ? saved->json().dump() : "nothing") + ", now " + now.dump() + ")");
    }
  };
  same("records", records);
  same("batch_size", o.data.batch_size);
  same("grad_accum", o.grad_accum);
  same("shuffle", o.shuffle);
  same("seed", o.seed);
  const DType sd = o.data.engine.state_dtype;
  {
    const std::optional<JsonRef> saved = st.get("optimizer_state");
    const std::string was = saved ? saved->json().dump() : "\"fp32\"", now = std::string("\"") + state_name(sd) + "\"";
    if (was != now)
      input_error(tpath, "--resume needs the same --optimizer-state as the saved run (saved " + was + ", now " + now +
                             "; the moments are not converted)");
  }
  TrainProgress p;
  constexpr int64_t kAny = std::numeric_limits<int64_t>::max();
  p.step = st.at("step").as_int(0, kAny, /*integral_floats=*/false);
  p.next_record = uint64_t(st.at("next_record").as_int(0, kAny, /*integral_floats=*/false));
  // Absent in checkpoints written before the windowed packer: its rows then start at next_record.
  if (const std::optional<JsonRef> rows = st.get("pack_rows"))
    p.pack_rows = uint64_t(rows->as_int(0, kAny, /*integral_floats=*/false));
  if (p.step >= o.steps)
    input_error(tpath, "the checkpoint is at step " + std::to_string(p.step) + ", not before --steps " +
                           std::to_string(o.steps));

  // Every tensor checked (dtype, shape) before any is taken; then one at a time from the mapped file.
  const ModelLayout layout = make_layout(spec);
  for (bool take : {false, true}) {
    for (const auto& [kind, prefix] : kSavedStates) {
      for (size_t b = 0; b < layout.blobs.size(); ++b) {
        for (size_t i = 0; i < layout.blobs[b].entries.size(); ++i) {
          const BlobEntry& e = layout.blobs[b].entries[i];
          const TensorInfo* info = f.find(prefix + e.name);
          if (!take) {
            if (!info) input_error(f.path(), "tensor " + prefix + e.name + " missing");
            const DType want = saved_dtype(kind, sd);
            if (info->dtype != want || info->shape != e.shape)
              input_error(f.path(),
                          "tensor " + prefix + e.name + " must be " + dtype_name(want) + " " + shape_string(e.shape));
            continue;
          }
          // a part of kStatePart elements at a time (one part's fp32 beside the engine, not the
          // tensor's); the mapping need not be 4-byte aligned
          std::vector<float> v(static_cast<size_t>(std::min(e.numel, kStatePart)));
          for (int64_t k0 = 0; k0 < e.numel; k0 += kStatePart) {
            const int64_t c = std::min(kStatePart, e.numel - k0);
            if (info->dtype == DType::F32) {
              std::memcpy(v.data(), info->data + 4 * k0, size_t(c) * 4);
            } else {  // bf16 moments, widened exactly (write_state narrows them back exactly)
              for (int64_t k = 0; k < c; ++k) {
                uint16_t h;
                std::memcpy(&h, info->data + 2 * (k0 + k), 2);
                v[size_t(k)] = bf16_to_float(bf16{h});
              }
            }
            engine.write_state_part(kind, int(b), int(i), k0, c, v.data());
          }
        }
      }
    }
  }
  return p;
}

}  // namespace sf
