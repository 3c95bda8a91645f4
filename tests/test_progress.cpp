// What a user sees of `train` (issue 8 §4): the progress display (one updating line on a terminal,
// plain lines otherwise), the --metrics JSONL file (a record per step and per evaluation, valid
// after a crash, appended to on --resume), and the input model's generation_config.json kept.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/log.h"
#include "model_fixtures.h"
#include "test_util.h"
#include "train/progress.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::CmdResult;
using test::slurp;

// What a ProgressDisplay wrote, through a temporary FILE.
struct Captured {
  std::FILE* f = std::tmpfile();
  ~Captured() { std::fclose(f); }
  std::string text() {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    for (int c; (c = std::fgetc(f)) != EOF;) s += char(c);
    return s;
  }
};

StepReport report(int64_t step, int64_t total) {
  StepReport r;
  r.step = step;
  r.total = total;
  r.loss = 2.5;
  r.lr = 1e-4;
  r.grad_norm = 0.75;
  r.tokens = 64;
  r.tokens_per_s = 1000;
  r.elapsed_s = double(step);
  r.eta_s = double(total - step);
  r.rss_bytes = size_t(3) << 20;
  return r;
}

// An existing --metrics file is ours only when every line is a record of ours (a last line cut by
// a full disk after such records is fine); a failed write is an input error naming --metrics.
TEST(Progress, MetricsFileOwnershipAndWriteFailure) {
  test::TempDir d;
  auto put = [&](const std::string& name, const std::string& text) {
    std::ofstream(d.file(name), std::ios::binary) << text;
    return d.file(name);
  };
  check_metrics_file(d.file("new.jsonl"));
  check_metrics_file(put("empty.jsonl", ""));
  const std::string rec = "{\"type\": \"train\", \"step\": 1, \"loss\": 2.5}\n";
  check_metrics_file(put("ours.jsonl", rec + "{\"type\": \"eval\", \"step\": 1}\n" + rec + "{\"type\": \"tr"));
  test::expect_input_error([&] { check_metrics_file(put("notes.txt", "my notes")); }, {"--metrics", "line 1"});
  test::expect_input_error([&] { check_metrics_file(put("data.jsonl", "{\"input_ids\": [1, 2]}\n")); },
                           {"not a slideformer metrics record"});
  test::expect_input_error([&] { check_metrics_file(put("mixed.jsonl", rec + "{\"type\": \"x\", \"step\": 1}\n" + rec)); },
                           {"line 2"});
  test::expect_input_error([&] { check_metrics_file(d.path.string()); }, {"not a regular file"});
  MetricsFile full("/dev/full", true);
  StepReport r;
  test::expect_input_error([&] { full.train_step(r); }, {"--metrics", "/dev/full", "write failed"});
}

TEST(Progress, StepLineHasEveryFigure) {
  StepReport r = report(3, 10);
  EXPECT_EQ(format_step(r),
            "step 3/10 loss 2.500000 lr 1.000e-04 grad_norm 0.7500 tok/s 1000 elapsed 3s eta 7s rss 3.00 MiB");
  r.gpu_bytes = size_t(7) << 30;
  EXPECT_NE(format_step(r).find(" gpu 7.00 GiB rss 3.00 MiB"), std::string::npos) << format_step(r);
  EXPECT_GT(current_rss_bytes(), size_t(0));
}

TEST(Progress, TerminalGetsOneUpdatingLine) {
  Captured c;
  {
    ProgressDisplay d(c.f, /*tty=*/true, /*log_every=*/5);
    for (int s = 1; s <= 3; ++s) d.step(report(s, 4));
    const std::string mid = c.text();
    EXPECT_EQ(std::count(mid.begin(), mid.end(), '\r'), 3) << mid;  // every step, whatever --log-every
    EXPECT_EQ(mid.find('\n'), std::string::npos) << mid;            // in place: no new line yet
    EXPECT_NE(mid.find("\x1b[K"), std::string::npos);               // a shorter line erases the rest
    d.break_line();                                                 // another message: the line ends first
    EXPECT_EQ(c.text().back(), '\n');
    d.step(report(4, 4));  // the last step ends its line
  }
  const std::string all = c.text();
  EXPECT_EQ(std::count(all.begin(), all.end(), '\n'), 2) << all;
  EXPECT_NE(all.find("\rstep 4/4 loss"), std::string::npos) << all;
}

TEST(Progress, PipeGetsPlainLinesEveryN) {
  Captured c;
  {
    ProgressDisplay d(c.f, /*tty=*/false, /*log_every=*/3);
    for (int s = 1; s <= 7; ++s) d.step(report(s, 7));
  }
  std::vector<std::string> lines;
  std::istringstream in(c.text());
  for (std::string l; std::getline(in, l);) lines.push_back(l.substr(0, l.find(" loss")));
  EXPECT_EQ(lines, (std::vector<std::string>{"step 1/7", "step 3/7", "step 6/7", "step 7/7"}));
  EXPECT_EQ(c.text().find('\r'), std::string::npos);
}

TEST(Progress, QuietShowsNothing) {
  Captured c;
  const LogLevel was = log_config().level;
  log_config().level = LogLevel::Quiet;
  {
    ProgressDisplay d(c.f, true, 1);
    d.step(report(1, 2));
  }
  log_config().level = was;
  EXPECT_EQ(c.text(), "");
}

class TrainOutput : public test::BinaryTest {
 protected:
  TrainOutput() : BinaryTest("sf_progress_") {}
  std::string model() {
    std::ofstream(p("m.json")) << test::tiny_config("llama").dump();
    const CmdResult r = run("init --config " + p("m.json") + " --output " + p("m") + " --seed 3");
    EXPECT_EQ(r.code, 0) << r.err;
    return p("m");
  }
  std::string data(const std::string& name, int n) {
    std::ofstream f(p(name));
    for (int i = 0; i < n; ++i) {
      json ids = json::array();
      for (int t = 0; t < 6 + i % 5; ++t) ids.push_back((3 * i + t) % 37);
      f << json{{"input_ids", ids}}.dump() << "\n";
    }
    return p(name);
  }
  // Every line of a JSONL file, parsed (a line that is not JSON fails the test).
  std::vector<json> records(const std::string& path) {
    const std::string text = slurp(path);
    EXPECT_TRUE(text.empty() || text.back() == '\n') << "a partial last line";
    std::vector<json> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) {
      EXPECT_NO_THROW(out.push_back(json::parse(l))) << l;
    }
    return out;
  }
};

TEST_F(TrainOutput, MetricsFileHasARecordPerStepAndEval) {
  const std::string m = model(), d = data("d.jsonl", 12), held = data("h.jsonl", 5);
  const CmdResult r = run("train --model " + m + " --data " + d + " --eval-data " + held + " --eval-every 2 --output " +
                          p("out") + " --steps 5 --lr 1e-3 --batch-size 2 --grad-accum 2 --seq-len 8 --device cpu" +
                          " --log-every 2 --metrics " + p("metrics.jsonl"));
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<json> recs = records(p("metrics.jsonl"));
  std::vector<json> train, eval;
  for (const json& j : recs) (j.at("type") == "train" ? train : eval).push_back(j);
  ASSERT_EQ(train.size(), 5u);
  ASSERT_EQ(recs.size(), 8u);  // 5 steps, evaluations after steps 2, 4 and 5
  double elapsed = 0;
  for (size_t i = 0; i < train.size(); ++i) {
    const json& j = train[i];
    EXPECT_EQ(j.at("step"), int64_t(i + 1));
    EXPECT_GT(j.at("loss").get<double>(), 0.0);
    EXPECT_DOUBLE_EQ(j.at("lr").get<double>(), double(1e-3f));
    EXPECT_GT(j.at("grad_norm").get<double>(), 0.0);
    EXPECT_GT(j.at("tokens").get<int64_t>(), 4 * 5);  // 2 x 2 records of at least 6 tokens
    EXPECT_LE(j.at("tokens").get<int64_t>(), 4 * 8);  // cut to --seq-len 8
    EXPECT_GT(j.at("tokens_per_second").get<double>(), 0.0);
    EXPECT_GE(j.at("elapsed_s").get<double>(), elapsed);
    elapsed = j.at("elapsed_s").get<double>();
  }
  EXPECT_DOUBLE_EQ(train.front().at("loss").get<double>(), r.last()["first_loss"].get<double>());
  EXPECT_DOUBLE_EQ(train.back().at("loss").get<double>(), r.last()["last_loss"].get<double>());
  ASSERT_EQ(eval.size(), 3u);
  EXPECT_EQ(eval[0].at("step"), 2);
  EXPECT_EQ(eval[1].at("step"), 4);
  EXPECT_EQ(eval[2].at("step"), 5);
  EXPECT_DOUBLE_EQ(eval[2].at("loss").get<double>(), r.last()["eval_loss"].get<double>());
  EXPECT_GT(eval[2].at("tokens").get<int64_t>(), 0);
  // Records come in order: the evaluation after step 2 follows step 2's record.
  EXPECT_EQ(recs[2].at("type"), "eval");
  EXPECT_EQ(recs[1].at("step"), 2);

  // stderr is a file here, not a terminal: whole lines, every --log-every steps plus the first and
  // the last, no carriage returns.
  EXPECT_EQ(r.err.find('\r'), std::string::npos);
  for (const char* shown : {"step 1/5 loss", "step 2/5 loss", "step 4/5 loss", "step 5/5 loss"})
    EXPECT_NE(r.err.find(shown), std::string::npos) << shown << " in " << r.err;
  for (const char* hidden : {"step 3/5"}) EXPECT_EQ(r.err.find(hidden), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" rss "), std::string::npos) << r.err;  // host memory shown
  EXPECT_EQ(r.err.find(" gpu "), std::string::npos) << r.err;  // no GPU on the cpu backend
}

TEST_F(TrainOutput, MetricsLinesSurviveACrashAndContinueOnResume) {
  const std::string m = model(), d = data("d.jsonl", 8);
  const std::string common = "train --model " + m + " --data " + d + " --output " + p("out") +
                             " --steps 6 --lr 1e-3 --batch-size 2 --seq-len 8 --device cpu --save-every 2 --metrics " +
                             p("metrics.jsonl");
  // Killed (SIGKILL) at the start of step 4: the lines of steps 1-3 are whole and valid.
  ::setenv("SF_KILL_AT_STEP", "4", 1);
  CmdResult r = run(common);
  ::unsetenv("SF_KILL_AT_STEP");
  EXPECT_NE(r.code, 0);
  std::vector<json> recs = records(p("metrics.jsonl"));
  ASSERT_EQ(recs.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(recs[size_t(i)].at("step"), i + 1);
  // --resume appends: the resumed run's steps 3-6 follow (step 3 is run again from checkpoint-2).
  r = run(common + " --resume " + p("out") + "/checkpoint-2");
  ASSERT_EQ(r.code, 0) << r.err;
  recs = records(p("metrics.jsonl"));
  ASSERT_EQ(recs.size(), 7u);
  for (size_t i = 3; i < recs.size(); ++i) EXPECT_EQ(recs[i].at("step"), int64_t(i));
  // A fresh run truncates.
  r = run("train --model " + m + " --data " + d + " --output " + p("out2") +
          " --steps 2 --lr 1e-3 --seq-len 8 --device cpu --metrics " + p("metrics.jsonl"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(records(p("metrics.jsonl")).size(), 2u);
  // An unwritable path is refused up front, naming the option.
  r = run("train --model " + m + " --data " + d + " --output " + p("out3") +
          " --steps 1 --lr 1e-3 --seq-len 8 --device cpu --metrics " + p("no/such/dir/m.jsonl"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--metrics"), std::string::npos) << r.err;
}

TEST_F(TrainOutput, GenerationConfigIsKeptByteForByte) {
  const std::string m = model(), d = data("d.jsonl", 6);
  // Unusual spacing and key order: a copy, not a re-serialisation, keeps it.
  const std::string gen =
      "{\n    \"temperature\": 0.6,\n  \"bos_token_id\": 1,   \"do_sample\": true,\n"
      "  \"top_p\": 0.9\n}\n";
  std::ofstream(m + "/generation_config.json", std::ios::binary) << gen;
  const CmdResult r = run("train --model " + m + " --data " + d + " --output " + p("out") +
                          " --steps 4 --save-every 2 --lr 1e-3 --seq-len 8 --device cpu");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(p("out") + "/generation_config.json"), gen);
  EXPECT_EQ(slurp(p("out") + "/checkpoint-2/generation_config.json"), gen);
}

}  // namespace
}  // namespace sf
