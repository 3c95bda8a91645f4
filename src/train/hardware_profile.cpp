#include "train/hardware_profile.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>

#include "core/error.h"
#include "io/json_file.h"

namespace sf {

namespace {

// The built-in profiles: hardware/*.json at the source root, compiled in by CMake as
// {"name", R"(file text)"} entries, so that `--hardware rtx4090` works from any directory.
struct BuiltinProfile {
  const char* name;
  const char* text;
};
constexpr BuiltinProfile kBuiltin[] = {
#include "hardware_profiles.inc"
};

// One numeric key: where it lives in the struct and the range a machine can have. The upper bounds
// catch typos and unit slips (GB for GiB, parameters for billions); the lower ones only require a
// positive figure, low enough for what `--measure` finds on a loaded or sanitizer-instrumented host.
struct NumberKey {
  const char* key;
  double HardwareProfile::*field;
  double lo, hi;
  bool optional = false;  // absent or null: 0
};
constexpr NumberKey kNumbers[] = {
    {"gpu_memory_gib", &HardwareProfile::gpu_memory_gib, 0.25, 16384},
    {"ram_gib", &HardwareProfile::ram_gib, 0.25, 1 << 20},
    {"gemm_tflops", &HardwareProfile::gemm_tflops, 1e-3, 1e5},
    {"model_efficiency", &HardwareProfile::model_efficiency, 0.01, 1},
    {"attention_fwd_tflops", &HardwareProfile::attention_fwd_tflops, 1e-3, 1e5, true},
    {"attention_bwd_tflops", &HardwareProfile::attention_bwd_tflops, 1e-3, 1e5, true},
    {"pcie_gbs", &HardwareProfile::pcie_gbs, 1e-3, 1e4},
    {"host_bus_gbs", &HardwareProfile::host_bus_gbs, 1e-3, 1e5},
    {"host_adamw_gparams_s", &HardwareProfile::host_adamw_gparams_s, 1e-6, 1e4},
    {"host_read_gbs", &HardwareProfile::host_read_gbs, 1e-3, 1e5},
    {"disk_read_gbs", &HardwareProfile::disk_read_gbs, 1e-3, 1e4},
    {"disk_write_gbs", &HardwareProfile::disk_write_gbs, 1e-3, 1e4},
    {"disk_gib", &HardwareProfile::disk_gib, 1e-3, 1 << 30, true},
};

size_t gib_share(double gib, double share) { return size_t(gib * share * double(size_t(1) << 30)); }

}  // namespace

Rates HardwareProfile::rates() const {
  Rates r;
  r.model_tflops = gemm_tflops * model_efficiency;
  r.attn_fwd_tflops = attention_fwd();
  r.attn_bwd_tflops = attention_bwd();
  r.host_adamw_params_s = host_adamw_gparams_s * 1e9;
  r.host_read_gbs = host_read_gbs;
  r.pcie_gbs = pcie_gbs;
  r.host_bus_gbs = host_bus_gbs;
  r.disk_read_gbs = disk_read_gbs;
  r.disk_write_gbs = disk_write_gbs;
  return r;
}

size_t HardwareProfile::gpu_budget_bytes() const { return gib_share(gpu_memory_gib, 0.9); }
size_t HardwareProfile::host_budget_bytes() const { return gib_share(ram_gib, 0.9); }
size_t HardwareProfile::disk_budget_bytes() const { return gib_share(disk_gib, 0.95); }

const std::vector<std::string>& hardware_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const NumberKey& n : kNumbers) k.push_back(n.key);
    return k;
  }();
  return keys;
}

HardwareProfile hardware_from_json(const nlohmann::json& j, const std::string& file) {
  const JsonRef root(j, file);
  root.expect_object();
  std::set<std::string> known = {"name", "description", "sources"};
  for (const NumberKey& n : kNumbers) known.insert(n.key);
  for (const auto& [key, value] : j.items())
    if (!known.count(key)) JsonRef(value, file, json_child_path(root.path(), key)).fail("unknown key");
  HardwareProfile h;
  h.name = root.string_or("name", "");
  h.description = root.string_or("description", "");
  for (const NumberKey& n : kNumbers)
    h.*n.field = n.optional ? root.number_or(n.key, 0, n.lo, n.hi) : root.at(n.key).as_number(n.lo, n.hi);
  // Attention is matrix products and a softmax between them: never faster than the GEMM.
  for (const auto& [key, value] : {std::pair{"attention_fwd_tflops", h.attention_fwd_tflops},
                                   std::pair{"attention_bwd_tflops", h.attention_bwd_tflops}})
    if (value > h.gemm_tflops)
      root.at(key).fail("is more than gemm_tflops (" + std::to_string(h.gemm_tflops) +
                        "): attention is matrix products and more; a unit slip?");
  if (const auto src = root.get("sources")) {
    src->expect_object();
    for (const auto& [key, value] : src->json().items()) {
      const JsonRef v(value, file, json_child_path(src->path(), key));
      if (!std::count(hardware_keys().begin(), hardware_keys().end(), key)) v.fail("unknown key");
      h.sources[key] = v.as_string(4096);
    }
  }
  return h;
}

nlohmann::ordered_json hardware_to_json(const HardwareProfile& h) {
  nlohmann::ordered_json j;
  j["name"] = h.name;
  j["description"] = h.description;
  for (const NumberKey& n : kNumbers)
    if (!n.optional || h.*n.field > 0) j[n.key] = h.*n.field;
  if (!h.sources.empty()) {
    nlohmann::ordered_json s = nlohmann::ordered_json::object();
    for (const NumberKey& n : kNumbers)
      if (auto it = h.sources.find(n.key); it != h.sources.end()) s[n.key] = it->second;
    j["sources"] = s;
  }
  return j;
}

std::vector<std::string> builtin_hardware_names() {
  std::vector<std::string> names;
  for (const BuiltinProfile& b : kBuiltin) names.push_back(b.name);
  return names;
}

HardwareProfile load_hardware(const std::string& what) {
  const bool is_path = what.find('/') != std::string::npos ||
                       (what.size() > 5 && what.compare(what.size() - 5, 5, ".json") == 0);
  if (is_path) return hardware_from_json(read_json_file(what, JsonLimits{8, size_t(1) << 20}), what);
  for (const BuiltinProfile& b : kBuiltin) {
    if (what != b.name) continue;
    const std::string text = b.text;
    const std::string where = "hardware/" + what + ".json (built in)";
    return hardware_from_json(parse_json_text(where, text.data(), text.data() + text.size(), 8), where);
  }
  std::string names;
  for (const std::string& n : builtin_hardware_names()) names += (names.empty() ? "" : ", ") + n;
  input_error("--hardware", "no built-in profile '" + what + "' (" + names + "; or a path to a .json file)");
}

void save_hardware(const std::string& path, const HardwareProfile& h) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
    input_error(path, "exists; --save-hardware does not overwrite a file (remove it or choose another name)");
  // What is written must read back (a measured figure out of range is refused here, not later).
  const nlohmann::ordered_json j = hardware_to_json(h);
  hardware_from_json(nlohmann::json::parse(j.dump()), path + " (as measured)");
  write_json_file(path, j);
}

}  // namespace sf
