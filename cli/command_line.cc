#include "flagos/cli/command_line.h"

#include <algorithm>
#include <cstdio>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

// Set by CMake on this file (cli/CMakeLists.txt): the project's version
// and the build type it was configured with.
#ifndef FLAGOS_VERSION
#error "FLAGOS_VERSION must be defined by the build (CMake's PROJECT_VERSION)"
#endif
#ifndef FLAGOS_BUILD_TYPE
#error "FLAGOS_BUILD_TYPE must be defined by the build (CMAKE_BUILD_TYPE)"
#endif

namespace flagos::cli {
namespace {

constexpr size_t kHelpWidth = 78;
constexpr char kHelpIndent[] = "      ";

// `text` as lines of at most kHelpWidth characters, each indented.
std::string Wrap(absl::string_view text) {
  std::string out;
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && line.size() + 1 + word.size() > kHelpWidth - sizeof(kHelpIndent) + 1) {
      absl::StrAppend(&out, kHelpIndent, line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(&out, kHelpIndent, line, "\n");
  return out;
}

}  // namespace

std::string VersionLine(const ToolDescription& tool) {
  return absl::StrCat(tool.name, " ", FLAGOS_VERSION, " (torch ", tool.torch_version, ", ",
                      FLAGOS_BUILD_TYPE, " build)");
}

std::string HelpText(const ToolDescription& tool) {
  std::vector<const absl::CommandLineFlag*> own;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!flag->IsRetired() && absl::EndsWith(flag->Filename(), tool.flags_file)) {
      own.push_back(flag);
    }
  }
  std::sort(own.begin(), own.end(), [](const absl::CommandLineFlag* a,
                                       const absl::CommandLineFlag* b) {
    return a->Name() < b->Name();
  });
  std::string out = absl::StrCat(tool.name, ": ", tool.usage, "\n\nFlags (each may be written "
                                 "with dashes or underscores, --a-b or --a_b):\n");
  for (const absl::CommandLineFlag* flag : own) {
    absl::StrAppend(&out, "  --", absl::StrReplaceAll(flag->Name(), {{"_", "-"}}), "=",
                    flag->DefaultValue(), "\n", Wrap(flag->Help()));
  }
  absl::StrAppend(&out, "  --help\n", Wrap("Print this text and exit."), "  --version\n",
                  Wrap(absl::StrCat("Print the version line (\"", VersionLine(tool),
                                    "\") and exit.")));
  return out;
}

std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (i > 0 && arg == "--") {  // everything after it is positional
      for (; i < argc; ++i) args.emplace_back(argv[i]);
      break;
    }
    if (i > 0 && arg.size() > 1 && arg[0] == '-') {
      const size_t dashes = arg[1] == '-' ? 2 : 1;
      const size_t name_end = std::min(arg.find('='), arg.size());
      for (size_t c = dashes; c < name_end; ++c) {
        if (arg[c] == '-') arg[c] = '_';
      }
    }
    args.push_back(std::move(arg));
  }
  return args;
}

std::optional<int> AnswerHelpOrVersion(const std::vector<std::string>& args,
                                       const ToolDescription& tool) {
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpshort" ||
        arg == "-helpshort") {
      const std::string text = HelpText(tool);
      std::fwrite(text.data(), 1, text.size(), stdout);
      return 0;
    }
    if (arg == "--version" || arg == "-version") {
      std::printf("%s\n", VersionLine(tool).c_str());
      return 0;
    }
  }
  return std::nullopt;
}

}  // namespace flagos::cli
