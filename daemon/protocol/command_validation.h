// Pure checks of the commands a session receives: tensor descriptors, the
// bytes they span, devices and protocol limits. No ATen, no gRPC, no state:
// everything here is a function of its arguments.
#ifndef FLAGOS_DAEMON_PROTOCOL_COMMAND_VALIDATION_H_
#define FLAGOS_DAEMON_PROTOCOL_COMMAND_VALIDATION_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "flagos/v1/flagos.pb.h"

namespace flagos::daemon {

// Protocol limits (flagos.proto, docs/protocol.md).
inline constexpr int kMaxTensorRank = 64;
inline constexpr int kMaxCommandsPerBatch = 65536;
inline constexpr uint32_t kMaxOpId = (1u << 31) - 1;
// register_op: bytes of name and overload together (ATen's longest is under
// 100); a longer name is refused without being echoed whole.
inline constexpr size_t kMaxOpNameBytes = 256;
// register_op: bytes of the client's schema (ATen's longest prints in about
// 600) and its bracket nesting (ATen's deepest is 2).
inline constexpr size_t kMaxOpSchemaBytes = 4096;
inline constexpr int kMaxOpSchemaNesting = 8;
// A copy_from_device reply must fit a 256 MiB gRPC message (copies into
// pinned memory, which reply nothing, are not limited).
inline constexpr uint64_t kMaxCopyFromDeviceBytes = 128ull << 20;

// Bytes per element of c10::ScalarType number `dtype`; 0 when flagosd does
// not accept the type (quantized, bit-packed and sub-byte integer types).
int ItemSize(int dtype);
// "float32", "int64", ...; "dtype <n>" for numbers flagosd does not know.
std::string DtypeName(int dtype);

// The bytes a tensor descriptor spans on its device.
struct TensorExtent {
  uint64_t begin = 0;   // address of the first element: addr + storage_offset * itemsize
  uint64_t nbytes = 0;  // up to and including the farthest element; 0 when numel == 0
  int64_t numel = 0;
  int itemsize = 0;
};

// Checks `ref`'s shape fields (rank <= kMaxTensorRank, as many strides as
// sizes, no negative size, stride or storage offset, a known dtype) and
// computes its extent: the farthest element is at sum((size_i - 1) *
// stride_i), so strides of 0 (expanded tensors) span one element per
// broadcast dimension and overlapping strides never reach further than
// that. INVALID_ARGUMENT naming the field on malformed input, and when the
// extent does not fit a 64-bit address space. `ref.undefined` is not
// looked at.
absl::StatusOr<TensorExtent> ComputeTensorExtent(const v1::TensorRef& ref);

// The elements of a host tensor (sizes and dtype checked as above), and
// that its data holds exactly numel * itemsize bytes.
absl::StatusOr<int64_t> CheckHostTensor(const v1::HostTensor& tensor);

// "op", "copy_to_device", ...; "empty" when no kind is set.
absl::string_view CommandKindName(const v1::Command& command);

// "flagos:3".
std::string DeviceName(int device);

// INVALID_ARGUMENT unless 0 <= device < device_count.
absl::Status CheckDevice(int device, int device_count, absl::string_view what);

// The error for an address range that is not inside one of the session's
// segments: "command 12 (op): address 0x7f.. + 64 bytes is outside this
// session's segments on flagos:0".
absl::Status OutsideSegmentsError(uint64_t seq, absl::string_view kind, uint64_t addr,
                                  uint64_t nbytes, int device);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_PROTOCOL_COMMAND_VALIDATION_H_
