// Settings as data below the CLI: lower layers name a Setting, the CLI's table names its option.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "cli/option_names.h"
#include "core/error.h"
#include "data/dataset/dataset.h"
#include "test_util.h"

using namespace sf;

TEST(Settings, EverySettingHasAnOptionAndANeutralName) {
  std::set<std::string> options, names;
  for (Setting s : kAllSettings) {
    const std::string opt = option_name(s), name = setting_name(s);
    EXPECT_EQ(opt.rfind("--", 0), 0u) << opt;
    EXPECT_GT(opt.size(), 2u);
    EXPECT_FALSE(name.empty());
    EXPECT_EQ(name.find("--"), std::string::npos) << name;
    options.insert(opt);
    names.insert(name);
  }
  EXPECT_EQ(options.size(), std::size(kAllSettings));  // one option a setting
  EXPECT_EQ(names.size(), std::size(kAllSettings));
}

TEST(Settings, InputErrorNamesTheSettingAsDataAndTheCliRendersTheOption) {
  InputError e = test::expect_setting_error([] { setting_error(Setting::Slots, "needs at least 2"); }, Setting::Slots);
  EXPECT_EQ(std::string(e.what()), "GPU parameter slots: needs at least 2");
  EXPECT_EQ(e.message(option_name), "--slots: needs at least 2");

  e = test::expect_setting_error(
      [] {
        input_error_naming("c.json", {"use ", Setting::SeqLen, " <= 16"});
      },
      Setting::SeqLen);
  EXPECT_EQ(std::string(e.what()), "c.json: use sequence length <= 16");
  EXPECT_EQ(e.message(option_name), "c.json: use --seq-len <= 16");

  e = test::expect_setting_error(
      [] {
        setting_error(Setting::Device, {Setting::Device, " cuda"}, "none");
      },
      Setting::Device);
  EXPECT_EQ(std::string(e.what()), "device cuda: none");
  EXPECT_EQ(e.message(option_name), "--device cuda: none");

  // No setting: the message as it is.
  const std::string plain = test::expect_input_error([] { input_error("a.txt:3", "plain"); }, {"a.txt:3: plain"});
  try {
    input_error("a.txt:3", "plain");
  } catch (const InputError& p) {
    EXPECT_FALSE(p.setting.has_value());
    EXPECT_EQ(p.message(option_name), plain);
  }
}

// The bounds of every InputError hold for the rendered message too: one line, cut.
TEST(Settings, RenderedMessagesAreBounded) {
  const InputError e = test::expect_setting_error([] { setting_error(Setting::Output, std::string(5000, 'x') + "\n"); },
                                                  Setting::Output);
  const std::string m = e.message(option_name);
  EXPECT_LE(m.size(), kMaxMessageBytes);
  EXPECT_EQ(m.find('\n'), std::string::npos);
  EXPECT_EQ(m.rfind("--output: xxx", 0), 0u) << m;
}

TEST(Settings, RecordLimitOutOfRangeNamesTheSetting) {
  const InputError e = test::expect_setting_error([] { set_max_record_bytes(0); }, Setting::MaxRecordBytes);
  EXPECT_EQ(e.message(option_name).rfind("--max-record-bytes: 0 is out of range [1, ", 0), 0u)
      << e.message(option_name);
}
