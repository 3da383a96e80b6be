#include "ops/op_routes.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace flagos::daemon {
namespace {

absl::StatusOr<OpRoute> ParseRoute(absl::string_view word) {
  if (word == "native") return OpRoute::kNative;
  if (word == "cpu_fallback") return OpRoute::kCpuFallback;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown route '", word, "' (routes are native and cpu_fallback)"));
}

}  // namespace

absl::string_view OpRouteName(OpRoute route) {
  return route == OpRoute::kNative ? "native" : "cpu_fallback";
}

absl::StatusOr<OpRoutes> OpRoutes::Parse(absl::string_view text, absl::string_view origin) {
  OpRoutes routes;
  int line_number = 0;
  bool has_default = false;
  while (!text.empty()) {
    ++line_number;
    const size_t end = text.find('\n');
    absl::string_view line = text.substr(0, end);
    text = end == absl::string_view::npos ? absl::string_view() : text.substr(end + 1);
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ":", line_number, ": ", what));
    };
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) return error("expected 'op.overload = route'");
    const absl::string_view op = absl::StripAsciiWhitespace(line.substr(0, eq));
    absl::StatusOr<OpRoute> route = ParseRoute(absl::StripAsciiWhitespace(line.substr(eq + 1)));
    if (!route.ok()) return error(route.status().message());
    if (op == "default") {
      if (has_default) return error("the default route is given twice");
      has_default = true;
      routes.default_ = *route;
      continue;
    }
    if (op.empty() || op.find("::") == absl::string_view::npos) {
      return error(absl::StrCat("'", op, "' is not an operator name such as aten::add.Tensor"));
    }
    if (!routes.routes_.emplace(std::string(op), *route).second) {
      return error(absl::StrCat(op, " is routed twice"));
    }
    if (*route == OpRoute::kNative) ++routes.native_count_;
  }
  return routes;
}

OpRoute OpRoutes::RouteOf(absl::string_view op) const {
  if (auto it = routes_.find(op); it != routes_.end()) return it->second;
  if (!namespaces_.empty()) {
    const size_t colons = op.find("::");
    if (colons != absl::string_view::npos) {
      if (auto it = namespaces_.find(op.substr(0, colons)); it != namespaces_.end()) {
        return it->second;
      }
    }
  }
  return default_;
}

void OpRoutes::RouteNamespace(absl::string_view ns, OpRoute route) {
  namespaces_[std::string(ns)] = route;
}

}  // namespace flagos::daemon
