// Sizes and durations as users write and read them.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/units.h"

namespace sf {
namespace {

TEST(Units, ParseSize) {
  EXPECT_EQ(parse_size("1000000", "--x"), 1000000u);
  EXPECT_EQ(parse_size("5GB", "--x"), 5000000000u);
  EXPECT_EQ(parse_size("22GiB", "--x"), uint64_t(22) << 30);
  EXPECT_EQ(parse_size("512MiB", "--x"), uint64_t(512) << 20);
  EXPECT_EQ(parse_size("64KiB", "--x"), uint64_t(64) << 10);
  for (const char* bad : {"", "lots", "-5GB", "5XB", "GB"}) {
    try {
      parse_size(bad, "--gpu-memory");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--gpu-memory"), std::string::npos) << e.what();
    }
  }
}

TEST(Units, Format) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(uint64_t(3) << 29), "1.50 GiB");
  EXPECT_EQ(format_duration(0.4), "0s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(425), "7m05s");
  EXPECT_EQ(format_duration(3 * 3600 + 125), "3h02m");
  EXPECT_EQ(format_duration(-1), "?");
}

}  // namespace
}  // namespace sf
