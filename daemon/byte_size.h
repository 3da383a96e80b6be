// A number of bytes as a flag value: "8GiB", "512MiB", "1.5G", "1048576".
#ifndef FLAGOS_DAEMON_BYTE_SIZE_H_
#define FLAGOS_DAEMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flagos::daemon {

// Parses a byte count: a non-negative number (fractions allowed with a
// suffix) followed by an optional binary suffix K, KiB, M, MiB, G, GiB, T
// or TiB (case-insensitive; K = KiB = 1024). INVALID_ARGUMENT naming the
// text and the accepted forms otherwise, and on overflow.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// The shortest exact form: "8GiB", "1536MiB", "1000".
std::string FormatByteSize(uint64_t bytes);

// The type of --device-memory.
struct ByteSize {
  uint64_t bytes = 0;
};
bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error);
std::string AbslUnparseFlag(ByteSize size);

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_BYTE_SIZE_H_
