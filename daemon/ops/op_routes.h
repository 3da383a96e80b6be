// Which route each operator takes on a backend, from backends/<name>/ops.conf
// (embedded into flagosd at build time; scripts/gen-ops-conf writes the
// files):
//
//   # comment
//   default = cpu_fallback
//   aten::add.Tensor = native
//
// `native`: the backend's own kernels (its OpExecutor). `cpu_fallback`: the
// daemon copies the operands to the host, runs ATen's CPU kernel and copies
// the results back, ordered on the op's stream. An operator the file does
// not name takes the default.
//
// Thread safety: immutable after Parse; share freely.
#ifndef FLAGOS_DAEMON_OPS_OP_ROUTES_H_
#define FLAGOS_DAEMON_OPS_OP_ROUTES_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flagos::daemon {

enum class OpRoute { kNative, kCpuFallback };

absl::string_view OpRouteName(OpRoute route);

class OpRoutes {
 public:
  // Parses the text of an ops.conf; `origin` names it in errors.
  // INVALID_ARGUMENT naming the line for a malformed line, an unknown route
  // or an operator given twice.
  static absl::StatusOr<OpRoutes> Parse(absl::string_view text, absl::string_view origin);

  // The route of "aten::add.Tensor" (overload after the dot; no dot for the
  // default overload).
  OpRoute RouteOf(absl::string_view op) const;
  OpRoute default_route() const { return default_; }
  // Every operator of namespace `ns` ("flagos_c10d") that the file does not
  // name takes `route` instead of the default (the backend's collectives:
  // library_collectives.h).
  void RouteNamespace(absl::string_view ns, OpRoute route);
  size_t size() const { return routes_.size(); }
  // Operators routed natively.
  size_t native_count() const { return native_count_; }

 private:
  OpRoute default_ = OpRoute::kCpuFallback;
  absl::flat_hash_map<std::string, OpRoute> routes_;
  absl::flat_hash_map<std::string, OpRoute> namespaces_;
  size_t native_count_ = 0;
};

// The embedded ops.conf of a backend ("cpu", "kunlunxin"); empty when the
// build has none.
absl::string_view EmbeddedOpsConf(absl::string_view backend);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_ROUTES_H_
