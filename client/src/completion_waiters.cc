#include "completion_waiters.h"

#include <utility>

namespace flagos::client {

void CompletionWaiters::Register(uint64_t seq, Slot* slot) { slots_[seq] = slot; }

void CompletionWaiters::Unregister(uint64_t seq) { slots_.erase(seq); }

bool CompletionWaiters::Deliver(v1::Completion* completion) {
  auto it = slots_.find(completion->seq());
  if (it == slots_.end()) return false;
  Slot* slot = it->second;
  slots_.erase(it);
  slot->completion = std::move(*completion);
  slot->done = true;
  return true;
}

}  // namespace flagos::client
