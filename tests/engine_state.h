// Whole per-parameter states of an engine as named fp32 host tensors, for tests that compare or
// perturb every parameter. Built on the engine's tensor-by-tensor read_state / write_state, in
// make_layout(spec()) order (embedding, layers, head).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "model/layout.h"

namespace sf::test {

// One tensor of a state in HF name and shape.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};
using NamedTensors = std::vector<NamedTensor>;

inline NamedTensors export_state(Engine& e, Engine::State which) {
  const ModelLayout layout = make_layout(e.spec());
  NamedTensors out;
  for (size_t b = 0; b < layout.blobs.size(); ++b)
    for (size_t i = 0; i < layout.blobs[b].entries.size(); ++i) {
      const BlobEntry& be = layout.blobs[b].entries[i];
      NamedTensor t{be.name, be.shape, std::vector<float>(size_t(be.numel))};
      e.read_state(which, int(b), int(i), t.data.data());
      out.push_back(std::move(t));
    }
  return out;
}

// Sets one state by HF name: every tensor of the layout must be given, with its shape.
inline void import_state(Engine& e, Engine::State which, const NamedTensors& tensors) {
  std::map<std::string, const NamedTensor*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t;
  const ModelLayout layout = make_layout(e.spec());
  for (size_t b = 0; b < layout.blobs.size(); ++b)
    for (size_t i = 0; i < layout.blobs[b].entries.size(); ++i) {
      const BlobEntry& be = layout.blobs[b].entries[i];
      auto it = by_name.find(be.name);
      SF_CHECK(it != by_name.end(), "import_state: missing " + be.name);
      SF_CHECK(it->second->shape == be.shape && int64_t(it->second->data.size()) == be.numel,
               "import_state: shape mismatch for " + be.name);
      e.write_state(which, int(b), int(i), it->second->data.data());
    }
}

// Every tensor of the states a save holds (masters, AdamW m and v), in layout order: the state,
// the tensor's blob and entry, and its layout entry.
struct SavedTensor {
  Engine::State which;
  int blob, entry;
  const BlobEntry* e;
};
inline std::vector<SavedTensor> saved_tensors(const ModelLayout& layout) {
  std::vector<SavedTensor> out;
  for (Engine::State which : {Engine::State::Params, Engine::State::AdamM, Engine::State::AdamV})
    for (size_t b = 0; b < layout.blobs.size(); ++b)
      for (size_t i = 0; i < layout.blobs[b].entries.size(); ++i)
        out.push_back({which, int(b), int(i), &layout.blobs[b].entries[i]});
  return out;
}

// Every saved tensor of `a` read whole and in parts of `read_part` elements (they must agree), and
// written into `b` in parts of `write_part` (Engine::read_state_part / write_state_part); callers
// wrap it in ASSERT_NO_FATAL_FAILURE.
inline void copy_saved_state_in_parts(Engine& a, Engine& b, const ModelLayout& layout, int64_t read_part,
                                      int64_t write_part) {
  for (const SavedTensor& t : saved_tensors(layout)) {
    const int64_t n = t.e->numel;
    std::vector<float> whole(static_cast<size_t>(n)), parts(static_cast<size_t>(n), -3.f);
    a.read_state(t.which, t.blob, t.entry, whole.data());
    for (int64_t k0 = 0; k0 < n; k0 += read_part)
      a.read_state_part(t.which, t.blob, t.entry, k0, std::min(read_part, n - k0), parts.data() + k0);
    ASSERT_EQ(parts, whole) << t.e->name;
    for (int64_t k0 = 0; k0 < n; k0 += write_part)
      b.write_state_part(t.which, t.blob, t.entry, k0, std::min(write_part, n - k0), whole.data() + k0);
  }
}

inline NamedTensors export_params(Engine& e) { return export_state(e, Engine::State::Params); }
inline NamedTensors export_grads(Engine& e) { return export_state(e, Engine::State::Grads); }
inline void import_params(Engine& e, const NamedTensors& p) { import_state(e, Engine::State::Params, p); }

// The largest over the tensors of max |a - b| / max |a| (the GPU tests' bound against run-to-run noise).
inline double worst_relative(const NamedTensors& a, const NamedTensors& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double diff = 0, scale = 1e-30;
    for (size_t j = 0; j < a[i].data.size(); ++j) {
      diff = std::max(diff, double(std::fabs(a[i].data[j] - b[i].data[j])));
      scale = std::max(scale, double(std::fabs(a[i].data[j])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace sf::test
