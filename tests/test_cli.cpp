// The slideformer binary end to end: init -> eval -> grad -> train on tiny models, data order and
// accumulation semantics, and every class of bad input (exit code 2, one line naming the file).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "backend/device.h"
#include "core/error.h"
#include "data/tokenizer/tokenizer.h"
#include "io/checkpoint.h"
#include "io/output_dir.h"
#include "io/output_lock.h"
#include "io/safetensors.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::CmdResult;
using test::slurp;

// Every tensor of `a` is in `b` with the same bytes.
void expect_same_tensors(const SafetensorsFile& a, const SafetensorsFile& b) {
  for (const auto& t : a.tensors()) {
    const TensorInfo* u = b.find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(std::memcmp(t.data, u->data, t.bytes), 0) << t.name;
  }
}

// A stored F32 tensor's values (copied: mmapped data need not be aligned).
std::vector<float> floats(const TensorInfo& t) {
  std::vector<float> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

// Every F32 tensor of `a` is in `b` with values within relative error `tol`.
void expect_close_tensors(const SafetensorsFile& a, const SafetensorsFile& b, double tol) {
  for (const auto& t : a.tensors()) {
    const TensorInfo* u = b.find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_LT(test::rel_err(floats(t), floats(*u)), tol) << t.name;
  }
}

// The length of a safetensors file's JSON header (its first 8 bytes, little-endian).
uint64_t header_bytes(const std::string& raw) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(raw[size_t(i)]);
  return n;
}

// A scratch directory per test with tiny models and data files in it, and the command lines run there.
class Cli : public test::BinaryTest {
 protected:
  // DIR/name holding `text`; its path.
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(p(name)) << text;
    return p(name);
  }
  // `init` of a random model from `config` (written to DIR/name.json) at DIR/name.
  CmdResult init(const json& config, const std::string& name, const std::string& options = "") {
    return run("init --config " + write(name + ".json", config.dump()) + " --output " + p(name) + options);
  }
  // A random model of `family` in `dtype` at DIR/name.
  std::string make_model(const std::string& family, const std::string& name, const std::string& dtype = "fp32") {
    CmdResult r = init(test::tiny_config(family), name, " --seed 3 --dtype " + dtype);
    EXPECT_EQ(r.code, 0) << r.err;
    return p(name);
  }
  // A copy of the model directory `model` at DIR/name, with `config` as its config.json.
  std::string copy_model(const std::string& model, const std::string& name, const std::string& config) {
    fs::copy(model, p(name), fs::copy_options::recursive);
    fs::remove(p(name + "/.sf-manifest.json"));  // an edited copy: no longer slideformer's output
    write(name + "/config.json", config);
    return p(name);
  }
  // Ragged, partly masked records, some longer than the sequence length used in the tests.
  std::string make_data(const std::string& name, int n, int vocab = 37) {
    std::ofstream f(p(name));
    std::mt19937_64 rng(n);
    for (int i = 0; i < n; ++i) {
      int len = 2 + int(rng() % 20);
      json ids = json::array(), labels = json::array();
      for (int t = 0; t < len; ++t) {
        int id = int(rng() % vocab);
        ids.push_back(id);
        labels.push_back(t % 5 == 2 ? -100 : id);
      }
      json rec = {{"input_ids", ids}};
      if (i % 2) rec["labels"] = labels;
      f << rec.dump() << "\n";
    }
    return p(name);
  }
  // The start of a command line that reads a data file: the command, model, data and (when given)
  // output.
  static std::string data_cmd(const std::string& command, const std::string& model, const std::string& data,
                              const std::string& output = "") {
    return command + " --model " + model + " --data " + data + (output.empty() ? "" : " --output " + output);
  }
  static std::string train_cmd(const std::string& model, const std::string& data, const std::string& output = "") {
    return data_cmd("train", model, data, output);
  }
  static std::string eval_cmd(const std::string& model, const std::string& data) {
    return data_cmd("eval", model, data);
  }
  // The weights of a model directory.
  static SafetensorsFile weights(const std::string& dir) { return SafetensorsFile::open(dir + "/model.safetensors"); }
  // Whether two model directories hold the same model.safetensors, byte for byte.
  static bool same_weights(const std::string& a, const std::string& b) {
    return slurp(a + "/model.safetensors") == slurp(b + "/model.safetensors");
  }
  // run() with `env` (VAR=value ...) before the binary; a death by signal n is code 128 + n.
  CmdResult run_with_env(const std::string& env, const std::string& args) {
    CmdResult r;
    const fs::path o = dir_ / "stdout.txt", e = dir_ / "stderr.txt";
    const int status =
        std::system((env + " " + SF_BINARY + " " + args + " >" + o.string() + " 2>" + e.string()).c_str());
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : (WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1);
    r.out = slurp(o);
    r.err = slurp(e);
    return r;
  }
  // The binary with `args` in the background (stdout, stderr to files); its pid (-1: fork failed).
  pid_t spawn(const std::string& args, const std::string& out, const std::string& err) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string cmd = "exec " + std::string(SF_BINARY) + " " + args + " >" + out + " 2>" + err;
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  }
  // Whether the file `path` comes to hold `needle` within 60 s.
  static bool wait_for(const std::string& path, const std::string& needle) {
    for (int i = 0; i < 600; ++i) {
      if (slurp(path).find(needle) != std::string::npos) return true;
      usleep(100000);
    }
    return false;
  }
  // Expects exit code 2 and a single stderr line mentioning `needle`.
  void expect_input_error(const CmdResult& r, const std::string& needle) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "stderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr: " << r.err;
  }
};

TEST_F(Cli, InitEvalGradTrainEveryFamily) {
  std::string data = make_data("d.jsonl", 12);
  for (size_t f = 0; f < test::families().size(); ++f) {
    const std::string& fam = test::families()[f];
    for (const std::string dtype : {"fp32", "bf16"}) {
      // Under the sanitizers each family in one checkpoint dtype, fp32 and bf16 by turns: every
      // family's code and both dtypes' still run, in half the runs of the binary.
      if (test::kSanitizerBuild && (dtype == "bf16") != (f % 2 == 1)) continue;
      SCOPED_TRACE(fam + " " + dtype);
      std::string model = make_model(fam, fam + dtype, dtype);
      ASSERT_TRUE(fs::exists(model + "/model.safetensors"));
      CmdResult ev = run(eval_cmd(model, data) + " --seq-len 16 --batch-size 5 --device cpu");
      ASSERT_EQ(ev.code, 0) << ev.err;
      double loss = ev.last()["loss"];
      EXPECT_NEAR(loss, std::log(37.0), 1.0);  // a random model is near uniform
      int64_t tokens = ev.last()["tokens"];
      EXPECT_GT(tokens, 50);

      // Batch size does not change the mean over the file.
      CmdResult ev2 = run(eval_cmd(model, data) + " --seq-len 16 --batch-size 1 --device cpu");
      EXPECT_NEAR(double(ev2.last()["loss"]), loss, 1e-5 * loss);

      CmdResult gr = run(data_cmd("grad", model, data, p("g.safetensors")) + " --seq-len 16 --device cpu");
      ASSERT_EQ(gr.code, 0) << gr.err;
      auto g = SafetensorsFile::open(p("g.safetensors"));
      auto w = weights(model);
      EXPECT_EQ(g.tensors().size(), w.tensors().size());
      for (const auto& t : w.tensors()) {
        const TensorInfo* gt = g.find(t.name);
        ASSERT_NE(gt, nullptr) << t.name;
        EXPECT_EQ(gt->shape, t.shape);
        EXPECT_EQ(gt->dtype, DType::F32);
      }
      EXPECT_NEAR(std::stod(g.metadata().at("loss")), loss, 1e-6 * loss);

      CmdResult tr =
          run(train_cmd(model, data, p("out")) + " --steps 3 --lr 1e-2 --batch-size 4 --seq-len 16 --device cpu");
      ASSERT_EQ(tr.code, 0) << tr.err;
      EXPECT_NE(tr.err.find("step 3/3 loss"), std::string::npos) << tr.err;
      auto o = weights(p("out"));
      EXPECT_EQ(o.tensors().size(), w.tensors().size());
      EXPECT_EQ(o.tensors()[0].dtype, w.tensors()[0].dtype);  // saved in the checkpoint's dtype
      json cfg = json::parse(slurp(p("out") + "/config.json"));
      EXPECT_EQ(cfg["architectures"][0], test::tiny_config(fam)["architectures"][0]);
      CmdResult ev3 = run(eval_cmd(p("out"), data) + " --seq-len 16 --device cpu");
      ASSERT_EQ(ev3.code, 0) << ev3.err;
      EXPECT_LT(double(ev3.last()["loss"]), loss);  // 3 steps at lr 1e-2 on the same data
    }
  }
}

// With --no-shuffle, K micro-batches of B records = one micro-batch of K*B records: same
// update, because the step's loss is normalised by its total trained tokens.
TEST_F(Cli, GradAccumulationMatchesOneLargeBatch) {
  std::string model = make_model("qwen3", "m");
  std::string data = make_data("d.jsonl", 8);
  std::string common = " --model " + model + " --data " + data +
                       " --steps 2 --lr 1e-2 --weight-decay 0.1 --no-shuffle --seq-len 16 --device cpu";
  ASSERT_EQ(run("train" + common + " --batch-size 4 --grad-accum 1 --output " + p("a")).code, 0);
  ASSERT_EQ(run("train" + common + " --batch-size 1 --grad-accum 4 --output " + p("b")).code, 0);
  expect_close_tensors(weights(p("a")), weights(p("b")), 1e-5);
}

// --compute-dtype bf16 on the cpu mirrors the GPU's rounding: close to fp32, but not equal.
TEST_F(Cli, Bf16ComputeOnCpuIsCloseToFp32) {
  std::string model = make_model("qwen3", "m");
  std::string data = make_data("d.jsonl", 8);
  std::string common = "--model " + model + " --data " + data + " --seq-len 16 --device cpu";
  CmdResult f = run("eval " + common);
  CmdResult b = run("eval " + common + " --compute-dtype bf16");
  ASSERT_EQ(f.code, 0) << f.err;
  ASSERT_EQ(b.code, 0) << b.err;
  double lf = f.last()["loss"], lb = b.last()["loss"];
  EXPECT_NE(lf, lb);
  EXPECT_NEAR(lb, lf, 1e-2 * lf);  // bf16 activations: ~3 significant digits
  ASSERT_EQ(run("grad " + common + " --output " + p("gf.safetensors")).code, 0);
  ASSERT_EQ(run("grad " + common + " --compute-dtype bf16 --output " + p("gb.safetensors")).code, 0);
  // The GPU parity tolerance is 3e-2 on larger models.
  expect_close_tensors(SafetensorsFile::open(p("gf.safetensors")), SafetensorsFile::open(p("gb.safetensors")), 5e-2);
  CmdResult tr = run("train " + common + " --compute-dtype bf16 --steps 2 --lr 1e-3 --output " + p("out"));
  EXPECT_EQ(tr.code, 0) << tr.err;
  expect_input_error(run("eval " + common + " --compute-dtype fp8"),
                     "slideformer: --compute-dtype: unknown compute dtype 'fp8' (expected fp32 or bf16)");
}

// --offload (the sliding engine) gives the same loss and trained weights as the in-memory engine
// on the cpu backend, bit for bit with one micro-batch a step; gradients summed over several
// micro-batches add in another order (on the host), so they agree to rounding.
TEST_F(Cli, OffloadMatchesInMemory) {
  std::string model = make_model("qwen2", "m");
  std::string data = make_data("d.jsonl", 8);
  std::string common = "--model " + model + " --data " + data + " --seq-len 16 --batch-size 3 --device cpu";
  CmdResult a = run("eval " + common), b = run("eval " + common + " --offload --slots 2 --gpu-blobs 0");
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(double(a.last()["loss"]), double(b.last()["loss"]));
  EXPECT_EQ(a.last()["engine"], "resident");  // which engine ran (tools/hf_parity.py checks it)
  EXPECT_EQ(b.last()["engine"], "sliding");
  CmdResult g = run("grad " + common + " --output " + p("ga.safetensors"));
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.last()["engine"], "resident");
  g = run("grad " + common + " --offload --gpu-blobs 0 --output " + p("gb.safetensors"));
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.last()["engine"], "sliding");
  expect_close_tensors(SafetensorsFile::open(p("ga.safetensors")), SafetensorsFile::open(p("gb.safetensors")), 1e-6);
  std::string tr = "train " + common + " --steps 3 --lr 1e-2 --weight-decay 0.1 --max-grad-norm 1 --output ";
  ASSERT_EQ(run(tr + p("ta")).code, 0);
  CmdResult t = run(tr + p("tb") + " --offload --gpu-blobs 0");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_TRUE(same_weights(p("ta"), p("tb")));
  // The planner's default keeps the blobs that fit whole on the (here: cpu) device; --gpu-blobs 2
  // keeps the embedding and the head there and slides the layers.
  for (const char* kept : {"", " --gpu-blobs 2"}) {
    fs::remove_all(p("tk"));
    t = run(tr + p("tk") + " --offload" + kept);
    ASSERT_EQ(t.code, 0) << t.err;
    EXPECT_TRUE(same_weights(p("ta"), p("tk"))) << kept;
  }
  // Without clipping the sliding engine updates each blob during the backward: still the same.
  std::string tr2 = "train " + common + " --steps 3 --lr 1e-2 --weight-decay 0.1 --output ";
  ASSERT_EQ(run(tr2 + p("tc")).code, 0);
  ASSERT_EQ(run(tr2 + p("td") + " --offload --slots 2 --gpu-blobs 1").code, 0);
  EXPECT_TRUE(same_weights(p("tc"), p("td")));
  // A tied model with 4 micro-batches a step (layer-major in the sliding engine), clipped or not.
  std::string tied = make_model("mistral", "mt");
  std::string acc =
      train_cmd(tied, data) + " --seq-len 16 --batch-size 2 --grad-accum 4 --device cpu --steps 2 --lr 1e-2 --output ";
  for (const char* clip : {" --max-grad-norm 1", " --max-grad-norm 0"}) {
    for (const char* o : {"ua", "ub"}) fs::remove_all(p(o));
    ASSERT_EQ(run(acc + p("ua") + clip).code, 0);
    CmdResult u = run(acc + p("ub") + clip + " --offload --slots 2 --gpu-blobs 0");
    ASSERT_EQ(u.code, 0) << u.err;
    EXPECT_TRUE(same_weights(p("ua"), p("ub"))) << clip;
  }
  expect_input_error(run("eval " + common + " --offload --slots 1"),
                     "slideformer: --slots: the sliding engine needs at least 2 GPU parameter slots");
  expect_input_error(run("eval " + common + " --offload --gpu-blobs 99"), "slideformer: --gpu-blobs: the model has ");
}

TEST_F(Cli, ShardedOutputAndSaveEvery) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 6);
  CmdResult r = run(train_cmd(model, data, p("out")) +
                    " --steps 4 --lr 1e-3 --save-every 2 --max-shard-size 20KB --seq-len 16 --device cpu");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(p("out") + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(p("out") + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(p("out") + "/checkpoint-2/config.json"));
  CmdResult ev = run(eval_cmd(p("out"), data) + " --device cpu");
  EXPECT_EQ(ev.code, 0) << ev.err;
  CmdResult ev2 = run(eval_cmd(p("out") + "/checkpoint-2", data) + " --device cpu");
  EXPECT_EQ(ev2.code, 0) << ev2.err;
}

// A run resumed from checkpoint-2 ends with exactly the weights of the uninterrupted run (CPU,
// fp32: same op order, so bit for bit), data order (shuffled) and schedule included.
TEST_F(Cli, ResumeContinuesExactly) {
  std::string model = make_model("qwen2", "m");
  std::string data = make_data("d.jsonl", 9);
  std::string common = " --model " + model + " --data " + data +
                       " --steps 4 --lr 1e-2 --weight-decay 0.1 --warmup-steps 1 --lr-schedule cosine "
                       "--batch-size 2 --grad-accum 2 --seq-len 16 --max-grad-norm 1 --seed 5 --device cpu";
  CmdResult a = run("train" + common + " --output " + p("a") + " --save-every 2");
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_TRUE(fs::exists(p("a") + "/checkpoint-2/training_state.safetensors"));
  CmdResult b = run("train" + common + " --output " + p("b") + " --resume " + p("a") + "/checkpoint-2");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(b.err.find("step 1/4"), std::string::npos) << b.err;  // steps 1 and 2 are not run again
  EXPECT_NE(b.err.find("step 4/4"), std::string::npos) << b.err;
  expect_same_tensors(weights(p("a")), weights(p("b")));
  // Resuming with other data-order options is refused.
  expect_input_error(run("train" + common + " --output " + p("c") + " --resume " + p("a") + "/checkpoint-2 --seed 6"),
                     "seed");
  expect_input_error(run("train" + common + " --output " + p("c") + " --resume " + model), "training state");
}

// --optimizer-state bf16: AdamW m and v stored in bf16 (stochastic rounding keyed by seed, step,
// blob and element). The sliding engine (--offload) trains to the resident engine's bytes; the
// checkpoint stores the moments as BF16 and a resume continues exactly; a resume with the other
// --optimizer-state is refused (exit 2, one line), as is an unknown state dtype.
TEST_F(Cli, Bf16OptimizerStateResumesExactly) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 9);
  std::string common = " --model " + model + " --data " + data +
                       " --steps 4 --lr 1e-2 --weight-decay 0.1 --warmup-steps 1 --lr-schedule cosine "
                       "--batch-size 2 --grad-accum 2 --seq-len 16 --max-grad-norm 1 --seed 5 --device cpu "
                       "--optimizer-state bf16";
  CmdResult a = run("train" + common + " --output " + p("a") + " --save-every 2");
  ASSERT_EQ(a.code, 0) << a.err;
  auto st = SafetensorsFile::open(p("a") + "/checkpoint-2/training_state.safetensors");
  int moments = 0;
  for (const TensorInfo& t : st.tensors()) {
    const bool moment = t.name.rfind("adam_", 0) == 0;
    moments += moment;
    EXPECT_EQ(t.dtype, moment ? DType::BF16 : DType::F32) << t.name;
  }
  EXPECT_GT(moments, 0);
  CmdResult off = run("train" + common + " --output " + p("off") + " --offload --slots 2");
  ASSERT_EQ(off.code, 0) << off.err;
  expect_same_tensors(weights(p("a")), weights(p("off")));
  CmdResult b = run("train" + common + " --output " + p("b") + " --resume " + p("a") + "/checkpoint-2");
  ASSERT_EQ(b.code, 0) << b.err;
  expect_same_tensors(weights(p("a")), weights(p("b")));
  // The fp32-state run differs (the moments were rounded), and neither resumes the other's state.
  const std::string fp32 = common.substr(0, common.find(" --optimizer-state"));
  CmdResult c = run("train" + fp32 + " --output " + p("c") + " --save-every 2");
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_FALSE(same_weights(p("a"), p("c")));
  expect_input_error(run("train" + fp32 + " --output " + p("d") + " --resume " + p("a") + "/checkpoint-2"),
                     "--optimizer-state");
  expect_input_error(run("train" + common + " --output " + p("e") + " --resume " + p("c") + "/checkpoint-2"),
                     "--optimizer-state");
  CmdResult bad = run("train" + fp32 + " --output " + p("f") + " --optimizer-state fp16");
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("optimizer-state"), std::string::npos) << bad.err;
}

TEST_F(Cli, BadDataIsRefusedWithFileAndLine) {
  std::string model = make_model("llama", "m");
  auto ev = [&](const std::string& data) { return run(eval_cmd(model, data)); };
  expect_input_error(ev(write("a.jsonl", "{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 2\n")), "a.jsonl:2");
  expect_input_error(ev(write("b.jsonl", "{\"input_ids\": [1, 37]}\n")), "b.jsonl:1");  // id >= vocab
  expect_input_error(ev(write("c.jsonl", "{\"input_ids\": [1, 2], \"labels\": [1]}\n")), "c.jsonl:1");
  expect_input_error(ev(write("d.jsonl", "{\"tokens\": [1, 2]}\n")), "d.jsonl:1");
  expect_input_error(ev(write("e.jsonl", "{\"input_ids\": [1, -3]}\n")), "e.jsonl:1");
  expect_input_error(ev(write("f.jsonl", "{\"input_ids\": [1, 2], \"labels\": [-100, -100]}\n")), "f.jsonl");
  expect_input_error(ev(p("missing.jsonl")), "missing.jsonl");
}

TEST_F(Cli, BadModelsAreRefusedWithFileAndTensor) {
  std::string data = make_data("d.jsonl", 3);
  std::string model = make_model("qwen2", "m");
  auto ev = [&](const std::string& m) { return run(eval_cmd(m, data)); };
  // A copy of the model whose config differs from the weights' by `key` = `value`.
  auto with_config = [&](const std::string& name, const char* key, const json& value) {
    json c = test::tiny_config("qwen2");
    c[key] = value;
    return copy_model(model, name, c.dump());
  };
  expect_input_error(ev(p("nope")), "nope");
  expect_input_error(ev(copy_model(model, "badcfg", "{\"vocab_size\": 37,")), "badcfg/config.json");
  expect_input_error(ev(with_config("arch", "architectures", json::array({"BertForMaskedLM"}))), "BertForMaskedLM");
  expect_input_error(ev(with_config("shape", "intermediate_size", 40)), "mlp.gate_proj.weight");
  // missing tensor: a config with one more layer than the weights
  expect_input_error(ev(with_config("missing", "num_hidden_layers", 3)), "model.layers.2.");

  // truncated safetensors
  fs::copy(model, p("trunc"), fs::copy_options::recursive);
  fs::resize_file(p("trunc/model.safetensors"), fs::file_size(p("trunc/model.safetensors")) - 100);
  expect_input_error(ev(p("trunc")), "model.safetensors");

  // unsupported dtype (I32 tensor)
  fs::copy(model, p("dtype"), fs::copy_options::recursive);
  std::vector<int32_t> junk(4, 1);
  write_safetensors(p("dtype/model.safetensors"), {TensorWrite{"model.norm.weight", DType::I32, {4}, junk.data()}});
  expect_input_error(ev(p("dtype")), "I32");
}

TEST_F(Cli, FailedTrainLeavesNoOutput) {
  std::string model = make_model("mistral", "m");
  const std::string bad = write("bad.jsonl", "{\"input_ids\": [1, 2]}\nnot json\n");
  expect_input_error(run(train_cmd(model, bad, p("out")) + " --steps 2 --lr 1e-3 --device cpu"), "bad.jsonl:2");
  EXPECT_FALSE(fs::exists(p("out")));
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_NE(e.path().filename().string().rfind("out.", 0), 0u) << "staging directory left: " << e.path();
  }
  // Bad options are input errors too.
  expect_input_error(run(train_cmd(model, bad, p("out")) + " --steps 2 --lr 1e-3 --lr-schedule wavy"), "wavy");
  expect_input_error(run("eval --model " + model), "--data");
  expect_input_error(run("frobnicate"), "frobnicate");
}

// A NaN loss stops the run before any update, says so, and writes no output directory.
TEST_F(Cli, NanLossStopsTraining) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 4);
  {
    auto f = weights(model);
    std::vector<std::vector<float>> copies;
    std::vector<TensorWrite> tw;
    for (const auto& t : f.tensors()) {
      copies.emplace_back(size_t(t.numel()));
      std::memcpy(copies.back().data(), t.data, t.bytes);
      if (t.name == "model.norm.weight") copies.back()[0] = std::nanf("");
      tw.push_back(TensorWrite{t.name, t.dtype, t.shape, copies.back().data()});
    }
    write_safetensors(p("nan.safetensors"), tw);
  }
  fs::rename(p("nan.safetensors"), model + "/model.safetensors");
  fs::remove(model + "/.sf-manifest.json");  // another program's file now
  // Refused on load (issue 16); --no-verify lets it through to the loss check.
  expect_input_error(run(train_cmd(model, data, p("out")) + " --steps 3 --lr 1e-3 --seq-len 16 --device cpu"),
                     model + "/model.safetensors: tensor model.norm.weight: element 0 is NaN or infinite");
  CmdResult r =
      run(train_cmd(model, data, p("out")) + " --steps 3 --lr 1e-3 --seq-len 16 --device cpu --no-verify");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("loss is nan at step 1"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(p("out")));
}

TEST_F(Cli, SlidingWindowShorterThanSeqLenIsRefused) {
  json c = test::tiny_config("mistral");
  c["sliding_window"] = 8;
  ASSERT_EQ(init(c, "m").code, 0);
  std::string data = make_data("d.jsonl", 3);
  expect_input_error(run(eval_cmd(p("m"), data) + " --seq-len 16"), "sliding");
  EXPECT_EQ(run(eval_cmd(p("m"), data) + " --seq-len 8").code, 0);
}

// `plan` lists every buffer and says whether it fits; a run whose plan does not fit is refused
// before anything is allocated or written, with the numbers.
TEST_F(Cli, PlanAndRefusalWhenItDoesNotFit) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 6);
  const std::string plan = "plan --model " + model + " --device cpu --batch-size 2 --seq-len 16";
  CmdResult r = run(plan);
  ASSERT_EQ(r.code, 0) << r.err;
  json j = r.last();
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_EQ(j["engine"], "resident");
  EXPECT_GT(j["host_bytes"].get<double>(), 0);
  EXPECT_NE(r.err.find("fp32 master weights"), std::string::npos) << r.err;

  r = run(plan + " --measure");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.last()["rates"]["measured"].get<bool>());
  EXPECT_GT(r.last()["rates"]["host_adamw_params_s"].get<double>(), 1e6);
  EXPECT_GT(r.last()["rates"]["host_read_gbs"].get<double>(), 0.1);
  EXPECT_NE(r.err.find("measured: host AdamW"), std::string::npos) << r.err;

  r = run(plan + " --offload --slots 4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.last()["engine"], "sliding");
  EXPECT_EQ(r.last()["slots"], 4);

  r = run(plan + " --cpu-memory 64KiB");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(r.last()["fits"].get<bool>());
  EXPECT_NE(r.last()["why"].get<std::string>().find("host memory"), std::string::npos);
  EXPECT_NE(r.last()["why"].get<std::string>().find(" available (--cpu-memory)"), std::string::npos);
  EXPECT_NE(r.err.find("DOES NOT FIT: needs "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" available (--cpu-memory)"), std::string::npos) << r.err;

  r = run(train_cmd(model, data, p("out")) + " --steps 1 --lr 1e-3 --device cpu --cpu-memory 64KiB");
  expect_input_error(r, "host memory");
  EXPECT_FALSE(fs::exists(p("out")));

  expect_input_error(run("plan --device cpu"), "--model");
  expect_input_error(run("plan --model " + model + " --device cpu --gpu-memory lots"), "--gpu-memory");
  expect_input_error(run(eval_cmd(model, data) + " --device cpu --offload --no-offload"), "--offload");
}

// The lower layers name settings as data; the CLI names the options in the line the user reads.
TEST_F(Cli, RefusalsNameTheOptions) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 6);
  expect_input_error(run(eval_cmd(model, data) + " --seq-len 16 --device tpu"),
                     "slideformer: --device: unknown device 'tpu' (expected cpu, cuda or auto)");
  if (!cuda_available()) {
    CmdResult r = run(eval_cmd(model, data) + " --seq-len 16 --device cuda");
    expect_input_error(r, "slideformer: --device cuda: ");
  }
  // The in-memory engine forced and too little host memory: the plan's numbers and both options.
  CmdResult r = run(eval_cmd(model, data) + " --seq-len 16 --device cpu --no-offload --cpu-memory 64KiB");
  expect_input_error(r, "slideformer: plan: the resident engine needs ");
  expect_input_error(r, " available (--cpu-memory) (try --offload); `slideformer plan` lists every buffer");
  // A sliding-window model: the window and the option's largest value.
  json cfg = test::tiny_config("mistral");
  cfg["sliding_window"] = 16;
  const std::string c = write("sw.json", cfg.dump());
  expect_input_error(run("plan --config " + c + " --device cpu --seq-len 32"),
                     "slideformer: " + c +
                         ": the model uses sliding-window attention (window 16) shorter than --seq-len 32; sliding "
                         "windows are not supported: use --seq-len <= 16");
}

// The global options -q / -v are taken before or after the subcommand, as people type them; an
// option nobody knows is still refused with one line naming it.
TEST_F(Cli, GlobalOptionsAnywhereOnTheLine) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 6);
  const std::string tr = train_cmd(model, data) + " --steps 2 --lr 1e-3 --batch-size 2 --seq-len 16 --device cpu";
  CmdResult plain = run(tr + " --output " + p("o1"));
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_NE(plain.err.find("step 2/2"), std::string::npos) << plain.err;  // progress lines by default
  for (const std::string& line : {tr + " --output " + p("o2") + " -q", "-q " + tr + " --output " + p("o3"),
                                  tr + " -q --output " + p("o4"), tr + " --output " + p("o5") + " --quiet"}) {
    CmdResult q = run(line);
    EXPECT_EQ(q.code, 0) << line << "\n" << q.err;
    EXPECT_EQ(q.err, "") << line;                      // no progress, no plan, nothing
    EXPECT_EQ(json::parse(q.out)["last_loss"], json::parse(plain.out)["last_loss"]) << line;  // the same run
  }
  for (const std::string& line : {tr + " --output " + p("o6") + " -v", "-v " + tr + " --output " + p("o7")}) {
    CmdResult v = run(line);
    EXPECT_EQ(v.code, 0) << line << "\n" << v.err;
    EXPECT_NE(v.err.find("device cpu, 6 records"), std::string::npos) << line << "\n" << v.err;  // a debug line
    EXPECT_EQ(json::parse(v.out)["last_loss"], json::parse(plain.out)["last_loss"]) << line;
  }
  EXPECT_EQ(plain.err.find("device cpu, 6 records"), std::string::npos) << plain.err;
  const std::string out = " --output " + p("bad");
  for (const std::string& bad : {tr + out + " --no-such-option", tr + out + " -x", "--no-such-option " + tr + out}) {
    CmdResult r = run(bad);
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.err.find("--no-such-option") != std::string::npos || r.err.find("-x") != std::string::npos)
        << r.err;
  }
}

// `slideformer train CONFIG.yaml key=value`: the same run as the options on the command line;
// what the file cannot say is refused with file:line.
TEST_F(Cli, YamlConfigWithOverrides) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 6);
  const std::string yaml = write("run.yaml",
                                 "# a run\n"
                                 "model: " +
                                     model +
                                     "\n"
                                     "data: \"" +
                                     data +
                                     "\"\n"
                                     "seq_len: 16\n"
                                     "batch-size: 2\n"
                                     "steps: 5   # overridden below\n"
                                     "lr: 1e-3\n"
                                     "no-shuffle: true\n"
                                     "device: cpu\n");
  CmdResult a = run("train " + yaml + " steps=2 output=" + p("a"));
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.last()["steps"], 2);
  CmdResult b = run(train_cmd(model, data, p("b")) +
                    " --seq-len 16 --batch-size 2 --steps 2 --lr 1e-3 --no-shuffle --device cpu");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_TRUE(same_weights(p("a"), p("b")));
  // Options after the file work too.
  CmdResult c = run("train " + yaml + " --steps 1 --output " + p("c"));
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(c.last()["steps"], 1);

  expect_input_error(run("train " + write("nested.yaml", "model: m\noptimizer:\n  lr: 1\n")), "nested.yaml:2");
  expect_input_error(run("train " + write("twice.yaml", "lr: 1\nlr: 2\n")), "twice.yaml:2");
  expect_input_error(run("train " + yaml + " output=" + p("d") + " frobnicate=3"), "run.yaml");
  expect_input_error(run("train " + p("missing.yaml")), "missing.yaml");
}

// train --eval-data: the held-out loss after the last step is the one `eval` gives on the saved
// model (same batches, fp32 model and math on the cpu); a bad eval file stops before training.
TEST_F(Cli, TrainReportsHeldOutLoss) {
  std::string model = make_model("qwen3", "m");
  std::string data = make_data("d.jsonl", 8);
  std::string held = make_data("h.jsonl", 5);
  const std::string train = train_cmd(model, data) + " --eval-data " + held +
                            " --eval-every 2 --seq-len 16 --batch-size 3 --steps 3 --lr 1e-2 --device cpu";
  CmdResult t = run(train + " --output " + p("o"));
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.err.find("eval at step 2:"), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("eval at step 3:"), std::string::npos) << t.err;
  CmdResult e = run(eval_cmd(p("o"), held) + " --seq-len 16 --batch-size 3 --device cpu");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_EQ(double(t.last()["eval_loss"]), double(e.last()["loss"]));
  // The sliding engine evaluates between its overlapped updates: the same numbers.
  CmdResult so = run(train + " --offload --gpu-blobs 0 --output " + p("os"));
  ASSERT_EQ(so.code, 0) << so.err;
  EXPECT_EQ(double(so.last()["eval_loss"]), double(t.last()["eval_loss"]));

  const std::string bad = write("bad.jsonl", "{\"input_ids\": [1, 2]}\n{\"input_ids\": [1000000]}\n");
  expect_input_error(run(train_cmd(model, data, p("o2")) + " --eval-data " + bad + " --steps 1 --lr 1e-2 --device cpu"),
                     "bad.jsonl:2");
  EXPECT_FALSE(fs::exists(p("o2")));
  expect_input_error(run(train_cmd(model, data, p("o3")) + " --eval-every 2 --steps 1 --lr 1e-2 --device cpu"),
                     "--eval-data");
}

// Text records are tokenized with the model's tokenizer.json: the same loss as the ids written out
// by hand (prompt tokens untrained); without a tokenizer the data is refused with the file named.
TEST_F(Cli, TextRecordsUseTheModelsTokenizer) {
  json cfg = test::tiny_config("llama");
  cfg["vocab_size"] = 420;  // the test tokenizer has 408 ids
  ASSERT_EQ(init(cfg, "m", " --seed 3").code, 0);
  const std::string tokfile = std::string(SF_SOURCE_DIR) + "/tests/data/tokenizer/llama3.json";
  const std::string texts = write("t.jsonl",
                                  "{\"text\": \"Hello world, it's a test.\"}\n"
                                  "{\"prompt\": \"Q: 12+30?\\n\", \"completion\": \"A: 42\"}\n");
  expect_input_error(run(eval_cmd(p("m"), texts) + " --device cpu"), "tokenizer.json");
  fs::copy_file(tokfile, p("m") + "/tokenizer.json");

  const Tokenizer tok = Tokenizer::load(tokfile);
  const auto a = tok.encode("Hello world, it's a test.");
  const auto q = tok.encode("Q: 12+30?\n"), c = tok.encode("A: 42", false);
  json ids_b = q, labels_b = std::vector<int>(q.size(), -100);
  for (int32_t id : c) ids_b.push_back(id), labels_b.push_back(id);
  const std::string ids = write(
      "i.jsonl", json{{"input_ids", a}}.dump() + "\n" + json{{"input_ids", ids_b}, {"labels", labels_b}}.dump() + "\n");
  CmdResult et = run(eval_cmd(p("m"), texts) + " --device cpu");
  CmdResult ei = run(eval_cmd(p("m"), ids) + " --device cpu");
  ASSERT_EQ(et.code, 0) << et.err;
  ASSERT_EQ(ei.code, 0) << ei.err;
  EXPECT_EQ(double(et.last()["loss"]), double(ei.last()["loss"]));
  EXPECT_EQ(et.last()["tokens"], ei.last()["tokens"]);
  CmdResult t = run(train_cmd(p("m"), texts, p("o")) + " --steps 2 --lr 1e-3 --device cpu");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_TRUE(fs::exists(p("o") + "/tokenizer.json"));  // carried into the output
}

// Ctrl-C during training: the step finishes, a resumable checkpoint is saved, the exit status
// says which signal (128 + n), and --resume continues from it.
TEST_F(Cli, InterruptSavesACheckpoint) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 6);
  const std::string args =
      train_cmd(model, data, p("o")) + " --seq-len 16 --batch-size 2 --steps 1000000 --lr 1e-3 --device cpu";
  const std::string err = p("err.txt");
  const pid_t pid = spawn(args, p("out.txt"), err);
  ASSERT_GE(pid, 0);
  ASSERT_TRUE(wait_for(err, "step 3/")) << slurp(err);
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << slurp(err);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT) << slurp(err);
  const std::string log = slurp(err);
  EXPECT_NE(log.find("interrupted at step"), std::string::npos) << log;
  const json last = json::parse(slurp(p("out.txt")));
  ASSERT_TRUE(last["interrupted"].get<bool>());
  const std::string ck = last["checkpoint"];
  EXPECT_TRUE(fs::exists(ck + "/trainer_state.json"));
  EXPECT_TRUE(fs::exists(ck + "/model.safetensors"));
  const int64_t at = last["steps"];
  CmdResult r = run(train_cmd(model, data, p("o2")) + " --seq-len 16 --batch-size 2 --steps " + std::to_string(at + 1) +
                    " --lr 1e-3 --device cpu --resume " + ck);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.last()["steps"], 1);
}

// --output never removes what slideformer did not write: a directory holding other files is refused
// (exit 2) by every command that writes one, and nothing in it changes.
TEST_F(Cli, OutputRefusesDirectoriesItDidNotWrite) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 4);
  const std::string proj = p("project");
  fs::create_directories(proj + "/src");
  write("project/src/main.cpp", "int main() {}");
  write("project/config.json", "{}");
  const std::string cfg = write("cfg.json", test::tiny_config("llama").dump());
  expect_input_error(run(train_cmd(model, data, proj) + " --steps 1 --lr 1e-3 --seq-len 16 --device cpu"),
                     proj + ": exists and holds");
  expect_input_error(run(train_cmd(model, data, proj) + " --steps 1 --lr 1e-3 --seq-len 16 --device cpu"),
                     "which slideformer did not write; refusing to replace it (choose a new or empty --output "
                     "directory)");
  expect_input_error(run("init --config " + cfg + " --output " + proj + "/"), "did not write");
  expect_input_error(run("demo --steps 1 --output " + proj), "did not write");
  expect_input_error(run(train_cmd(model, data, write("plain", "x")) + " --steps 1 --lr 1e-3 --seq-len 16 --device cpu"),
                     "not a directory");
  expect_input_error(run(train_cmd(model, data, model) + "/config.json --steps 1 --lr 1e-3 --seq-len 16 --device cpu"),
                     "lies inside the --model input");
  EXPECT_EQ(slurp(proj + "/src/main.cpp"), "int main() {}");
  EXPECT_EQ(slurp(proj + "/config.json"), "{}");
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir_))
    n += e.path().filename().string().find(".sf-") != std::string::npos;
  EXPECT_EQ(n, 0u);
  // Its own output is replaced; a file a user put into it is kept.
  const std::string train = train_cmd(model, data, p("out")) + " --steps 2 --lr 1e-3 --seq-len 16 --device cpu";
  ASSERT_EQ(run(train + " --save-every 1").code, 0);
  write("out/NOTES.md", "mine");
  CmdResult again = run(train);
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(slurp(p("out") + "/NOTES.md"), "mine");
  EXPECT_TRUE(fs::exists(p("out") + "/checkpoint-1/model.safetensors"));
}

// A kill (SIGKILL) at every rename, fsync and link of every save of a run, into a new output and over
// an old one: the output is at every moment either absent (new run, nothing saved yet) or a complete
// model, every checkpoint reported saved loads, and the next run on the same output removes what the
// killed one left and completes.
TEST_F(Cli, KillAtEveryStepOfASaveLosesNothing) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 6);
  const std::string out = p("out");
  const std::string train =
      train_cmd(model, data, out) + " --steps 2 --save-every 1 --lr 1e-3 --seq-len 16 --device cpu";
  auto saved_paths = [](const std::string& err) {
    std::vector<std::string> v;
    std::istringstream in(err);
    std::string line;
    while (std::getline(in, line)) {
      size_t k = line.find("saved ");
      if (k != std::string::npos) v.push_back(line.substr(k + 6, line.find(';', k) - (k + 6)));
    }
    return v;
  };
  auto loads = [&](const std::string& dir) {  // every header and tensor index valid, config there
    try {
      CheckpointReader::open(dir);
      return fs::is_regular_file(dir + "/config.json");
    } catch (const InputError&) {
      return false;
    }
  };
  auto leftovers = [&] {
    std::vector<std::string> v;
    for (const auto& root : {fs::path(dir_), fs::path(out)}) {
      if (!fs::is_directory(root)) continue;
      for (const auto& e : fs::recursive_directory_iterator(root)) {
        std::string n = e.path().filename().string();
        if (n.find(".sf-tmp-") != std::string::npos || n.find(".sf-old-") != std::string::npos ||
            n.find(".sf-trash-") != std::string::npos || n.find(".sf-lock") != std::string::npos)
          v.push_back(n);
      }
    }
    return v;
  };
  // How many crash points a whole run passes, over an earlier output (the most: the replaced
  // output's removal has crash points of its own).
  ASSERT_EQ(run(train).code, 0);
  CmdResult clean = run_with_env("SF_CRASH_TRACE=1", train);
  fs::remove_all(out);
  ASSERT_EQ(clean.code, 0) << clean.err;
  const long points = long(std::count(clean.err.begin(), clean.err.end(), '\n')) -
                      long(saved_paths(clean.err).size());  // upper bound; the loop stops at the first clean run
  ASSERT_GT(points, 10);
  for (int scenario = 0; scenario < 4; ++scenario) {
    // 0, 2: a new output; 1, 3: over the complete output of an earlier run (with its checkpoints);
    // 2, 3: on a filesystem without RENAME_EXCHANGE (the old output steps aside first).
    const std::string fs_env = scenario >= 2 ? "SF_TEST_NO_EXCHANGE=1 " : "";
    // Every crash point of every scenario in the ordinary build (until a run passes them all). Under
    // the sanitizers the first point of each kind (fsync file, rename, link, exchange, remove dir,
    // ...) in each save of the scenario's own trace, 10-13 of its 37-44: each kind of leftover the
    // next run clears, in each save, still met (what the sanitizers check is the code that runs,
    // which the kind decides; each of a save's files passes the same points). (Each point is 2-3
    // runs of the binary: ~0.01 s of start-up each since the CUDA backend loads cuBLASLt on first
    // use, 0.4 s before.)
    std::vector<long> picked;
    if (test::kSanitizerBuild) {
      fs::remove_all(out);
      if (scenario % 2 == 1) {
        ASSERT_EQ(run_with_env(fs_env, train).code, 0);
      }
      const CmdResult trace = run_with_env(fs_env + "SF_CRASH_TRACE=1", train);
      ASSERT_EQ(trace.code, 0) << trace.err;
      std::set<std::string> kinds;
      int saves = 0;
      long n = 0;
      std::istringstream in(trace.err);
      for (std::string line; std::getline(in, line);) {
        if (line.find("saved ") != std::string::npos) ++saves;
        const size_t at = line.find("crash point ");
        if (at == std::string::npos) continue;
        ++n;
        const size_t colon = line.find(": ", at);
        ASSERT_NE(colon, std::string::npos) << line;
        if (kinds.insert(std::to_string(saves) + " " + line.substr(colon + 2)).second) picked.push_back(n);
      }
      ASSERT_GE(picked.size(), 8u) << trace.err;
    }
    size_t tried = 0;
    for (long k = 1;; ++k) {
      if (test::kSanitizerBuild) {
        if (tried == picked.size()) break;
        k = picked[tried];
      }
      ++tried;
      fs::remove_all(out);
      if (scenario % 2 == 1) {
        ASSERT_EQ(run_with_env(fs_env, train).code, 0);
      }
      CmdResult r = run_with_env(fs_env + "SF_CRASH_AT=" + std::to_string(k), train);
      if (r.code == 0 && !test::kSanitizerBuild) break;  // k is past the last crash point
      ASSERT_LE(k, points + 1) << "the crash points do not end";
      ASSERT_EQ(r.code, 128 + SIGKILL) << r.err;
      // Without RENAME_EXCHANGE an old directory is missing between two renames (kept aside as
      // "<name>.old-*"): what the next run's first step puts back is what counts there.
      if (scenario >= 2) claim_output_dir(out);
      if (scenario % 2 == 0 && !fs::exists(out)) {
        EXPECT_TRUE(saved_paths(r.err).empty()) << "k=" << k;
      } else {
        ASSERT_TRUE(fs::exists(out + "/" + kOutputMarker)) << "k=" << k;
        if (scenario % 2 == 1 || fs::exists(out + "/model.safetensors")) {
          EXPECT_TRUE(loads(out)) << "k=" << k;
        }
      }
      for (const std::string& ck : saved_paths(r.err)) {
        EXPECT_TRUE(loads(ck)) << "k=" << k << " " << ck;
      }
      if (scenario % 2 == 1) {
        EXPECT_TRUE(loads(out + "/checkpoint-1")) << "k=" << k;
      }
      CmdResult next = run_with_env(fs_env, train);
      ASSERT_EQ(next.code, 0) << "k=" << k << " " << next.err;
      EXPECT_EQ(leftovers(), std::vector<std::string>{}) << "k=" << k;
      for (const char* ck : {"/checkpoint-1", ""}) EXPECT_TRUE(loads(out + ck)) << "k=" << k << ck;
    }
    EXPECT_GT(tried, test::heavy<size_t>(20, 8)) << "scenario " << scenario << ": too few crash points were tried";
  }
}

// A flipped bit in any tensor of a checkpoint is refused by --resume (exit 2, file and tensor
// named) before anything is trained; an intact one resumes to the same weights; a checkpoint
// without checksums (an older slideformer) resumes with a warning.
TEST_F(Cli, ResumeVerifiesChecksums) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 6);
  const std::string common = " --model " + model + " --data " + data +
                             " --steps 3 --lr 1e-2 --batch-size 2 --seq-len 16 --seed 3 --device cpu";
  CmdResult a = run("train" + common + " --output " + p("a") + " --save-every 1");
  ASSERT_EQ(a.code, 0) << a.err;
  const std::string ck = p("a") + "/checkpoint-1";
  auto write_bytes = [](const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  };
  // Where a tensor's data lies in the file.
  auto data_at = [&](const std::string& path, const std::string& name) {
    auto f = SafetensorsFile::open(path);
    const TensorInfo* t = f.find(name);
    EXPECT_NE(t, nullptr) << name;
    return size_t(8 + header_bytes(slurp(path)) + size_t(t->data - f.tensors().front().data));
  };
  for (const auto& [file, tensor] : std::vector<std::pair<std::string, std::string>>{
           {"training_state.safetensors", "adam_v.model.layers.1.mlp.up_proj.weight"},
           {"model.safetensors", "model.norm.weight"}}) {
    fs::copy(ck, p("bad"), fs::copy_options::recursive);
    const std::string path = p("bad/" + file);
    std::string raw = slurp(path);
    raw[data_at(path, tensor) + 5] ^= 0x04;
    write_bytes(path, raw);
    CmdResult r = run("train" + common + " --output " + p("r") + " --resume " + p("bad"));
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("tensor " + tensor), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("step 2/3"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(p("r")));
    fs::remove_all(p("bad"));
  }
  // Intact: bit-identical to the uninterrupted run.
  CmdResult b = run("train" + common + " --output " + p("b") + " --resume " + ck);
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(b.err.find("warning"), std::string::npos) << b.err;
  auto fa = weights(p("a"));
  expect_same_tensors(fa, weights(p("b")));
  // Without checksums (the header rewritten without them): resumes, with a warning naming the file.
  fs::copy(ck, p("old"), fs::copy_options::recursive);
  const std::string state = p("old/training_state.safetensors");
  const std::string raw = slurp(state);
  const uint64_t n = header_bytes(raw);
  json hdr = json::parse(raw.substr(8, n));
  hdr["__metadata__"] = {{"format", "pt"}, {"step", "1"}};
  std::string h = hdr.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[size_t(i)] = char((uint64_t(h.size()) >> (8 * i)) & 0xff);
  write_bytes(state, len + h + raw.substr(8 + n));
  fs::remove(p("old/.sf-manifest.json"));  // older versions wrote none
  CmdResult c = run("train" + common + " --output " + p("c") + " --resume " + p("old"));
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.err.find("warning: " + state + " has no checksums"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("has no .sf-manifest.json"), std::string::npos) << c.err;
  auto fc = weights(p("c"));
  for (const auto& t : fa.tensors()) EXPECT_EQ(std::memcmp(t.data, fc.find(t.name)->data, t.bytes), 0) << t.name;
}

// Ctrl-C during the last step: the run completes and saves its output, and the exit status is still
// 128 + SIGINT (README); during an earlier step, a checkpoint as before.
TEST_F(Cli, InterruptDuringTheLastStepExits130) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 4);
  const std::string args =
      train_cmd(model, data) + " --steps 2 --lr 1e-3 --batch-size 2 --seq-len 16 --device cpu --output ";
  ::setenv("SF_RAISE_SIGINT_AT_STEP", "2", 1);
  CmdResult r = run(args + p("o"));
  ::setenv("SF_RAISE_SIGINT_AT_STEP", "1", 1);
  CmdResult e = run(args + p("e"));
  ::unsetenv("SF_RAISE_SIGINT_AT_STEP");
  EXPECT_EQ(r.code, 128 + SIGINT) << r.err;
  EXPECT_NE(r.err.find("step 2/2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("interrupted during the last step"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(p("o") + "/model.safetensors"));
  EXPECT_TRUE(r.last()["interrupted"].get<bool>());
  EXPECT_EQ(r.last()["steps"], 2);
  EXPECT_EQ(e.code, 128 + SIGINT) << e.err;
  EXPECT_TRUE(fs::exists(p("e") + "/checkpoint-1/training_state.safetensors"));
  EXPECT_EQ(e.last()["checkpoint"], p("e") + "/checkpoint-1");
}

// --pack: eval over packed rows gives the loss and token count of the records one a row (the
// kernels keep attention and positions inside each record; the matrix products sum in another
// blocking, so the loss agrees to rounding); packed training runs, and resumes to the same bytes.
TEST_F(Cli, PackedRowsEvalLikeUnpackedAndResumeExactly) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 13);
  const std::string ev = eval_cmd(model, data) + " --seq-len 16 --device cpu";
  CmdResult u = run(ev + " --batch-size 3");
  CmdResult k = run(ev + " --batch-size 2 --pack");
  ASSERT_EQ(u.code, 0) << u.err;
  ASSERT_EQ(k.code, 0) << k.err;
  EXPECT_EQ(u.last()["tokens"], k.last()["tokens"]);
  const double lu = u.last()["loss"], lk = k.last()["loss"];
  EXPECT_NEAR(lk, lu, 1e-5 * lu);

  const std::string unpacked = " --model " + model + " --data " + data +
                               " --steps 4 --lr 1e-2 --batch-size 2 --grad-accum 2 --seq-len 16 --max-grad-norm 1 "
                               "--seed 5 --device cpu";
  const std::string common = unpacked + " --pack";
  CmdResult a = run("train" + common + " --output " + p("a") + " --save-every 2");
  ASSERT_EQ(a.code, 0) << a.err;
  CmdResult b = run("train" + common + " --output " + p("b") + " --resume " + p("a") + "/checkpoint-2");
  ASSERT_EQ(b.code, 0) << b.err;
  auto fa = weights(p("a"));
  expect_same_tensors(fa, weights(p("b")));
  // Packed steps hold more records than unpacked ones: the runs differ.
  CmdResult c = run("train" + unpacked + " --output " + p("c"));
  ASSERT_EQ(c.code, 0) << c.err;
  auto fc = weights(p("c"));
  EXPECT_NE(std::memcmp(fa.tensors()[0].data, fc.tensors()[0].data, fa.tensors()[0].bytes), 0);
}

// tokenize --jsonl encodes a chunk of records at a time, in parallel, and prints them in input order,
// from a file or from stdin; the first bad line (in file order) is named, after the records before
// it, and nothing after it is printed.
TEST_F(Cli, TokenizeJsonlPrintsRecordsInOrder) {
  const std::string tokfile = std::string(SF_SOURCE_DIR) + "/tests/data/tokenizer/llama3.json";
  const Tokenizer tok = Tokenizer::load(tokfile);
  std::vector<std::string> texts;
  std::string lines;
  for (int i = 0; i < 2500; ++i) {
    texts.push_back("record " + std::to_string(i) + " " + std::string(size_t(i % 7), 'x') + "!");
    lines += json{{"text", texts.back()}}.dump() + (i % 600 == 5 ? "\n \n" : "\n");  // and blank lines
  }
  const std::string good = write("good.jsonl", lines);
  const std::string tokenize = "tokenize --tokenizer " + tokfile;
  for (const std::string& input : {good, "- < " + good}) {
    for (const bool special : {true, false}) {
      SCOPED_TRACE(input + (special ? "" : " --no-special"));
      CmdResult r = run(tokenize + " --jsonl " + input + (special ? "" : " --no-special"));
      ASSERT_EQ(r.code, 0) << r.err;
      std::istringstream out(r.out);
      size_t n = 0;
      for (std::string line; std::getline(out, line); ++n) {
        ASSERT_LT(n, texts.size());
        EXPECT_EQ(json::parse(line)["ids"].get<std::vector<int32_t>>(), tok.encode(texts[n], special)) << n;
      }
      EXPECT_EQ(n, texts.size());
    }
  }
  // Line 2001 (in the second chunk) is the first bad one; a line that is not JSON and one past the
  // line limit follow it.
  std::string head;
  for (size_t i = 0; i < 2000; ++i) head += json{{"text", texts[i]}}.dump() + "\n";
  const std::string bad = write("bad.jsonl", head + "{\"text\": 5}\nnot json\n" + std::string(3000, 'a') + "\n");
  CmdResult r = run(tokenize + " --jsonl " + bad + " --max-record-bytes 1KiB");
  expect_input_error(r, "bad.jsonl:2001: 'text' must be a string");
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2000);
  EXPECT_EQ(json::parse(r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1))["ids"].get<std::vector<int32_t>>(),
            tok.encode(texts[1999]));
  // A write that fails (a full disk) is exit 2 with one line, for a chunk smaller than the output's
  // buffer too (it fails at the flush).
  for (const std::string& input : {good, write("one.jsonl", json{{"text", "one"}}.dump() + "\n")}) {
    const std::string err = p("full.err");
    const int status =
        std::system((std::string(SF_BINARY) + " " + tokenize + " --jsonl " + input + " >/dev/full 2>" + err).c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
    EXPECT_EQ(test::slurp(err), "slideformer: tokenize: cannot write the output: No space left on device\n");
  }
}

// The NVMe tier through the command line: with --cpu-memory just short of what the sliding engine
// needs and --offload-dir, the plan moves layers' AdamW state to the offload file (and, shorter
// still, checkpoints too), and the model trained so is byte for byte the one trained in memory;
// the offload directory is left as it was. A missing or unusable directory is refused up front.
// With fp32 and with bf16 optimizer state (m and v in the file as bf16).
TEST_F(Cli, OffloadDirMatchesInMemory) {
  json c = test::tiny_config("llama");
  c["hidden_size"] = 128;
  c["intermediate_size"] = 256;
  c["num_hidden_layers"] = 12;  // the state ring's 3 blobs cost less than the masters moved
  ASSERT_EQ(init(c, "m", " --seed 3").code, 0);
  const std::string model = p("m"), data = make_data("d.jsonl", 8);
  fs::create_directory(p("off"));
  write("off/keep.txt", "a user's file");
  // The runs with the store move the state and the working copies in pieces of 8192 elements, a
  // layer's (~164k) in many (the default piece, the transfer chunk, holds any layer here whole).
  const std::string pieces = "SF_TEST_DISK_PIECE=8192";
  // (fp32 compute: a working copy is a master's size, so the masters go to the store with their
  // working copies; level 3 alone is tested with bf16 compute in test_sliding_engine, tier3.)
  for (const char* state : {"", " --optimizer-state bf16"})
    for (const char* clip : {" --max-grad-norm 1", " --max-grad-norm 0"}) {  // (plan's default clips, train's not)
      const bool clipping = std::string(clip) == " --max-grad-norm 1";
      // Under the sanitizers two of the four: fp32 state with clipping, bf16 state without (each
      // state format and each clipping mode once, the cuFile run included).
      if (test::kSanitizerBuild && clipping == (std::string(state) != "")) continue;
      SCOPED_TRACE(std::string(clipping ? "clipping" : "no clipping") + state);
      const std::string engine =
          " --seq-len 16 --batch-size 2 --grad-accum 4 --device cpu --offload --slots 2 --gpu-blobs 0" +
          std::string(state);
      const std::string tr =
          train_cmd(model, data) + engine + " --steps 2 --lr 1e-2 --weight-decay 0.1" + clip + " --output ";
      fs::remove_all(p("ta"));
      ASSERT_EQ(run(tr + p("ta")).code, 0);
      CmdResult pl = run("plan --model " + model + engine + clip);
      ASSERT_EQ(pl.code, 0) << pl.err;
      // Less and less host memory: state of some layers, of all, then checkpoints, masters and
      // working copies go to the file; a run at the first plan of each level and at the last.
      size_t budget = size_t(pl.last()["host_bytes"]) - 1;
      bool states = false, grads = false, ckpts = false, masters = false, weights = false;
      std::string last_mem, trained_at;
      bool cufile_checked = false;
      for (int i = 0; i < 80; ++i) {
        const std::string mem = " --cpu-memory " + std::to_string(budget) + " --offload-dir " + p("off");
        pl = run("plan --model " + model + engine + clip + mem);
        if (pl.code != 0 || !pl.last()["fits"].get<bool>()) break;
        const json& j = pl.last();
        ASSERT_GT(size_t(j["disk_bytes"]), 0u) << pl.err;
        const std::string level = std::to_string(!j["disk_blobs"].empty()) + std::to_string(!j["disk_grads"].empty()) +
                                  std::to_string(int(j["ckpt_disk_layers"]) > 0) +
                                  std::to_string(!j["disk_masters"].empty()) + std::to_string(!j["disk_weights"].empty());
        states |= !j["disk_blobs"].empty();
        grads |= !j["disk_grads"].empty();
        ckpts |= int(j["ckpt_disk_layers"]) > 0;
        masters |= !j["disk_masters"].empty();
        weights |= !j["disk_weights"].empty();
        // Reads of the working copies: twice a step (forward and backward), written once.
        EXPECT_EQ(double(j["disk_read_bytes_per_step"]) > double(j["disk_write_bytes_per_step"]),
                  !j["disk_weights"].empty());
        if (level != trained_at) {
          trained_at = level;
          fs::remove_all(p("tb"));
          CmdResult t = run_with_env(pieces, tr + p("tb") + mem);
          ASSERT_EQ(t.code, 0) << t.err;
          EXPECT_NE(t.err.find("rings move pieces of 8192 elements"), std::string::npos) << t.err;
          EXPECT_TRUE(same_weights(p("ta"), p("tb"))) << mem;
        }
        // The path is named; through cuFile (its test stand-in) the same weights, once per run of
        // the loop where checkpoints are in the store (with clipping: plan and train then agree).
        if (int(j["ckpt_disk_layers"]) > 0 && clipping && !cufile_checked) {
          cufile_checked = true;
          EXPECT_NE(pl.err.find("checkpoint I/O: io_uring + pinned bounce: the cpu backend"), std::string::npos) << pl.err;
          fs::remove_all(p("tg"));
          CmdResult g = run_with_env(std::string("SF_CUFILE=") + SF_FAKE_CUFILE + " " + pieces, tr + p("tg") + mem);
          ASSERT_EQ(g.code, 0) << g.err;
          EXPECT_NE(g.err.find("checkpoint I/O: cuFile ("), std::string::npos) << g.err;
          EXPECT_TRUE(same_weights(p("ta"), p("tg"))) << mem;
        }
        last_mem = mem;
        budget = size_t(j["host_bytes"]) - 1;
      }
      ASSERT_FALSE(last_mem.empty());
      fs::remove_all(p("tb"));
      CmdResult t = run_with_env(pieces, tr + p("tb") + last_mem);  // the least host memory that fits
      ASSERT_EQ(t.code, 0) << t.err;
      EXPECT_TRUE(same_weights(p("ta"), p("tb"))) << last_mem;
      EXPECT_TRUE(states);
      EXPECT_EQ(grads, clipping);  // held gradients only with clipping
      EXPECT_TRUE(ckpts);
      EXPECT_TRUE(masters);
      EXPECT_TRUE(weights);
      EXPECT_EQ(cufile_checked, clipping);
      if (clipping && !*state) {  // resumed through the store: a save after step 1 continues exactly
        fs::remove_all(p("tr"));
        fs::remove_all(p("ts"));
        ASSERT_EQ(run_with_env(pieces, tr + p("tr") + last_mem + " --save-every 1").code, 0);
        CmdResult rs = run_with_env(pieces, tr + p("ts") + last_mem + " --resume " + p("tr") + "/checkpoint-1");
        ASSERT_EQ(rs.code, 0) << rs.err;
        EXPECT_TRUE(same_weights(p("ta"), p("ts")));
      }
      EXPECT_EQ(fs::directory_iterator(p("off"))->path().filename(), "keep.txt");
      EXPECT_EQ(std::distance(fs::directory_iterator(p("off")), fs::directory_iterator()), 1);
    }
  const std::string engine =
      " --seq-len 16 --batch-size 2 --grad-accum 4 --device cpu --offload --slots 2 --gpu-blobs 0";
  expect_input_error(run(train_cmd(model, data, p("tc")) + engine + " --steps 1 --lr 1e-2 --offload-dir " + p("nope")),
                     "--offload-dir");
  expect_input_error(run(train_cmd(model, data, p("tc")) + engine + " --steps 1 --lr 1e-2 --disk-memory 1GiB"),
                     "--disk-memory");
  // A disk budget too small for what must go there: refused by the plan, nothing written.
  CmdResult r = run(train_cmd(model, data, p("tc")) + engine + " --steps 1 --lr 1e-2 --cpu-memory 1MiB --offload-dir " +
                    p("off") + " --disk-memory 4KiB");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_FALSE(fs::exists(p("tc")));
}

// --upload-copies: the sliding engine with a working copy beside every host master (written by the
// update, read by the uploads) trains to the in-memory engine's bytes on the cpu backend, clipped
// or not, with 2 micro-batches, some blobs kept on the device and bf16 compute; a resume
// re-initialises the copies from the loaded masters; plan says whether copies are used and their
// bytes (bf16 compute halving the upload bytes: test_sliding_engine's UploadCopies cases); `on`
// with too little host memory is refused (exit 2) naming the option; auto never takes them on the
// cpu backend (fp32: a copy would be a second master); a bad value and the YAML key.
TEST_F(Cli, UploadCopiesMatchInMemory) {
  std::string model = make_model("llama", "m");
  std::string data = make_data("d.jsonl", 9);
  const std::string common = train_cmd(model, data) +
                             " --seq-len 16 --batch-size 2 --grad-accum 2 --device cpu --steps 3 --lr 1e-2 "
                             "--weight-decay 0.1 --seed 5";
  for (const char* dtype : {"", " --compute-dtype bf16"})
    for (const char* clip : {" --max-grad-norm 1", " --max-grad-norm 0"}) {
      SCOPED_TRACE(std::string(clip) + dtype);
      const std::string tr = common + clip + dtype + " --output ";
      for (const char* o : {"ua", "ub", "uc"}) fs::remove_all(p(o));
      ASSERT_EQ(run(tr + p("ua")).code, 0);
      CmdResult u = run(tr + p("ub") + " --offload --slots 2 --gpu-blobs 0 --upload-copies on");
      ASSERT_EQ(u.code, 0) << u.err;
      EXPECT_TRUE(same_weights(p("ua"), p("ub")));
      u = run(tr + p("uc") + " --offload --slots 2 --gpu-blobs 2 --upload-copies on");
      ASSERT_EQ(u.code, 0) << u.err;
      EXPECT_TRUE(same_weights(p("ua"), p("uc")));
    }
  // A resume from checkpoint-2 with copies: the masters loaded, the copies made from them.
  const std::string rs = common + " --max-grad-norm 1 --compute-dtype bf16 --offload --slots 2 --gpu-blobs 0 "
                                  "--upload-copies on --output ";
  ASSERT_EQ(run(rs + p("ra") + " --save-every 2").code, 0);
  CmdResult r = run(rs + p("rb") + " --resume " + p("ra") + "/checkpoint-2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(same_weights(p("ra"), p("rb")));

  // plan: the copies, their bytes and what a pass uploads (fp32 compute on the cpu: 4 bytes a
  // parameter either way).
  const std::string plan = "plan --model " + model + " --device cpu --batch-size 2 --seq-len 16 --offload --slots 2 "
                           "--gpu-blobs 0";
  CmdResult on = run(plan + " --upload-copies on"), none = run(plan);
  ASSERT_EQ(on.code, 0) << on.err;
  ASSERT_EQ(none.code, 0) << none.err;
  const json jo = on.last(), jn = none.last();
  const size_t blobs = 4;  // tiny llama: the embedding, 2 layers, the head (none kept on the device)
  EXPECT_EQ(jo["upload_copies"].size(), blobs);
  EXPECT_TRUE(jn["upload_copies"].empty());  // auto: never on the cpu backend
  EXPECT_EQ(jn["upload_copies_choice"], "auto");
  EXPECT_EQ(jo["upload_copies_choice"], "on");
  EXPECT_GT(size_t(jo["upload_copy_bytes"]), 0u);
  EXPECT_EQ(size_t(jo["host_bytes"]), size_t(jn["host_bytes"]) + size_t(jo["upload_copy_bytes"]));
  EXPECT_EQ(double(jo["upload_bytes_per_pass"]), double(jn["upload_bytes_per_pass"]));
  EXPECT_NE(on.err.find("upload copies: " + std::to_string(blobs) + " of " + std::to_string(blobs) + " host blobs"),
            std::string::npos)
      << on.err;
  EXPECT_NE(none.err.find("upload copies: none (--upload-copies auto)"), std::string::npos) << none.err;
  EXPECT_TRUE(run(plan + " --upload-copies off").last()["upload_copies"].empty());

  // Too little host memory for them: the plan does not fit, and a run is refused naming the option.
  const std::string mem = " --cpu-memory " + std::to_string(size_t(jo["host_bytes"]) - 1);
  CmdResult short_on = run(plan + " --upload-copies on" + mem);
  ASSERT_EQ(short_on.code, 0) << short_on.err;
  EXPECT_FALSE(short_on.last()["fits"].get<bool>());
  EXPECT_NE(short_on.last()["why"].get<std::string>().find("of it upload copies (--upload-copies)"), std::string::npos)
      << short_on.last()["why"];
  EXPECT_TRUE(run(plan + mem).last()["fits"].get<bool>());  // without them it fits
  // (the run's shape: 2 micro-batches, train's default of no clipping)
  CmdResult as_run = run(plan + " --upload-copies on --grad-accum 2 --max-grad-norm 0");
  ASSERT_EQ(as_run.code, 0) << as_run.err;
  const std::string run_mem = " --cpu-memory " + std::to_string(size_t(as_run.last()["host_bytes"]) - 1);
  expect_input_error(run(common + " --offload --slots 2 --gpu-blobs 0 --upload-copies on --output " + p("x") + run_mem),
                     "upload copies (--upload-copies)");
  EXPECT_FALSE(fs::exists(p("x")));
  CmdResult bad = run(plan + " --upload-copies maybe");
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--upload-copies"), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  // The YAML key (either spelling of the name).
  for (const char* key : {"upload-copies", "upload_copies"}) {
    const std::string yaml = write("p.yaml", "model: " + model + "\ndevice: cpu\nbatch-size: 2\nseq-len: 16\n"
                                   "offload: true\nslots: 2\ngpu-blobs: 0\n" + key + ": on\n");
    CmdResult y = run("plan " + yaml);
    ASSERT_EQ(y.code, 0) << y.err;
    EXPECT_EQ(y.last()["upload_copies"].size(), blobs) << key;
  }
}

// Issue 16, data loss: an output never replaces an input or a directory without the marker; what a
// run writes (--output, --metrics, grad's --output) is never what it reads, however the path is
// spelled; an existing --metrics or gradient file is replaced only when slideformer wrote it.
TEST_F(Cli, WrittenPathsNeverReplaceInputsOrForeignFiles) {
  const std::string model = make_model("llama", "m");
  const std::string data = make_data("d.jsonl", 4);
  const std::string data_text = slurp(data);
  const std::string weights_before = slurp(model + "/model.safetensors");
  const std::string opts = " --steps 1 --lr 1e-3 --seq-len 16 --device cpu";
  // save_pretrained's directory (the model's files, no marker).
  fs::copy(model, p("hf"), fs::copy_options::recursive);
  fs::remove(p("hf/.slideformer-output"));
  fs::remove(p("hf/.sf-manifest.json"));
  const size_t hf_files = size_t(std::distance(fs::directory_iterator(p("hf")), fs::directory_iterator()));
  expect_input_error(run(train_cmd(model, data, p("hf")) + opts), "which slideformer did not write");
  EXPECT_EQ(size_t(std::distance(fs::directory_iterator(p("hf")), fs::directory_iterator())), hf_files);
  // The input model itself (marked: init wrote it), by several spellings.
  fs::create_directory_symlink(model, p("mlink"));
  for (const std::string& out : {model, model + "/", model + "/../m", p("mlink")})
    expect_input_error(run(train_cmd(model, data, out) + opts), "is the --model input");
  expect_input_error(run(train_cmd(model, data, model + "/sub") + opts), "lies inside the --model input");
  expect_input_error(run(train_cmd(p("mlink"), data, model) + opts), "is the --model input");
  // An output holding the data file, the eval data or the checkpoint resumed from.
  ASSERT_EQ(run(train_cmd(model, data, p("o")) + opts).code, 0);
  std::ofstream(p("o/in.jsonl")) << data_text;
  expect_input_error(run(train_cmd(model, p("o/in.jsonl"), p("o")) + opts), "holds the --data input");
  expect_input_error(run(train_cmd(model, data, p("o")) + opts + " --eval-data " + p("o/in.jsonl")),
                     "holds the --eval-data input");
  // --metrics: the data (by name, through a hard link), a file of the model, a stranger's file, a
  // device, the output directory itself.
  fs::create_hard_link(data, p("hard.jsonl"));
  std::ofstream(p("notes.txt")) << "my notes\n";
  for (const auto& [metrics, needle] : std::vector<std::pair<std::string, std::string>>{
           {data, "is the --data input"},
           {p("hard.jsonl"), "is the --data input"},
           {model + "/config.json", "lies inside the --model input"},
           {p("notes.txt"), "is not a slideformer metrics record"},
           {"/dev/full", "not a regular file"},
           {p("o2"), "is the --output directory"}}) {
    CmdResult r = run(train_cmd(model, data, p("o2")) + opts + " --metrics " + metrics);
    expect_input_error(r, needle);
    EXPECT_NE(r.err.find("--metrics"), std::string::npos) << r.err;
  }
  EXPECT_EQ(slurp(data), data_text);
  EXPECT_EQ(slurp(p("notes.txt")), "my notes\n");
  EXPECT_EQ(slurp(model + "/model.safetensors"), weights_before);
  // Its own metrics file is replaced.
  ASSERT_EQ(run(train_cmd(model, data, p("o2")) + opts + " --metrics " + p("m.jsonl")).code, 0);
  CmdResult again = run(train_cmd(model, data, p("o2")) + opts + " --metrics " + p("m.jsonl"));
  ASSERT_EQ(again.code, 0) << again.err;
  // grad --output: its own data, a stranger's file; its own earlier gradient is replaced.
  const std::string grad = data_cmd("grad", model, data) + " --seq-len 16 --device cpu --output ";
  expect_input_error(run(grad + data), "is the --data input");
  expect_input_error(run(grad + p("notes.txt")), "not a gradient file slideformer wrote");
  expect_input_error(run(grad + model + "/model.safetensors"), "lies inside the --model input");
  ASSERT_EQ(run(grad + p("g.safetensors")).code, 0);
  CmdResult g2 = run(grad + p("g.safetensors"));
  EXPECT_EQ(g2.code, 0) << g2.err;
  EXPECT_EQ(slurp(data), data_text);
  EXPECT_EQ(slurp(p("notes.txt")), "my notes\n");
  // A path that is not UTF-8: refused up front, nothing created.
  expect_input_error(run(train_cmd(model, data, p("out\xff")) + opts), "not valid UTF-8");
  EXPECT_FALSE(fs::exists(p("out\xff")));
}

// A user's files in an output survive every run, also a failing one; the output keeps its mode;
// no lock or temporary is left behind.
TEST_F(Cli, OutputKeepsUserFilesAndItsMode) {
  const std::string model = make_model("llama", "m");
  const std::string data = make_data("d.jsonl", 4);
  const std::string out = p("out");
  ASSERT_EQ(::mkdir(out.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(out.c_str(), 0700), 0);
  const std::string train = train_cmd(model, data, out) + " --steps 2 --lr 1e-3 --seq-len 16 --device cpu";
  CmdResult first = run(train + " --save-every 1");
  ASSERT_EQ(first.code, 0) << first.err;
  struct stat st;
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  for (const char* n : {"notes.tmp-1-abc", "x.tmp-99999999-0000beef", "y.sf-lock"}) std::ofstream(out + "/" + n) << "mine";
  // A run that fails after claiming the output (no label to train: every label -100).
  const std::string masked = write("masked.jsonl", "{\"input_ids\": [1, 2, 3], \"labels\": [-100, -100, -100]}\n");
  expect_input_error(run(train_cmd(model, masked, out) + " --steps 1 --lr 1e-3 --device cpu"), masked);
  ASSERT_EQ(run(train).code, 0);
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  for (const char* n : {"notes.tmp-1-abc", "x.tmp-99999999-0000beef", "y.sf-lock"})
    EXPECT_EQ(slurp(out + "/" + n), "mine") << n;
  EXPECT_TRUE(fs::exists(out + "/checkpoint-1/model.safetensors"));
  EXPECT_FALSE(fs::exists(out + ".sf-lock"));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".sf-"), std::string::npos) << e.path();
}

// One run per output: a second train (or init) on an output in use exits 2 naming the holder.
TEST_F(Cli, SecondRunOnAnOutputIsRefused) {
  const std::string model = make_model("llama", "m");
  const std::string data = make_data("d.jsonl", 6);
  const std::string args = train_cmd(model, data, p("o")) + " --seq-len 16 --steps 1000000 --lr 1e-3 --device cpu";
  const std::string err = p("err.txt");
  const pid_t pid = spawn(args, p("out.txt"), err);
  ASSERT_GE(pid, 0);
  EXPECT_TRUE(wait_for(err, "step 2/")) << slurp(err);
  CmdResult second = run(train_cmd(model, data, p("o") + "/") + " --seq-len 16 --steps 2 --lr 1e-3 --device cpu");
  expect_input_error(second, "in use by another slideformer run (pid " + std::to_string(pid));
  const std::string cfg = write("cfg.json", test::tiny_config("llama").dump());
  expect_input_error(run("init --config " + cfg + " --output " + p("o")), "in use by another slideformer run");
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT) << slurp(err);
  EXPECT_FALSE(fs::exists(p("o.sf-lock")));
  CmdResult after = run(train_cmd(model, data, p("o")) + " --seq-len 16 --steps 2 --lr 1e-3 --device cpu");
  EXPECT_EQ(after.code, 0) << after.err;
}

// Issue 16, silent corruption: every load verifies the tensors' checksums and values and the
// manifest (eval, grad, train --model, --resume); --no-verify skips it and says so.
TEST_F(Cli, EveryLoadVerifiesChecksumsValuesAndManifest) {
  const std::string model = make_model("llama", "m");
  const std::string data = make_data("d.jsonl", 4);
  const std::string path = model + "/model.safetensors";
  const std::string good = slurp(path);
  const std::string tensor = "model.norm.weight";
  std::string raw = good;
  {
    auto f = SafetensorsFile::open(path);
    raw[size_t(8 + header_bytes(good)) + size_t(f.find(tensor)->data - f.tensors().front().data) + 1] ^= 0x10;
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << raw;
  const std::string opts = " --seq-len 16 --device cpu";
  for (const std::string& cmd : {eval_cmd(model, data) + opts, data_cmd("grad", model, data, p("g")) + opts,
                                 train_cmd(model, data, p("o")) + opts + " --steps 1 --lr 1e-3"}) {
    CmdResult r = run(cmd);
    expect_input_error(r, path + ": tensor " + tensor + ": CRC-32C");
  }
  EXPECT_FALSE(fs::exists(p("o")));
  EXPECT_FALSE(fs::exists(p("g")));
  CmdResult unchecked = run(eval_cmd(model, data) + opts + " --no-verify");
  EXPECT_EQ(unchecked.code, 0) << unchecked.err;
  EXPECT_NE(unchecked.err.find("--no-verify"), std::string::npos) << unchecked.err;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << good;
  // A changed config.json is refused by the manifest.
  const std::string cfg = slurp(model + "/config.json");
  std::ofstream(model + "/config.json") << cfg << " ";
  expect_input_error(run(eval_cmd(model, data) + opts), model + "/config.json: is ");
  std::ofstream(model + "/config.json") << cfg;
  ASSERT_EQ(run(eval_cmd(model, data) + opts).code, 0);
  // NaN weights with valid checksums (a file another program wrote): refused, file and tensor named.
  {
    auto f = SafetensorsFile::open(path);
    std::vector<TensorWrite> tw;
    std::vector<std::vector<uint8_t>> bytes;
    for (const TensorInfo& t : f.tensors()) bytes.emplace_back(t.data, t.data + t.bytes);
    for (size_t i = 0; i < f.tensors().size(); ++i) {
      const TensorInfo& t = f.tensors()[i];
      if (t.name == tensor) {
        const float nan = std::nanf("");
        std::memcpy(bytes[i].data() + 4, &nan, 4);
      }
      tw.push_back({t.name, t.dtype, t.shape, bytes[i].data()});
    }
    fs::copy(model, p("nan"), fs::copy_options::recursive);
    fs::remove(p("nan/.sf-manifest.json"));
    write_safetensors(p("nan/model.safetensors"), tw);
  }
  expect_input_error(run(eval_cmd(p("nan"), data) + opts),
                     p("nan/model.safetensors") + ": tensor " + tensor + ": element 1 is NaN or infinite");
  // trainer_state.json's step changed: --resume refuses it.
  ASSERT_EQ(run(train_cmd(model, data, p("a")) + opts + " --steps 3 --lr 1e-3 --save-every 2").code, 0);
  const std::string state = p("a/checkpoint-2/trainer_state.json");
  std::string text = slurp(state);
  const size_t at = text.find("\"step\": 2");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 8] = '3';
  std::ofstream(state) << text;
  expect_input_error(run(train_cmd(model, data, p("b")) + opts + " --steps 4 --lr 1e-3 --resume " + p("a/checkpoint-2")),
                     state + ": CRC-32C");
  EXPECT_FALSE(fs::exists(p("b")));
  // Intact again: resuming into the same output (the checkpoint lies inside it) works and keeps it.
  text[at + 8] = '2';
  std::ofstream(state) << text;
  CmdResult same = run(train_cmd(model, data, p("a")) + opts + " --steps 4 --lr 1e-3 --resume " + p("a/checkpoint-2"));
  EXPECT_EQ(same.code, 0) << same.err;
  EXPECT_TRUE(fs::exists(state));
  expect_input_error(run(train_cmd(model, data, p("a/checkpoint-2/x")) + opts + " --steps 4 --lr 1e-3 --resume " +
                         p("a/checkpoint-2")),
                     "lies inside the --resume input");
}

// Issue 16, parsers and bounds: a NUL or an out-of-range number in any JSON text is an input error;
// --slots is bounded by the model's blobs.
TEST_F(Cli, ParsersRefuseNulAndOutOfRangeNumbers) {
  const std::string model = make_model("llama", "m");
  const std::string opts = " --seq-len 16 --device cpu";
  const std::string nul = write("nul.jsonl", std::string("{\"input_ids\": [1, 2, 3]}") + std::string(1, '\0') + "{\"input_ids\": [" + "\n");
  expect_input_error(run(eval_cmd(model, nul) + opts), "a NUL byte");
  const std::string tiny = write("tiny.jsonl", "{\"input_ids\": [1, 2, 3], \"x\": 1e-400}\n");
  expect_input_error(run(eval_cmd(model, tiny) + opts), "number underflow");
  const std::string data = make_data("d.jsonl", 2);
  fs::copy(model, p("c"), fs::copy_options::recursive);
  fs::remove(p("c/.sf-manifest.json"));
  std::string cfg = slurp(model + "/config.json");
  std::ofstream(p("c/config.json"), std::ios::binary) << cfg << std::string("\0{{{", 4);
  expect_input_error(run(eval_cmd(p("c"), data) + opts), p("c/config.json") + ": invalid JSON at byte");
  CmdResult slots = run(eval_cmd(model, data) + opts + " --offload --slots 4194305");
  expect_input_error(slots, "--slots");
  EXPECT_NE(slots.err.find("blobs"), std::string::npos) << slots.err;
}

// One run per output, also for what else a run writes: three trains started together on one output
// (one runs, two are refused naming the lock); a run resuming from the first one's checkpoint into
// another output runs beside it, into the same output is refused; a second --metrics writer and a
// second grad on one gradient file are refused with the holder's pid.
TEST_F(Cli, ConcurrentRunsLockEverythingTheyWrite) {
  const std::string model = make_model("llama", "m");
  const std::string data = make_data("d.jsonl", 6);
  const std::string opts = " --seq-len 16 --lr 1e-3 --device cpu";
  std::vector<pid_t> pids;
  for (int k = 0; k < 3; ++k)
    pids.push_back(spawn(train_cmd(model, data, p("o")) + opts + " --steps 1000000 --save-every 1 --metrics " +
                             p("m.jsonl"),
                         p("out" + std::to_string(k)), p("err" + std::to_string(k))));
  int running = -1, refused = 0;
  for (int k = 0; k < 3; ++k) {
    ASSERT_GE(pids[size_t(k)], 0);
    int status = 0;
    for (int i = 0; i < 600 && waitpid(pids[size_t(k)], &status, WNOHANG) == 0; ++i) {
      if (slurp(p("err" + std::to_string(k))).find("saved " + p("o") + "/checkpoint-2") != std::string::npos) break;
      usleep(100000);
    }
    if (waitpid(pids[size_t(k)], &status, WNOHANG) == 0) {
      EXPECT_EQ(running, -1) << "two runs hold one output";
      running = k;
    } else {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << slurp(p("err" + std::to_string(k)));
      EXPECT_NE(slurp(p("err" + std::to_string(k))).find("in use by another slideformer run (pid "), std::string::npos);
      ++refused;
    }
  }
  ASSERT_GE(running, 0);
  EXPECT_EQ(refused, 2);
  const pid_t pid = pids[size_t(running)];
  const std::string holder = "(pid " + std::to_string(pid);
  // Resuming from its (complete, published) checkpoint into another output runs beside it.
  CmdResult other = run(train_cmd(model, data, p("o2")) + opts + " --steps 3 --resume " + p("o") + "/checkpoint-1");
  EXPECT_EQ(other.code, 0) << other.err;
  // Into its own output: refused, the output in use.
  expect_input_error(run(train_cmd(model, data, p("o")) + opts + " --steps 3 --resume " + p("o") + "/checkpoint-1"),
                     holder);
  // Its metrics file from another output: refused, nothing appended or truncated.
  const std::string metrics_before = slurp(p("m.jsonl"));
  expect_input_error(run(train_cmd(model, data, p("o3")) + opts + " --steps 1 --metrics " + p("m.jsonl")), holder);
  EXPECT_EQ(slurp(p("m.jsonl")).substr(0, metrics_before.size()), metrics_before);
  EXPECT_FALSE(fs::exists(p("o3")));
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT) << slurp(p("err" + std::to_string(running)));
  EXPECT_FALSE(fs::exists(p("o.sf-lock")));
  EXPECT_FALSE(fs::exists(p("m.jsonl.sf-lock")));

  // grad --output: a holder of the file's lock (this process) refuses two grads at once; released,
  // the next one writes it.
  const std::string grad = "grad --model " + model + " --data " + data + " --seq-len 16 --device cpu --output ";
  {
    OutputLock held(p("g.safetensors"), OutputLock::Kind::File);
    const pid_t a = spawn(grad + p("g.safetensors"), p("ga.out"), p("ga.err"));
    const pid_t b = spawn(grad + p("g.safetensors"), p("gb.out"), p("gb.err"));
    for (pid_t x : {a, b}) {
      ASSERT_EQ(waitpid(x, &status, 0), x);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2);
    }
    for (const char* e : {"ga.err", "gb.err"})
      EXPECT_NE(slurp(p(e)).find("in use by another slideformer run (pid " + std::to_string(::getpid())),
                std::string::npos)
          << slurp(p(e));
    EXPECT_FALSE(fs::exists(p("g.safetensors")));
  }
  CmdResult g = run(grad + p("g.safetensors"));
  EXPECT_EQ(g.code, 0) << g.err;
  EXPECT_TRUE(fs::exists(p("g.safetensors")));
  EXPECT_FALSE(fs::exists(p("g.safetensors.sf-lock")));
}

// A --metrics file inside the output: a new or empty output becomes a marked one first (the file and
// its lock do not make it look foreign); the file is kept by every later run; no lock is left. A
// metrics or grad file in a directory that does not exist is refused before anything runs.
TEST_F(Cli, MetricsInsideTheOutput) {
  const std::string model = make_model("llama", "m");
  const std::string data = make_data("d.jsonl", 4);
  const std::string opts = " --seq-len 16 --lr 1e-3 --device cpu --steps 2";
  fs::create_directory(p("empty"));
  for (const std::string& out : {p("new"), p("empty"), p("new")}) {
    SCOPED_TRACE(out);
    CmdResult r = run(train_cmd(model, data, out) + opts + " --metrics " + out + "/m.jsonl");
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string lines = slurp(out + "/m.jsonl");
    EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 2);
    EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
    EXPECT_FALSE(fs::exists(out + "/m.jsonl.sf-lock"));
  }
  expect_input_error(run(train_cmd(model, data, p("o")) + opts + " --metrics " + p("nodir/m.jsonl")),
                     "its directory " + p("nodir") + " does not exist");
  expect_input_error(run("grad --model " + model + " --data " + data + " --seq-len 16 --device cpu --output " +
                         p("nodir/g.safetensors")),
                     "does not exist");
  EXPECT_FALSE(fs::exists(p("nodir")));
}

}  // namespace
}  // namespace sf
