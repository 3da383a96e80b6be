#include "protocol/message_recorder.h"

#include <fstream>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "protocol/command_addresses.h"
#include "logging.h"

namespace flagos::daemon {

MessageRecorder::MessageRecorder(std::string dir, uint64_t session_id)
    : dir_(std::move(dir)), session_id_(session_id) {}

void MessageRecorder::RecordIncoming(const v1::ClientMessage& message) {
  absl::MutexLock lock(&mu_);
  if (!message.has_batch()) {
    Write(message);
    return;
  }
  Write(Rewrite(message.batch()));
}

void MessageRecorder::ObserveReply(const v1::ServerMessage& reply) {
  absl::MutexLock lock(&mu_);
  for (const v1::Completion& completion : reply.completions()) {
    auto pending = pending_allocations_.find(completion.seq());
    if (pending == pending_allocations_.end()) continue;
    const auto [device, nbytes] = pending->second;
    pending_allocations_.erase(pending);
    if (completion.code() != 0) continue;
    segments_[{device, completion.addr()}] = Segment{device, completion.addr(), nbytes};
  }
}

const MessageRecorder::Segment* MessageRecorder::Find(int device, uint64_t addr) const {
  auto after = segments_.upper_bound({device, addr});
  if (after == segments_.begin()) return nullptr;
  const Segment& segment = std::prev(after)->second;
  if (segment.device != device || addr - segment.addr >= segment.nbytes) return nullptr;
  return &segment;
}

v1::ClientMessage MessageRecorder::Rewrite(const v1::CommandBatch& batch) {
  // The segments this batch names, in the order it first names them.
  std::vector<const Segment*> named;
  absl::flat_hash_map<const Segment*, uint64_t> ordinal;
  // Ops it runs that an earlier batch registered, in order of first use.
  std::vector<uint32_t> earlier_ops;
  absl::flat_hash_set<uint32_t> ops_here;
  std::vector<v1::Command> commands(batch.commands().begin(), batch.commands().end());
  std::vector<std::pair<int, uint64_t>> freed;
  for (v1::Command& command : commands) {
    if (command.has_register_op()) {
      ops_[command.register_op().op_id()] = command.register_op();
      ops_here.insert(command.register_op().op_id());
    } else if (command.has_op()) {
      const uint32_t op = command.op().op_id();
      if (ops_here.insert(op).second && ops_.contains(op)) earlier_ops.push_back(op);
    } else if (command.has_allocate()) {
      pending_allocations_[command.seq()] = {command.device(), command.allocate().nbytes()};
    } else if (command.has_free()) {
      freed.emplace_back(command.device(), command.free().addr());
    }
    // Runs here, under mu_ (the analysis does not see into lambdas).
    const auto canonical = [&](int device, uint64_t& addr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const Segment* segment = Find(device, addr);
      if (segment == nullptr) return;
      auto [it, inserted] = ordinal.try_emplace(segment, named.size());
      if (inserted) named.push_back(segment);
      addr = CanonicalSegmentAddress(it->second, addr - segment->addr);
    };
    ForEachDeviceAddress(command, canonical);
  }

  v1::ClientMessage out;
  v1::CommandBatch& rewritten = *out.mutable_batch();
  uint64_t seq = 0;
  for (const Segment* segment : named) {
    v1::Command& allocate = *rewritten.add_commands();
    allocate.set_seq(++seq);
    allocate.set_device(segment->device);
    allocate.mutable_allocate()->set_nbytes(segment->nbytes);
  }
  for (uint32_t op : earlier_ops) {
    v1::Command& registration = *rewritten.add_commands();
    registration.set_seq(++seq);
    *registration.mutable_register_op() = ops_.at(op);
  }
  for (v1::Command& command : commands) {
    command.set_seq(++seq);
    *rewritten.add_commands() = std::move(command);
  }
  for (const auto& key : freed) segments_.erase(key);
  return out;
}

void MessageRecorder::Write(const v1::ClientMessage& message) {
  if (write_failed_) return;
  const std::string path = absl::StrCat(dir_, "/s", session_id_, "-m", ++files_, ".pb");
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (file && message.SerializeToOstream(&file) && file.flush()) return;
  write_failed_ = true;
  LogWarning(absl::StrCat("--record-client-messages: cannot write ", path, "; session ",
                          session_id_, " is not recorded further (is ", dir_,
                          " a writable directory?)"));
}

}  // namespace flagos::daemon
