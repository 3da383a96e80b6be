// flagos-smi: what a flagosd holds — devices, memory, sessions.
//
//   flagos-smi                      # the daemon of FLAGOS_ENDPOINT, else the system one
//   flagos-smi --endpoint=unix:///tmp/flagosd.sock
//   flagos-smi --json               # the GetStats reply as JSON (proto field names)
//
// Asks GetStats without opening a session, so it changes nothing in the
// daemon. Exit status: 0, or 1 when the daemon cannot be reached.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "flagos/client/connection.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, endpoint, "",
          "The daemon: unix:///path or host:port. Default: $FLAGOS_ENDPOINT, else "
          "unix:///run/flagosd/flagosd.sock.");
ABSL_FLAG(bool, json, false, "Print the daemon's GetStats reply as JSON.");
ABSL_FLAG(int, timeout_ms, 2000, "How long to wait for the daemon.");

namespace {

constexpr char kSystemEndpoint[] = "unix:///run/flagosd/flagosd.sock";

std::string Endpoint() {
  std::string endpoint = absl::GetFlag(FLAGS_endpoint);
  if (!endpoint.empty()) return endpoint;
  if (const char* env = std::getenv("FLAGOS_ENDPOINT"); env != nullptr && *env != '\0') {
    return env;
  }
  return kSystemEndpoint;
}

std::string Bytes(uint64_t n) {
  if (n >= (1ull << 30)) return absl::StrFormat("%.2f GiB", n / double(1ull << 30));
  if (n >= (1ull << 20)) return absl::StrFormat("%.1f MiB", n / double(1ull << 20));
  if (n >= (1ull << 10)) return absl::StrFormat("%.1f KiB", n / double(1ull << 10));
  return absl::StrFormat("%d B", n);
}

void PrintTable(const std::string& endpoint, const flagos::v1::GetStatsResponse& stats) {
  std::printf("flagosd at %s — backend %s, %d device(s), %d session(s) now, %llu since start\n\n",
              endpoint.c_str(), stats.backend().c_str(), stats.devices_size(),
              stats.sessions_size(), static_cast<unsigned long long>(stats.sessions_total()));
  std::printf("%-8s %-28s %12s %12s %6s\n", "DEVICE", "NAME", "USED", "TOTAL", "USE%");
  for (const auto& d : stats.devices()) {
    double percent = d.total_memory() == 0 ? 0.0 : 100.0 * d.used_memory() / d.total_memory();
    std::printf("%-8s %-28s %12s %12s %5.1f%%\n", absl::StrFormat("flagos:%d", d.index()).c_str(),
                d.name().c_str(), Bytes(d.used_memory()).c_str(), Bytes(d.total_memory()).c_str(),
                percent);
  }
  std::printf("\n%-8s %-8s %-6s %-20s %9s %12s %12s %8s %12s\n", "SESSION", "PID", "UID",
              "CLIENT", "SEGMENTS", "MEMORY", "COMMANDS", "STAGING", "STAGED");
  if (stats.sessions().empty()) std::printf("(none)\n");
  for (const auto& s : stats.sessions()) {
    std::printf("%-8llu %-8lld %-6u %-20s %9llu %12s %12llu %8s %12s\n",
                static_cast<unsigned long long>(s.id()), static_cast<long long>(s.pid()), s.uid(),
                s.client().c_str(), static_cast<unsigned long long>(s.segments()),
                Bytes(s.segment_bytes()).c_str(), static_cast<unsigned long long>(s.commands()),
                s.staging_attached() ? "shm" : "inline", Bytes(s.staged_bytes()).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Shows the devices, memory and sessions of a flagosd.\n"
      "Usage: flagos-smi [--endpoint=unix:///path|host:port] [--json]");
  absl::ParseCommandLine(argc, argv);
  const std::string endpoint = Endpoint();
  auto stats = flagos::client::QueryStats(endpoint,
                                          absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  if (!stats.ok()) {
    std::fprintf(stderr, "flagos-smi: %s\n", std::string(stats.status().message()).c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_json)) {
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    std::string json;
    if (!google::protobuf::util::MessageToJsonString(*stats, &json, options).ok()) {
      std::fprintf(stderr, "flagos-smi: cannot format the reply as JSON\n");
      return 1;
    }
    std::printf("%s\n", json.c_str());
    return 0;
  }
  PrintTable(endpoint, *stats);
  return 0;
}
