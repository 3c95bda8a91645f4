// The host AdamW kernel alone (cpu::adamw, the engine's host optimizer pass): parameters a second
// with fp32 and with bf16 m and v (stochastic rounding), for the fused pass and the two passes of
// the split update, bf16 gradients in, the parameter as an fp32 master alone, an fp32 master with a
// bf16 upload copy, or a split master (cpu::adamw_split: the copy is its high half), at each size
// given in Mi elements: 1 (14 MiB with fp32 state: the last-level cache, mostly the instructions)
// and 64 (0.9 GiB: memory, the step's case, bound by the bytes or by the instructions, whichever
// is slower) by default.
//   SF_THREADS=N bench_adamw [MI_ELEMENTS ...]      (SF_ADAMW_ISA=sse2|scalar narrows the path)
// Prints one line per case and a JSON line; each figure is the best of 15 runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/dtype.h"
#include "core/host_memory.h"
#include "core/thread_pool.h"

using namespace sf;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The parameter's form: an fp32 master; with a bf16 upload copy; split (core/split_master.h).
enum class Form { Master, Copy, Split };

struct Arrays {
  HostBuffer p, g, m, v;   // [n] fp32; [n] bf16; [n] of the state's dtype each
  HostBuffer c, lo, ties;  // [n] bf16 (the copy, or the split's high half); [n] uint16; [n / 8] bits
  int64_t n;
  DType state;
  Arrays(int64_t n_, DType st) : n(n_), state(st) {
    const size_t es = st == DType::BF16 ? 2 : 4;
    p = HostBuffer(size_t(n) * 4);
    c = HostBuffer(size_t(n) * 2);
    lo = HostBuffer(size_t(n) * 2);
    ties = HostBuffer(split_tie_bytes(n));
    g = HostBuffer(size_t(n) * 2);
    m = HostBuffer(size_t(n) * es);
    v = HostBuffer(size_t(n) * es);
    // Plausible values: small gradients, m near 0, v positive (the sqrt and the rounding see
    // ordinary numbers, no denormals, no NaN).
    auto* pp = static_cast<float*>(p.data());
    auto* gp = static_cast<bf16*>(g.data());
    for (int64_t i = 0; i < n; ++i) {
      const float x = float(int32_t(uint32_t(i) * 2654435761u)) * 4.6566e-10f;  // [-1, 1)
      pp[i] = x;
      // |g| >= 5e-4: no v decays towards the denormals over the in-cache case's thousands of
      // calls (denormal arithmetic is ~100x slower and would measure the FPU's assist, not the pass).
      gp[i] = float_to_bf16(1e-3f * (x < 0 ? x - 0.5f : x + 0.5f));
      const float mi = 1e-4f * x, vi = 1e-6f * (1.5f + x);
      if (st == DType::BF16) {
        static_cast<bf16*>(m.data())[i] = float_to_bf16(mi);
        static_cast<bf16*>(v.data())[i] = float_to_bf16(vi);
      } else {
        static_cast<float*>(m.data())[i] = mi;
        static_cast<float*>(v.data())[i] = vi;
      }
    }
    const SplitMaster sm = split();
    for (int64_t i = 0; i < n; ++i) split_store(sm, i, pp[i]);
  }
  SplitMaster split() {
    return {static_cast<uint16_t*>(c.data()), static_cast<uint16_t*>(lo.data()), static_cast<uint8_t*>(ties.data()), 0};
  }
  void run(cpu::AdamWPart part, int64_t step, Form form) {
    AdamWParams a;
    a.lr = 1e-5f, a.weight_decay = 0.1f, a.beta2 = 0.95f, a.grad_scale = 0.5f, a.step = step, a.round_seed = 7;
    const Tensor gt(g.data(), DType::BF16, {n}), mt(m.data(), state, {n}), vt(v.data(), state, {n});
    if (form == Form::Split) {
      cpu::adamw_split(split(), gt, mt, vt, a, part);
    } else {
      const bool copy = form == Form::Copy && part != cpu::AdamWPart::Moments;
      cpu::adamw(Tensor(p.data(), DType::F32, {n}), gt, mt, vt, copy ? Tensor(c.data(), DType::BF16, {n}) : Tensor(), a,
                 part);
    }
  }
};

// Bytes a parameter each pass moves (reads + writes), bf16 gradient: see planner.cpp pass_bytes
// (a copy: 2 more written; split: the master's 4 read and 4 written as two halves, the same).
double pass_bytes(cpu::AdamWPart part, double s, Form form) {
  if (part == cpu::AdamWPart::Moments) return 2 + 4 * s;
  const double copy = form == Form::Copy ? 2 : 0;
  if (part == cpu::AdamWPart::Params) return 2 + 8 + 2 * s + copy;
  return 2 + 8 + 4 * s + copy;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::max<int64_t>(1, int64_t(std::atof(argv[i]) * double(1 << 20))));
  if (sizes.empty()) sizes = {int64_t(1) << 20, int64_t(64) << 20};
  const int repeats = 15;
  const int threads = cpu_pool().size();
  std::string json = "{\"threads\":" + std::to_string(threads);
  const struct {
    cpu::AdamWPart part;
    const char* name;
  } parts[] = {
      {cpu::AdamWPart::All, "fused"}, {cpu::AdamWPart::Params, "params"}, {cpu::AdamWPart::Moments, "moments"}};
  for (int64_t n : sizes) {
    const std::string where = std::to_string(n) + "_elements";
    for (DType st : {DType::F32, DType::BF16}) {
      Arrays a(n, st);
      const char* sname = st == DType::BF16 ? "bf16" : "fp32";
      for (const auto& pt : parts)
        for (Form form : {Form::Master, Form::Copy, Form::Split}) {
          if (form != Form::Master && pt.part == cpu::AdamWPart::Moments) continue;  // (no parameter)
          const char* fname = form == Form::Master ? "" : form == Form::Copy ? "+copy" : "split";
          // Few calls a run and the best of many runs: a shared machine's other load lands in some
          // runs, not in all (the best is the kernel's own speed).
          const int calls = int(std::max<int64_t>(1, (int64_t(1) << 20) / n));
          double best = 1e30;
          a.run(pt.part, 1, form);  // warm (pages touched, code hot)
          for (int r = 0; r < repeats; ++r) {
            const double t0 = now();
            for (int c = 0; c < calls; ++c) a.run(pt.part, 2 + r, form);
            best = std::min(best, (now() - t0) / calls);
          }
          const double gps = double(n) / best / 1e9;
          const double gbs = gps * pass_bytes(pt.part, st == DType::BF16 ? 2 : 4, form);
          const std::string name = std::string(pt.name) + fname;
          std::printf("%-16s %-5s state %-13s %7.3f G params/s  %6.1f GB/s  %.3f ns/param/thread\n", where.c_str(),
                      sname, name.c_str(), gps, gbs, threads / gps);
          json += ",\"" + std::string(where) + "_" + sname + "_" + name + "_gparams_s\":" + std::to_string(gps);
        }
    }
  }
  std::printf("%s}\n", json.c_str());
  return 0;
}
