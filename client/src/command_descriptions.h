// CommandDescriptions: what each recently enqueued command was, by seq, so
// that an error the daemon reports later can name the command ("aten::add.
// Tensor") rather than a number.
//
// A fixed ring of the last kCapacity seqs: recording never allocates beyond
// the strings themselves, and the oldest descriptions are forgotten.
//
// Not thread-safe; the owner serialises access.
#ifndef FLAGOS_CLIENT_SRC_COMMAND_DESCRIPTIONS_H_
#define FLAGOS_CLIENT_SRC_COMMAND_DESCRIPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace flagos::client {

class CommandDescriptions {
 public:
  static constexpr size_t kCapacity = 8192;

  CommandDescriptions();

  // Remembers `describe` for `seq`, forgetting seq - kCapacity.
  // The slot's string keeps its capacity: recording costs no allocation once
  // the ring has held descriptions as long.
  void Record(uint64_t seq, absl::string_view describe);

  // The description recorded for `seq`, or "command <seq>" when it was never
  // recorded, was empty, or has been forgotten.
  std::string Describe(uint64_t seq) const;

 private:
  struct Entry {
    uint64_t seq = 0;  // 0: empty (seqs start at 1)
    std::string describe;
  };
  std::vector<Entry> ring_;
};

}  // namespace flagos::client

#endif  // FLAGOS_CLIENT_SRC_COMMAND_DESCRIPTIONS_H_
