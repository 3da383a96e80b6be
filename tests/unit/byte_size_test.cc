#include "byte_size.h"

#include <gtest/gtest.h>

namespace flagos::daemon {
namespace {

TEST(ByteSizeTest, PlainNumbersAreBytes) {
  EXPECT_EQ(*ParseByteSize("0"), 0u);
  EXPECT_EQ(*ParseByteSize("1048576"), 1048576u);
  EXPECT_EQ(*ParseByteSize("512B"), 512u);
}

TEST(ByteSizeTest, SuffixesArePowersOf1024) {
  EXPECT_EQ(*ParseByteSize("4K"), 4096u);
  EXPECT_EQ(*ParseByteSize("4KiB"), 4096u);
  EXPECT_EQ(*ParseByteSize("512M"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("512mib"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("8GiB"), 8ull << 30);
  EXPECT_EQ(*ParseByteSize("8g"), 8ull << 30);
  EXPECT_EQ(*ParseByteSize("1T"), 1ull << 40);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), 3ull << 29);
}

TEST(ByteSizeTest, GarbageIsRejectedWithTheAcceptedForms) {
  for (const char* text : {"", "GiB", "8GB", "8 parsecs", "-1", "1.5", "0.3K", "1e9",
                           "99999999999999999999", "20000000T"}) {
    absl::StatusOr<uint64_t> size = ParseByteSize(text);
    EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(size.status().message().find("KiB"), absl::string_view::npos) << text;
  }
}

TEST(ByteSizeTest, FormatPicksTheLargestExactUnit) {
  EXPECT_EQ(FormatByteSize(8ull << 30), "8GiB");
  EXPECT_EQ(FormatByteSize(1536ull << 20), "1536MiB");
  EXPECT_EQ(FormatByteSize(1000), "1000");
  EXPECT_EQ(FormatByteSize(0), "0");
}

}  // namespace
}  // namespace flagos::daemon
