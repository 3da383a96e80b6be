#include "stats_table.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace flagos::smi {
namespace {

std::string Bytes(uint64_t n) {
  if (n >= (1ull << 30)) return absl::StrFormat("%.2f GiB", n / double(1ull << 30));
  if (n >= (1ull << 20)) return absl::StrFormat("%.1f MiB", n / double(1ull << 20));
  if (n >= (1ull << 10)) return absl::StrFormat("%.1f KiB", n / double(1ull << 10));
  return absl::StrFormat("%d B", n);
}

std::string Uptime(double start_time_unix) {
  if (start_time_unix <= 0) return "?";
  const absl::Duration up =
      absl::Now() - absl::FromUnixMicros(static_cast<int64_t>(start_time_unix * 1e6));
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(up));
  if (s >= 86400) return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dm%02ds", s / 60, s % 60);
}

// Busy share of device `index` between two replies, else the daemon's own.
double Utilization(const v1::DeviceInfo& device, const v1::GetStatsResponse* previous,
                   double seconds) {
  if (previous != nullptr && seconds > 0) {
    for (const v1::DeviceInfo& before : previous->devices()) {
      if (before.index() != device.index()) continue;
      return std::clamp((device.busy_seconds() - before.busy_seconds()) / seconds, 0.0, 1.0);
    }
  }
  return device.utilization();
}

}  // namespace

std::string FormatStats(const std::string& endpoint, const v1::GetStatsResponse& stats,
                        const v1::GetStatsResponse* previous, double seconds_since_previous,
                        int width) {
  std::string out = absl::StrFormat(
      "flagosd %s at %s — backend %s, torch %s, up %s; %d device(s), %d session(s) now, %d "
      "since start\n\n",
      stats.daemon_version().empty() ? "?" : stats.daemon_version(), endpoint, stats.backend(),
      stats.torch_version().empty() ? "?" : stats.torch_version(), Uptime(stats.start_time_unix()),
      stats.devices_size(), stats.sessions_size(), stats.sessions_total());
  absl::StrAppendFormat(&out, "%-9s %-28s %11s %11s %6s %6s\n", "DEVICE", "NAME", "USED", "TOTAL",
                        "MEM%", "UTIL%");
  for (const v1::DeviceInfo& d : stats.devices()) {
    const double memory =
        d.total_memory() == 0 ? 0.0 : 100.0 * d.used_memory() / d.total_memory();
    absl::StrAppendFormat(&out, "%-9s %-28s %11s %11s %5.1f%% %5.1f%%\n",
                          absl::StrCat("flagos:", d.index()), d.name().substr(0, 28),
                          Bytes(d.used_memory()), Bytes(d.total_memory()), memory,
                          100.0 * Utilization(d, previous, seconds_since_previous));
  }
  absl::StrAppendFormat(&out, "\n%-7s %-8s %-6s %-6s %-9s %7s %11s %10s %7s  %s\n", "SESSION",
                        "PID", "UID", "GID", "TORCH", "STREAMS", "MEMORY", "COMMANDS", "STAGING",
                        "CLIENT / COMMAND");
  if (stats.sessions().empty()) absl::StrAppend(&out, "(none)\n");
  // Sessions whose client left while a command of theirs ran hold their
  // memory until it returns: listed after the live ones, marked.
  std::vector<std::pair<const v1::SessionInfo*, bool>> rows;
  for (const v1::SessionInfo& s : stats.sessions()) rows.push_back({&s, false});
  for (const v1::SessionInfo& s : stats.closing_sessions()) rows.push_back({&s, true});
  for (const auto& [info, closing] : rows) {
    const v1::SessionInfo& s = *info;
    std::string what = closing ? absl::StrCat("(closing: ", s.running_commands(),
                                              " command(s) still running) ", s.client())
                               : s.client();
    if (!s.command_line().empty()) absl::StrAppend(&what, ": ", s.command_line());
    // The user and group are the kernel's (unix sockets); a TCP session's
    // are unknown, and its pid is what the client said.
    const bool known = s.credentials_from_kernel();
    std::string line = absl::StrFormat(
        "%-7d %-8d %-6s %-6s %-9s %7d %11s %10d %7s  ", s.id(), s.pid(),
        known ? absl::StrCat(s.uid()) : "?", known ? absl::StrCat(s.gid()) : "?",
        s.torch_version().empty() ? "?" : s.torch_version().substr(0, 9), s.streams(),
        Bytes(s.segment_bytes()), s.commands(),
        s.staging_attached()          ? "shm"
        : s.sync_channel_attached()   ? "tcp"
                                      : "inline");
    if (width > 0 && line.size() + what.size() > static_cast<size_t>(width)) {
      const size_t room = static_cast<size_t>(width) > line.size() + 3 ? width - line.size() - 3 : 0;
      what = absl::StrCat(what.substr(0, room), "...");
    }
    absl::StrAppend(&out, line, what, "\n");
  }
  return out;
}

}  // namespace flagos::smi
