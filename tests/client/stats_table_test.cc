#include "stats_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_split.h"

namespace flagos::smi {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Lines(const std::string& text) { return absl::StrSplit(text, '\n'); }

std::string LineOf(const std::string& table, const std::string& first_column) {
  for (const std::string& line : Lines(table)) {
    if (line.rfind(first_column + " ", 0) == 0) return line;
  }
  return "";
}

TEST(StatsTableTest, SessionsShowTheKernelsUserAndClosingOnesAreMarked) {
  v1::GetStatsResponse stats;
  stats.set_backend("cpu");
  v1::SessionInfo* local = stats.add_sessions();
  local->set_id(3);
  local->set_pid(4711);
  local->set_uid(1000);
  local->set_gid(100);
  local->set_credentials_from_kernel(true);
  local->set_client("torch_fl");
  v1::SessionInfo* remote = stats.add_sessions();
  remote->set_id(4);
  remote->set_pid(99);
  remote->set_gid(-1);
  remote->set_client("torch_fl");
  v1::SessionInfo* closing = stats.add_closing_sessions();
  closing->set_id(2);
  closing->set_pid(4700);
  closing->set_uid(1000);
  closing->set_gid(100);
  closing->set_credentials_from_kernel(true);
  closing->set_running_commands(1);
  closing->set_client("torch_fl");
  const std::string table = FormatStats("unix:///s", stats, nullptr, 0, 0);
  EXPECT_THAT(LineOf(table, "SESSION"), HasSubstr("PID      UID    GID"));
  EXPECT_THAT(LineOf(table, "3"), HasSubstr("4711     1000   100"));
  // A TCP session's user is unknown, not uid 0.
  EXPECT_THAT(LineOf(table, "4"), HasSubstr("99       ?      ?"));
  EXPECT_THAT(LineOf(table, "2"), HasSubstr("(closing: 1 command(s) still running) torch_fl"));
}

}  // namespace
}  // namespace flagos::smi
