// flagos-smi: what a flagosd holds — devices, memory, utilisation, sessions.
//
//   flagos-smi                      # the daemon of FLAGOS_ENDPOINT, else the system one
//   flagos-smi --endpoint=unix:///tmp/flagosd.sock
//   flagos-smi -l 2                 # refresh every 2 s, like nvidia-smi -l
//   flagos-smi --json               # the GetStats reply as JSON (proto field names)
//   flagos-smi -l 5 --json          # one JSON object per line, every 5 s
//   flagos-smi --health             # grpc.health.v1 Check: exit 0 when SERVING
//
// Asks GetStats without opening a session, so it changes nothing in the
// daemon. Exit status: 0; 1 when the daemon cannot be reached (or, with
// --health, is not serving); 2 for a bad command line.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "flagos/cli/command_line.h"
#include "flagos/client/connection.h"
#include "google/protobuf/util/json_util.h"
#include "stats_table.h"

ABSL_FLAG(std::string, endpoint, "",
          "The daemon: unix:///path (or the bare /path) or host:port. Default: $FLAGOS_ENDPOINT, else "
          "unix:///run/flagosd/flagosd.sock.");
ABSL_FLAG(bool, json, false,
          "Print the daemon's GetStats reply as JSON (one object per line with -l). Fields "
          "are only ever added, never renamed: safe for scripts.");
ABSL_FLAG(double, loop, 0,
          "Refresh every this many seconds until interrupted (also -l SECONDS). Utilisation is "
          "then measured over each interval.");
ABSL_FLAG(int, count, 0, "With --loop: stop after this many refreshes (0: never).");
ABSL_FLAG(bool, health, false,
          "Ask the daemon's grpc.health.v1 service; print SERVING and exit 0, or the reason "
          "and exit 1 (for liveness probes).");
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

std::optional<std::string> Json(const flagos::v1::GetStatsResponse& stats) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(stats, &json, options).ok()) return std::nullopt;
  return json;
}

// nvidia-smi's "-l SECONDS": rewritten to --loop=SECONDS for absl.
std::vector<std::string> RewriteShortLoop(int argc, char** argv, bool* bad) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (i > 0 && (arg == "-l" || arg == "--l")) {
      double seconds = 0;
      if (i + 1 >= argc || !absl::SimpleAtod(argv[i + 1], &seconds) || seconds <= 0) {
        *bad = true;
        return args;
      }
      args.push_back(absl::StrCat("--loop=", argv[++i]));
      continue;
    }
    args.push_back(std::move(arg));
  }
  return args;
}

int Health(const std::string& endpoint, absl::Duration timeout) {
  absl::Status health = flagos::client::QueryHealth(endpoint, timeout);
  if (!health.ok()) {
    std::fprintf(stderr, "flagos-smi: %s\n", std::string(health.message()).c_str());
    return 1;
  }
  std::printf("SERVING\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr char kUsage[] =
      "shows the devices, memory, utilisation and sessions of a flagosd.\n\n"
      "Usage: flagos-smi [--endpoint=unix:///path|host:port] [-l SECONDS [--count=N]] [--json]\n"
      "       flagos-smi --health\n\n"
      "Exit status: 0; 1 when the daemon cannot be reached (or, with --health, is not\n"
      "serving); 2 for a bad command line.";
  absl::SetProgramUsageMessage(kUsage);
  // --help lists flagos-smi's own flags (those of this file); the torch is
  // the one it was built beside (it loads none).
  const flagos::cli::ToolDescription tool{"flagos-smi", kUsage, "smi/flagos_smi.cc",
                                             FLAGOS_TORCH_VERSION};
  absl::FlagsUsageConfig usage_config;
  usage_config.version_string = [tool] { return flagos::cli::VersionLine(tool) + "\n"; };
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<std::string> normalized = flagos::cli::NormalizeFlagNames(argc, argv);
  if (std::optional<int> answered = flagos::cli::AnswerHelpOrVersion(normalized, tool)) {
    return *answered;
  }
  std::vector<char*> normalized_argv;
  for (std::string& arg : normalized) normalized_argv.push_back(arg.data());
  bool bad = false;
  std::vector<std::string> rewritten = RewriteShortLoop(
      static_cast<int>(normalized_argv.size()), normalized_argv.data(), &bad);
  if (bad) {
    std::fprintf(stderr, "flagos-smi: -l needs a number of seconds > 0, e.g. -l 2\n");
    return 2;
  }
  std::vector<char*> args;
  for (std::string& arg : rewritten) args.push_back(arg.data());
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  const std::string endpoint = Endpoint();
  const absl::Duration timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  if (absl::GetFlag(FLAGS_health)) return Health(endpoint, timeout);

  const double loop = absl::GetFlag(FLAGS_loop);
  if (loop < 0) {
    std::fprintf(stderr, "flagos-smi: --loop must be >= 0 seconds\n");
    return 2;
  }
  const bool json = absl::GetFlag(FLAGS_json);
  const bool clear = loop > 0 && !json && isatty(STDOUT_FILENO);
  const int count = absl::GetFlag(FLAGS_count);
  std::optional<flagos::v1::GetStatsResponse> previous;
  absl::Time previous_at;
  int rc = 0;
  for (int refresh = 1;; ++refresh) {
    const absl::Time started = absl::Now();
    auto stats = flagos::client::QueryStats(endpoint, timeout);
    if (!stats.ok()) {
      std::fprintf(stderr, "flagos-smi: %s\n", std::string(stats.status().message()).c_str());
      rc = 1;
      previous.reset();
      if (loop == 0) return rc;
    } else if (json) {
      std::optional<std::string> text = Json(*stats);
      if (!text) {
        std::fprintf(stderr, "flagos-smi: cannot format the reply as JSON\n");
        return 1;
      }
      std::printf("%s\n", text->c_str());
      rc = 0;
    } else {
      if (clear) std::printf("\033[H\033[2J");
      if (loop > 0) {
        std::printf("%s\n", absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::Now(),
                                              absl::LocalTimeZone())
                                .c_str());
      }
      const double since = previous ? absl::ToDoubleSeconds(started - previous_at) : 0;
      const std::string table = flagos::smi::FormatStats(
          endpoint, *stats, previous ? &*previous : nullptr, since, clear ? 160 : 0);
      std::fwrite(table.data(), 1, table.size(), stdout);
      previous = *stats;
      previous_at = started;
      rc = 0;
    }
    std::fflush(stdout);
    if (loop == 0 || (count > 0 && refresh >= count)) return rc;
    absl::SleepFor(started + absl::Seconds(loop) - absl::Now());
  }
}
