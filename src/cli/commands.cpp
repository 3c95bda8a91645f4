// cli_main: builds the subcommands (one file each in src/cli/), expands an options file, parses,
// runs the chosen command and maps its errors to exit codes.
#include "cli/commands.h"

#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <vector>

#include "cli/cli_common.h"
#include "cli/config_file.h"
#include "cli/option_names.h"
#include "core/error.h"
#include "core/log.h"

namespace sf {

namespace {

// argv[1] when it names no command: refused with the list of commands (CLI11's message is vaguer).
bool unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc <= 1 || argv[1][0] == '-') return false;
  for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (sub->get_name() == argv[1]) return false;
  std::fprintf(stderr,
               "slideformer: unknown command '%s' (commands: init, eval, grad, train, plan, tokenize, demo, bench)\n",
               bounded_message(argv[1], kMaxWhatBytes).c_str());
  return true;
}

bool is_config_file(const std::string& a) {
  auto ends = [&](const std::string& x) {
    return a.size() > x.size() && a.compare(a.size() - x.size(), x.size(), x) == 0;
  };
  return ends(".yaml") || ends(".yml");
}

// `slideformer COMMAND CONFIG.yaml [key=value | --option value ...]`: the file's options first,
// then the rest (later ones win: CLI11 keeps the last value of an option). Returns the file's path
// ("" when there is none); InputError on a bad file.
std::string expand_config_file(std::vector<std::string>& args) {
  if (args.size() <= 2 || args[1][0] == '-' || !is_config_file(args[2])) return "";
  const std::string config_path = args[2];
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
  std::vector<std::string> from_file = config_to_args(config_path, overrides, given);
  args.resize(2);
  args.insert(args.end(), from_file.begin(), from_file.end());
  args.insert(args.end(), passthrough.begin(), passthrough.end());
  return config_path;
}

// Parses args into app; an exit code when the run ends here (help, a parse error), else nullopt.
std::optional<int> parse_args(CLI::App& app, const std::vector<std::string>& args, const std::string& config_path) {
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
  return std::nullopt;
}

// Runs a command: bad input exits 2 with one line, internal failures 1.
int run_with_exit_codes(const std::function<int()>& run) {
  try {
    return run();
  } catch (const InputError& e) {
    std::fprintf(stderr, "slideformer: %s\n", e.message(option_name).c_str());
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
}

}  // namespace

int cli_main(int argc, char** argv) {
  CLI::App app{"slideformer: full-parameter fine-tuning of Llama-family models"};
  app.require_subcommand(1);
  bool quiet = false, verbose = false;
  app.add_flag("-q,--quiet", quiet, "only results on stdout, errors on stderr");
  app.add_flag("-v,--verbose", verbose, "more diagnostics on stderr");
  // -q / -v anywhere on the line (`slideformer train ... -q`): an option a subcommand does not know
  // falls through to this level (subcommands inherit the setting), where it is matched or refused.
  app.fallthrough();
  const Command commands[] = {add_init_command(app),     add_eval_command(app), add_grad_command(app),
                              add_train_command(app),    add_demo_command(app), add_bench_command(app),
                              add_tokenize_command(app), add_plan_command(app)};
  if (unknown_command(app, argc, argv)) return 2;
  std::vector<std::string> args(argv, argv + argc);
  std::string config_path;
  try {
    config_path = expand_config_file(args);
  } catch (const InputError& e) {
    std::fprintf(stderr, "slideformer: %s\n", e.message(option_name).c_str());
    return 2;
  }
  if (const std::optional<int> done = parse_args(app, args, config_path)) return *done;
  log_config().level = quiet ? LogLevel::Quiet : verbose ? LogLevel::Debug : LogLevel::Info;
  for (const Command& c : commands)
    if (c.sub->parsed()) return run_with_exit_codes(c.run);
  return 2;
}

}  // namespace sf
