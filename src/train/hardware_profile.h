// A machine's figures for the planner (docs/HARDWARE.md): memory sizes and the rates the step
// prediction uses, read from a JSON file (`plan --hardware FILE|NAME`) or written from this
// machine's measurement (`plan --measure --save-hardware FILE`). A hardware file is untrusted
// input: unknown keys, wrong types, missing, negative, non-finite or absurd values are an
// InputError naming the file and the key (exit 2).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/planner.h"

namespace sf {

// The H200 machine's attention rates over its GEMM rate (`plan --measure`'s 764 TFLOP/s, 761 in the
// run that measured the kernel's 657 / 524 of Rates' defaults): a profile without attention
// figures gets these shares of its GEMM rate.
constexpr double kAttnFwdPerGemm = 657.0 / 764.0, kAttnBwdPerGemm = 524.0 / 764.0;

struct HardwareProfile {
  std::string name, description;  // free text
  double gpu_memory_gib = 0;      // the GPU's memory; the plan's GPU budget is 90 % of it (as the CUDA arena's default)
  double ram_gib = 0;             // host memory; the plan's host budget is 90 % of it
  // bf16 GEMM (fp32 accumulate) of a layer-sized product, and the share of it a whole step
  // reaches (kernels other than GEMMs, attention, launch gaps): model rate = gemm x efficiency.
  double gemm_tflops = 0, model_efficiency = 0;
  double pcie_gbs = 0;              // each way, both directions busy at once
  double host_bus_gbs = 0;          // host memory bus, CPU optimizer passes and DMA both busy
  double host_adamw_gparams_s = 0;  // fused CPU AdamW, all cores, 1e9 parameters a second
  double host_read_gbs = 0;         // host memory read, all cores
  double disk_read_gbs = 0, disk_write_gbs = 0;  // the offload directory's disk, O_DIRECT large blocks
  // Optional (0: absent): our causal attention kernel's forward and backward rates (FLOPs counted
  // FlashAttention's way, head dim 128, long sequences; Rates::attn_fwd_tflops). Absent (files
  // written before they existed): the GEMM rate x the H200 machine's ratios (kAttnFwdPerGemm,
  // kAttnBwdPerGemm). At most gemm_tflops (the kernel is matrix products and more).
  double attention_fwd_tflops = 0, attention_bwd_tflops = 0;
  // Optional (0: absent): the offload disk's free space; with --offload-dir the plan's disk budget is
  // 95 % of it (as of a real directory's free space) unless --disk-memory.
  double disk_gib = 0;
  // Where each figure comes from (key -> text); optional, kept through a read/write round trip.
  std::map<std::string, std::string> sources;

  Rates rates() const;
  // The attention rates the planner gets: the file's, else derived from the GEMM rate.
  double attention_fwd() const {
    return attention_fwd_tflops > 0 ? attention_fwd_tflops : gemm_tflops * kAttnFwdPerGemm;
  }
  double attention_bwd() const {
    return attention_bwd_tflops > 0 ? attention_bwd_tflops : gemm_tflops * kAttnBwdPerGemm;
  }
  size_t gpu_budget_bytes() const;   // 90 % of gpu_memory_gib
  size_t host_budget_bytes() const;  // 90 % of ram_gib
  size_t disk_budget_bytes() const;  // 95 % of disk_gib
};

// The numeric keys of a hardware file, in the order they are written (attention_fwd_tflops,
// attention_bwd_tflops and disk_gib optional).
const std::vector<std::string>& hardware_keys();

HardwareProfile hardware_from_json(const nlohmann::json& j, const std::string& file);
nlohmann::ordered_json hardware_to_json(const HardwareProfile& h);

// `what`: a path (contains '/' or ends in .json) or the name of a built-in profile (rtx4090,
// a100-80gb: the files under hardware/ at the source root, compiled in).
HardwareProfile load_hardware(const std::string& what);
std::vector<std::string> builtin_hardware_names();
// Refuses to overwrite an existing file (InputError); written atomically.
void save_hardware(const std::string& path, const HardwareProfile& h);

}  // namespace sf
