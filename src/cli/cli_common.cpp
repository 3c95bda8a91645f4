#include "cli/cli_common.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "core/error.h"
#include "core/units.h"
#include "data/dataset/dataset.h"
#include "train/train_options_check.h"

namespace sf {

void print_json(const nlohmann::json& j) {
  // Replacement, not an exception, for text that is not UTF-8 (paths are checked up front; this is
  // the last line of defence of the result line).
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(stdout);
}

void EngineFlags::add(CLI::App* c) {
  c->add_flag("--offload", offload,
              "force the sliding engine: layers slide through GPU slots, weights, optimizer state and checkpoints "
              "in host memory (default: only when the model does not fit on the GPU)");
  c->add_flag("--no-offload", no_offload, "force the in-memory engine");
  c->add_option("--slots", slots, "GPU parameter slots of the sliding engine (default 3, or 2 when 3 do not fit)");
  c->add_option("--gpu-blobs", gpu_blobs,
                "blobs (embedding, head, then layers) the sliding engine keeps whole on the GPU, with their "
                "optimizer state (default: as many as fit)");
  c->add_option("--keep-attention", keep_attention,
                "layers whose attention output the forward keeps on the GPU, so that their backward's recompute "
                "skips attention (default -1: the planner's, cuda only: in memory as many as the GPU memory has room "
                "for; offloaded, per micro-batch, weighed against blobs kept on the GPU by predicted step; 0: none)");
  c->add_option("--keep-layers", keep_layers,
                "layers whose activations the forward keeps whole on the GPU, so that their backward runs without "
                "a recompute (default -1: the planner's, cuda only, attention-kept layers upgraded first in memory, "
                "weighed as for --keep-attention offloaded; 0: none)");
  c->add_option("--gpu-memory", gpu_memory, "GPU memory to use, e.g. 40GiB (default: 90% of the free memory)");
  c->add_option("--cpu-memory", cpu_memory, "host memory to plan with (default: what the system reports available)");
  c->add_option("--offload-dir", offload_dir,
                "directory for the NVMe tier: AdamW state of whole layers goes to a scratch file there when host "
                "memory is short (the file has no name and disappears when the run ends)");
  c->add_option("--disk-memory", disk_memory,
                "space the scratch file in --offload-dir may take, e.g. 500GiB (default: the free space less 5%)");
  c->add_option("--upload-copies", upload_copies,
                "sliding engine: a pinned copy of each host blob's weights in the compute dtype beside its fp32 "
                "master, written by the update and read by the uploads (half the upload bytes on a GPU; a bf16 copy "
                "is the master's own high half, its low half and a tie bit kept beside it: +1/8 byte of RAM a "
                "parameter, +2 for other dtypes): auto (the planner's choice: when it fits and the predicted step "
                "is shorter), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
}

namespace {
// The offload directory must exist and take files (the scratch file is created when the engine is).
void check_offload_dir(const std::string& dir) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) input_error("--offload-dir " + dir, std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) input_error("--offload-dir " + dir, "not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) input_error("--offload-dir " + dir, "not writable");
}
}  // namespace

void EngineFlags::add_optimizer_state(CLI::App* c) {
  c->add_option("--optimizer-state", optimizer_state,
                "AdamW m and v: fp32 (exact), or bf16 with unbiased stochastic rounding (8 instead of 12 bytes of "
                "optimizer state a parameter, a third less host-memory traffic per update)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
}

void EngineFlags::apply(EngineRequest& e) const {
  if (offload && no_offload) input_error("--offload/--no-offload", "give one of them");
  e.offload = offload ? OffloadChoice::On : no_offload ? OffloadChoice::Off : OffloadChoice::Auto;
  e.slots = slots;
  e.gpu_blobs = gpu_blobs;
  e.kept_layers = keep_attention;
  e.whole_layers = keep_layers;
  e.gpu_memory = gpu_memory.empty() ? 0 : size_t(parse_size(gpu_memory, "--gpu-memory"));
  e.cpu_memory = cpu_memory.empty() ? 0 : size_t(parse_size(cpu_memory, "--cpu-memory"));
  if (!disk_memory.empty() && offload_dir.empty()) input_error("--disk-memory", "needs --offload-dir");
  e.disk_memory = disk_memory.empty() ? 0 : size_t(parse_size(disk_memory, "--disk-memory"));
  e.offload_dir = offload_dir;
  if (!offload_dir.empty()) check_offload_dir(offload_dir);
  e.state_dtype = optimizer_state == "bf16" ? DType::BF16 : DType::F32;
  e.upload_copies = upload_copies == "on"    ? CopiesChoice::On
                    : upload_copies == "off" ? CopiesChoice::Off
                                             : CopiesChoice::Auto;
}

void add_data_options(CLI::App* c, DataOptions& d, EngineFlags& f) {
  c->add_option("--model", d.model_dir, "Hugging Face model directory")->required();
  c->add_option("--data", d.data, "JSONL file, one {\"input_ids\": [...], \"labels\": [...]} per line")->required();
  c->add_option("--seq-len", d.seq_len, "cut records to this many tokens (default: the longest record)");
  c->add_option("--batch-size", d.batch_size, "sequences per micro-batch")->capture_default_str();
  c->add_option("--device", d.device, "cpu, cuda or auto (cuda when a GPU is present)")->capture_default_str();
  f.add(c);
  c->add_option("--compute-dtype", d.compute_dtype,
                "fp32 (cpu default) or bf16 (cuda; on the cpu it mirrors the GPU's rounding)");
  c->add_option("--max-record-bytes", d.max_record_bytes, "longest JSONL line accepted, e.g. 256MiB (default 64MiB)");
  c->add_option("--train-on", d.train_on, "chat records: assistant (only the assistant turns) or all")
      ->check(CLI::IsMember({"assistant", "all"}))
      ->capture_default_str();
  c->add_flag("--no-data-cache{false}", d.data_cache, "do not cache the tokenized data next to the data file");
  c->add_flag("--no-verify{false}", d.verify,
              "do not check the checksums and values of the model (and --resume checkpoint) read; the log says so");
  c->add_flag("--pack", d.pack,
              "pack short records into rows of --seq-len tokens (attention stays inside each record)");
}

void apply_data_options(DataOptions& d, const EngineFlags& f) {
  f.apply(d.engine);
  check_data_options(d);
  if (!d.max_record_bytes.empty()) set_max_record_bytes(parse_size(d.max_record_bytes, "--max-record-bytes"));
}

Command add_data_command(CLI::App* c, std::function<nlohmann::json(const DataOptions&)> result) {
  struct Options {
    DataOptions data;
    EngineFlags flags;
  };
  auto o = std::make_shared<Options>();
  add_data_options(c, o->data, o->flags);
  return {c, [o, result = std::move(result)] {
            apply_data_options(o->data, o->flags);
            print_json(result(o->data));
            return 0;
          }};
}

}  // namespace sf
