#include "cli/commands.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "backend/device.h"
#include "cli/config_file.h"
#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "data/chat.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "engine/resident_engine.h"
#include "io/checkpoint.h"
#include "io/json_file.h"
#include "train/bench.h"
#include "train/demo.h"
#include "train/model_io.h"
#include "train/train_options_check.h"
#include "train/trainer.h"

namespace sf {

namespace {

// Prints the result line: the last line of stdout is always one JSON object.
void print_json(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

// Engine choice and memory budgets, shared by eval, grad, train, bench and plan. Sizes are parsed
// after the command line (a bad size is an input error: exit 2).
struct EngineFlags {
  bool offload = false, no_offload = false;
  int slots = 0, gpu_blobs = -1;
  std::string gpu_memory, cpu_memory;
  void add(CLI::App* c) {
    c->add_flag("--offload", offload,
                "force the sliding engine: layers slide through GPU slots, weights, optimizer state and checkpoints "
                "in host memory (default: only when the model does not fit on the GPU)");
    c->add_flag("--no-offload", no_offload, "force the in-memory engine");
    c->add_option("--slots", slots, "GPU parameter slots of the sliding engine (default 3, or 2 when 3 do not fit)");
    c->add_option("--gpu-blobs", gpu_blobs,
                  "blobs (embedding, head, then layers) the sliding engine keeps whole on the GPU, with their "
                  "optimizer state (default: as many as fit)");
    c->add_option("--gpu-memory", gpu_memory, "GPU memory to use, e.g. 40GiB (default: 90% of the free memory)");
    c->add_option("--cpu-memory", cpu_memory, "host memory to plan with (default: what the system reports available)");
  }
  void apply(EngineRequest& e) const {
    if (offload && no_offload) input_error("--offload/--no-offload", "give one of them");
    e.offload = offload ? OffloadChoice::On : no_offload ? OffloadChoice::Off : OffloadChoice::Auto;
    e.slots = slots;
    e.gpu_blobs = gpu_blobs;
    e.gpu_memory = gpu_memory.empty() ? 0 : size_t(parse_size(gpu_memory, "--gpu-memory"));
    e.cpu_memory = cpu_memory.empty() ? 0 : size_t(parse_size(cpu_memory, "--cpu-memory"));
  }
};

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
}

// The data options' checks (paths, step sizes) and the record-length limit, before any file is read.
void apply_data_options(const DataOptions& d) {
  check_data_options(d);
  if (!d.max_record_bytes.empty()) set_max_record_bytes(parse_size(d.max_record_bytes, "--max-record-bytes"));
}

int cmd_init(const std::string& config_path, const std::string& output, uint64_t seed, const std::string& dtype_s) {
  claim_output_dir(output);  // a directory that is not ours is refused before any work
  DType dtype;
  if (dtype_s == "bf16" || dtype_s == "bfloat16") {
    dtype = DType::BF16;
  } else if (dtype_s == "fp32" || dtype_s == "float32") {
    dtype = DType::F32;
  } else {
    input_error("--dtype", "unknown dtype '" + dtype_s + "' (expected bf16 or fp32)");
  }
  nlohmann::json cfg = read_json_file(config_path);
  ModelSpec spec = parse_model_spec(cfg, config_path);
  auto dev = make_cpu_device();
  EngineOptions eo;
  eo.training = false;
  eo.optimizer = false;
  ResidentEngine engine(*dev, spec, eo);
  engine.init_random(seed);
  StagedDir staged(output);
  save_hf_model(engine, cfg, "", staged.path(), dtype, 5'000'000'000);
  staged.commit();
  log_info("initialised %s (%s, %.2fM parameters, %s)", output.c_str(), spec.architecture.c_str(),
           double(spec.total_params()) / 1e6, dtype_name(dtype));
  print_json({{"output", output}, {"parameters", spec.total_params()}});
  return 0;
}

int cmd_tokenize(const std::string& model, const std::string& file, const std::string& text, const std::string& jsonl,
                 bool special) {
  if (model.empty() == file.empty()) input_error("tokenize", "give one of --model DIR or --tokenizer FILE");
  if (text.empty() == jsonl.empty()) input_error("tokenize", "give one of --text or --jsonl");
  const Tokenizer tok =
      Tokenizer::load(file.empty() ? (std::filesystem::path(model) / "tokenizer.json").string() : file);
  if (!text.empty()) {
    print_json({{"ids", tok.encode(text, special)}});
    return 0;
  }
  std::ifstream in_file;
  if (jsonl != "-") {
    in_file.open(jsonl);
    if (!in_file) input_error(jsonl, "cannot open");
  }
  std::istream& in = jsonl == "-" ? std::cin : in_file;
  // Chat records use the chat template of the model directory (or of the tokenizer file's).
  const std::string dir = file.empty() ? model : std::filesystem::path(file).parent_path().string();
  std::optional<std::optional<ChatTemplate>> chat;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      input_error(jsonl + ":" + std::to_string(n), std::string("not JSON: ") + e.what());
    }
    const std::string where = jsonl + ":" + std::to_string(n);
    if (j.is_object() && j.contains("messages")) {  // a chat record: ids and labels (-100 outside assistant turns)
      if (!chat) chat = ChatTemplate::load(dir);
      if (!*chat) input_error(dir, "no chat template (tokenizer_config.json or chat_template.jinja)");
      const ChatRendering r = render_chat(**chat, j["messages"], std::time(nullptr), where);
      const std::vector<int32_t> ids = tok.encode(r.text, false);
      print_json({{"ids", ids}, {"labels", assistant_labels(tok, r, ids)}, {"text", r.text}});
      continue;
    }
    if (!j.contains("text") || !j["text"].is_string()) input_error(where, "no \"text\" or \"messages\"");
    print_json({{"ids", tok.encode(j["text"].get<std::string>(), special)}});
  }
  return 0;
}

}  // namespace

int cli_main(int argc, char** argv) {
  CLI::App app{"slideformer: full-parameter fine-tuning of Llama-family models"};
  app.require_subcommand(1);
  bool quiet = false, verbose = false;
  app.add_flag("-q,--quiet", quiet, "only results on stdout, errors on stderr");
  app.add_flag("-v,--verbose", verbose, "more diagnostics on stderr");

  // init
  std::string init_config, init_output, init_dtype = "fp32";
  uint64_t init_seed = 0;
  auto* init = app.add_subcommand("init", "random HF-style initialisation of a model from a config.json");
  init->add_option("--config", init_config, "config.json of the model")->required();
  init->add_option("--output", init_output, "output model directory")->required();
  init->add_option("--seed", init_seed, "random seed")->capture_default_str();
  init->add_option("--dtype", init_dtype, "bf16 or fp32")->capture_default_str();

  // eval
  DataOptions eval_opts;
  EngineFlags eval_flags, grad_flags, train_flags, bench_flags, plan_flags;
  auto* eval = app.add_subcommand("eval", "mean cross-entropy over the trained positions of a data file");
  add_data_options(eval, eval_opts, eval_flags);

  // grad
  DataOptions grad_opts;
  std::string grad_output;
  auto* grad = app.add_subcommand("grad", "fp32 gradient of the eval loss for every parameter");
  add_data_options(grad, grad_opts, grad_flags);
  grad->add_option("--output", grad_output, "output .safetensors file")->required();

  // train
  TrainOptions t;
  bool no_shuffle = false;
  auto* train = app.add_subcommand("train", "full-parameter fine-tuning with AdamW");
  add_data_options(train, t.data, train_flags);
  train->add_option("--output", t.output, "output model directory")->required();
  train->add_option("--steps", t.steps, "optimizer steps")->required();
  train->add_option("--lr", t.lr, "peak learning rate")->required();
  train->add_option("--grad-accum", t.grad_accum, "micro-batches per optimizer step")->capture_default_str();
  train->add_option("--weight-decay", t.weight_decay, "decoupled weight decay (all parameters)")->capture_default_str();
  train->add_option("--beta1", t.beta1)->capture_default_str();
  train->add_option("--beta2", t.beta2)->capture_default_str();
  train->add_option("--eps", t.eps)->capture_default_str();
  train->add_option("--warmup-steps", t.warmup_steps)->capture_default_str();
  train->add_option("--lr-schedule", t.lr_schedule, "constant, linear or cosine")->capture_default_str();
  train->add_option("--max-grad-norm", t.max_grad_norm, "global gradient-norm clipping; 0 = off")
      ->capture_default_str();
  train->add_option("--seed", t.seed, "seed of the data order")->capture_default_str();
  train->add_flag("--no-shuffle", no_shuffle, "take records in file order");
  train->add_option("--save-every", t.save_every, "also save OUTPUT/checkpoint-STEP every K steps; 0 = off")
      ->capture_default_str();
  train->add_option("--log-every", t.log_every, "progress line every K steps")->capture_default_str();
  train->add_option("--eval-data", t.eval_data, "held-out JSONL: its loss after training (and every --eval-every)");
  train->add_option("--eval-every", t.eval_every, "also evaluate every K steps; 0 = only at the end")
      ->capture_default_str();
  train->add_option("--resume", t.resume,
                    "continue from OUTPUT/checkpoint-STEP of an earlier run (same data and options)");
  std::string max_shard = "5GB";
  train->add_option("--max-shard-size", max_shard, "shard the output above this size")->capture_default_str();

  // demo
  DemoOptions demo_opts;
  auto* demo = app.add_subcommand("demo", "a tiny model learns 2-digit addition (CPU or GPU)");
  demo->add_option("--output", demo_opts.output, "where the trained model goes")->capture_default_str();
  demo->add_option("--device", demo_opts.device, "cpu, cuda or auto")->capture_default_str();
  demo->add_option("--steps", demo_opts.steps)->capture_default_str();
  demo->add_option("--seed", demo_opts.seed)->capture_default_str();

  // bench
  BenchOptions bo;
  auto* bench = app.add_subcommand("bench", "training throughput on synthetic weights (no files needed)");
  bench->add_option("--preset", bo.preset, "llama-1b, llama-3b, llama-8b or qwen2.5-7b")->capture_default_str();
  bench->add_option("--config", bo.config, "a config.json instead of a preset");
  bench->add_option("--device", bo.device)->capture_default_str();
  bench->add_option("--batch-size", bo.batch_size)->capture_default_str();
  bench->add_option("--seq-len", bo.seq_len)->capture_default_str();
  bench->add_option("--grad-accum", bo.grad_accum, "micro-batches per optimizer step")->capture_default_str();
  bench->add_option("--steps", bo.steps, "timed steps")->capture_default_str();
  bench->add_option("--warmup", bo.warmup, "untimed steps first")->capture_default_str();
  bench->add_option("--layers", bo.layers, "override the number of layers");
  bench_flags.add(bench);
  bench->add_option("--max-grad-norm", bo.max_grad_norm, "gradient clipping (0 = off: overlapped update)")
      ->capture_default_str();

  // tokenize
  std::string tk_model, tk_file, tk_text, tk_jsonl;
  bool tk_no_special = false;
  auto* tokenize =
      app.add_subcommand("tokenize", "token ids of text with a model's tokenizer.json (one JSON line each)");
  tokenize->add_option("--model", tk_model, "Hugging Face model directory (its tokenizer.json)");
  tokenize->add_option("--tokenizer", tk_file, "or a tokenizer.json");
  tokenize->add_option("--text", tk_text, "the text");
  tokenize->add_option("--jsonl", tk_jsonl,
                       "or a JSONL file ('-': stdin) of {\"text\": ...} or {\"messages\": [...]} lines");
  tokenize->add_flag("--no-special", tk_no_special, "without the post-processor's tokens (BOS)");

  // plan
  PlanCliOptions po;
  auto* plan =
      app.add_subcommand("plan", "where every buffer goes, whether it fits, predicted speed; allocates nothing");
  plan->add_option("--model", po.model_dir, "Hugging Face model directory (its config.json)");
  plan->add_option("--preset", po.preset, "or a built-in shape: llama-1b, llama-3b, llama-8b, qwen2.5-7b");
  plan->add_option("--config", po.config, "or a config.json");
  plan->add_option("--device", po.device, "cuda, cpu or auto")->capture_default_str();
  plan->add_option("--batch-size", po.batch_size)->capture_default_str();
  plan->add_option("--seq-len", po.seq_len)->capture_default_str();
  plan->add_option("--grad-accum", po.grad_accum)->capture_default_str();
  plan->add_option("--max-grad-norm", po.max_grad_norm, "0 = no clipping")->capture_default_str();
  plan->add_flag("--measure", po.measure, "measure this machine's rates first (a few seconds) for the prediction");
  plan_flags.add(plan);

  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      known |= sub->get_name() == argv[1];
    if (!known) {
      std::fprintf(
          stderr,
          "slideformer: unknown command '%s' (commands: init, eval, grad, train, plan, tokenize, demo, bench)\n",
          bounded_message(argv[1], kMaxWhatBytes).c_str());
      return 2;
    }
  }
  // `slideformer COMMAND CONFIG.yaml [key=value | --option value ...]`: the file's options first,
  // then the rest (later ones win: CLI11 keeps the last value of an option).
  std::vector<std::string> args(argv, argv + argc);
  std::string config_path;
  auto is_config = [](const std::string& a) {
    auto ends = [&](const std::string& x) {
      return a.size() > x.size() && a.compare(a.size() - x.size(), x.size(), x) == 0;
    };
    return ends(".yaml") || ends(".yml");
  };
  if (args.size() > 2 && args[1][0] != '-' && is_config(args[2])) {
    config_path = args[2];
    std::vector<std::string> overrides, passthrough;
    for (size_t i = 3; i < args.size(); ++i) {
      const bool kv = args[i][0] != '-' && args[i].find('=') != std::string::npos &&
                      (i == 3 || args[i - 1][0] != '-' || args[i - 1].find('=') != std::string::npos);
      (kv ? overrides : passthrough).push_back(args[i]);
    }
    std::set<std::string> given;  // options also on the command line: those win
    for (const std::string& a : passthrough)
      if (a.rfind("--", 0) == 0)
        given.insert(a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2));
    try {
      std::vector<std::string> from_file = config_to_args(config_path, overrides, given);
      args.resize(2);
      args.insert(args.end(), from_file.begin(), from_file.end());
      args.insert(args.end(), passthrough.begin(), passthrough.end());
    } catch (const InputError& e) {
      std::fprintf(stderr, "slideformer: %s\n", e.what());
      return 2;
    }
  }
  try {
    std::vector<std::string> rev(args.rbegin(), args.rend() - 1);  // CLI11 takes them reversed, argv[0] off
    app.parse(rev);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "slideformer: %s%s (see slideformer --help)\n",
                 config_path.empty() ? "" : (bounded_where(config_path) + ": ").c_str(),
                 bounded_message(e.what(), kMaxWhatBytes).c_str());  // CLI11 echoes the values
    return 2;
  }
  log_config().level = quiet ? LogLevel::Quiet : verbose ? LogLevel::Debug : LogLevel::Info;

  try {
    if (*init) return cmd_init(init_config, init_output, init_seed, init_dtype);
    if (*eval) {
      eval_flags.apply(eval_opts.engine);
      apply_data_options(eval_opts);
      EvalResult r = run_eval(eval_opts);
      print_json({{"loss", r.loss}, {"tokens", r.tokens}});
      return 0;
    }
    if (*grad) {
      grad_flags.apply(grad_opts.engine);
      apply_data_options(grad_opts);
      EvalResult r = run_grad(grad_opts, grad_output);
      print_json({{"loss", r.loss}, {"tokens", r.tokens}, {"output", grad_output}});
      return 0;
    }
    if (*train) {
      train_flags.apply(t.data.engine);
      apply_data_options(t.data);
      t.shuffle = !no_shuffle;
      t.max_shard_bytes = parse_size(max_shard, "--max-shard-size");
      TrainResult r = run_train(t);
      if (r.interrupted_by) {
        print_json({{"interrupted", true}, {"steps", r.steps}, {"checkpoint", r.checkpoint}});
        return 128 + r.interrupted_by;  // as the shell reports a signal
      }
      print_json({{"first_loss", r.first_loss},
                  {"last_loss", r.last_loss},
                  {"steps", r.steps},
                  {"tokens_per_second", r.tokens_per_second},
                  {"eval_loss", std::isnan(r.eval_loss) ? nlohmann::json() : nlohmann::json(r.eval_loss)},
                  {"output", t.output}});
      return 0;
    }
    if (*bench) {
      bench_flags.apply(bo.engine);
      check_step_sizes(bo.batch_size, bo.seq_len, bo.grad_accum);
      print_json(run_bench(bo));
      return 0;
    }
    if (*tokenize) return cmd_tokenize(tk_model, tk_file, tk_text, tk_jsonl, !tk_no_special);
    if (*plan) {
      plan_flags.apply(po.engine);
      check_step_sizes(po.batch_size, po.seq_len, po.grad_accum);
      print_json(run_plan(po));
      return 0;
    }
    if (*demo) {
      DemoResult r = run_demo(demo_opts);
      print_json({{"accuracy_before", r.accuracy_before},
                  {"accuracy_after", r.accuracy_after},
                  {"loss_before", r.loss_before},
                  {"loss_after", r.loss_after}});
      return 0;
    }
  } catch (const InputError& e) {
    std::fprintf(stderr, "slideformer: %s\n", e.what());
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the system refuses as too long is the user's input (exit 2), like any other bad path.
    const bool input = e.code() == std::errc::filename_too_long;
    std::fprintf(stderr, "slideformer: %s%s\n", input ? "" : "error: ", bounded_message(e.what(), 1024).c_str());
    return input ? 2 : 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "slideformer: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "slideformer: error: %s\n", e.what());
    return 1;
  }
  return 2;
}

}  // namespace sf
