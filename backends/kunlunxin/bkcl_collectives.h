// The kunlunxin backend's DeviceCollectives (flagos/device_collectives.h):
// BKCL (bkcl_library.h) issuing on flagosd's XPU streams
// (KunlunxinStreams::IssueOnStream), over the ranks' device memory.
//
// Thread safety: as device_collectives.h says.
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_BKCL_COLLECTIVES_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_BKCL_COLLECTIVES_H_

#include <memory>

#include "absl/status/statusor.h"
#include "bkcl_library.h"
#include "flagos/device_collectives.h"
#include "flagos/runtime.h"

namespace flagos {

// BKCL for `runtime`, which must be the kunlunxin runtime and outlive the
// result. NOT_FOUND when there is no libbkcl (or FLAGOS_KUNLUNXIN_BKCL=off):
// the message says where it was looked for; FAILED_PRECONDITION for one
// that does not load (bkcl_library.h).
absl::StatusOr<std::unique_ptr<DeviceCollectives>> CreateBkclCollectives(
    DeviceRuntime& runtime, const kunlunxin::BkclSearch& search);

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_BKCL_COLLECTIVES_H_
