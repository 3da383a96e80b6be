// The command line of flagos's tools (flagosd, flagos-smi): flag names with
// dashes or underscores, and --help and --version answered the same way by
// every tool and every Abseil release.
//
// Abseil alone would not do: its --help lists every linked flag unless told
// which files count (and flagos-smi's usage config matched none, printing
// "No flags matched."), exits 1 on Debian 12's Abseil (20220623), and its
// --version prints the build mode only. Flag names with dashes are not
// Abseil's (it matches names exactly), so they are rewritten here.
//
// Thread safety: call from main() before other threads use the flags.
#ifndef FLAGOS_CLI_COMMAND_LINE_H_
#define FLAGOS_CLI_COMMAND_LINE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace flagos::cli {

// What a tool says about itself on --help and --version.
struct ToolDescription {
  // The program's name, e.g. "flagosd".
  std::string name;
  // The usage text printed above the flags (what the tool does, a synopsis).
  std::string usage;
  // The source file whose ABSL_FLAGs are the tool's own, as __FILE__ ends
  // (e.g. "daemon/main.cc"): --help lists these and no library's.
  std::string flags_file;
  // The torch the tool was built with (flagosd: the libtorch it links).
  std::string torch_version;
};

// "flagosd 0.1.0 (torch 2.13.0, RelWithDebInfo build)": the project version
// and build type CMake configured, and `tool.torch_version`.
std::string VersionLine(const ToolDescription& tool);

// The text of --help: the usage, then each of the tool's own flags in
// alphabetical order as `--dashed-name=DEFAULT` (the default the code has,
// read from the flag itself) with its help text below it.
std::string HelpText(const ToolDescription& tool);

// argv with the dashes in every flag name turned into underscores (--timeout-ms=5 → --timeout_ms=5, -cpu-devices → -cpu_devices),
// which is how Abseil spells them; values and everything after "--" are left
// as they are. argv[0] is kept.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv);

// Answers --help (also -h and --helpshort; --helpfull stays Abseil's, listing
// every linked flag) and --version
// among `args` (already normalized): prints HelpText or VersionLine on
// stdout and returns the exit status, 0. nullopt when neither is asked for,
// and then Abseil parses the command line.
std::optional<int> AnswerHelpOrVersion(const std::vector<std::string>& args,
                                       const ToolDescription& tool);

}  // namespace flagos::cli

#endif  // FLAGOS_CLI_COMMAND_LINE_H_
