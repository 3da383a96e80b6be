#include "command_descriptions.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace flagos::client {

CommandDescriptions::CommandDescriptions() : ring_(kCapacity) {}

void CommandDescriptions::Record(uint64_t seq, absl::string_view describe) {
  Entry& entry = ring_[seq % kCapacity];
  entry.seq = seq;
  entry.describe.assign(describe.data(), describe.size());
}

std::string CommandDescriptions::Describe(uint64_t seq) const {
  const Entry& entry = ring_[seq % kCapacity];
  if (entry.seq != seq || entry.describe.empty()) return absl::StrCat("command ", seq);
  return entry.describe;
}

}  // namespace flagos::client
