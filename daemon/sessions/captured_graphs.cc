#include "sessions/captured_graphs.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "protocol/command_validation.h"

namespace flagos::daemon {
namespace {

// Whether `call` draws from a replay_relative generator.
bool DrawsRelative(const v1::OpCall& call) {
  if (call.has_implicit_generator() && call.implicit_generator().replay_relative()) return true;
  for (const v1::Value& arg : call.args()) {
    if (arg.has_generator() && arg.generator().replay_relative()) return true;
  }
  return false;
}

void Draw(const v1::GeneratorValue& rng, v1::GeneratorValue* g) {
  if (!g->replay_relative()) return;
  g->set_seed(rng.seed());
  g->set_offset(rng.offset() + g->offset());
  g->set_replay_relative(false);
}

// OK when a graph on `device` can hold `command`.
absl::Status CheckCapturable(const v1::Command& command, int device, size_t index) {
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("the graph's command ", index, " (",
                                                   CommandKindName(command), ") ", why));
  };
  if (command.device() != device) {
    return refuse(absl::StrCat("is on flagos:", command.device(), ", the graph on flagos:", device,
                               ": a graph runs on one device"));
  }
  switch (command.kind_case()) {
    case v1::Command::kOp:
      if (command.op().want_values() || command.op().hold_results()) {
        return refuse("waits for its results on the host, which a graph cannot");
      }
      return absl::OkStatus();
    case v1::Command::kMemset:
      return absl::OkStatus();
    case v1::Command::kCopyDeviceToDevice:
      if (command.copy_device_to_device().src_device() != device) {
        return refuse("copies from another device, which a graph cannot");
      }
      return absl::OkStatus();
    default:
      return refuse(
          "is not one a graph holds (op, memset, copy_device_to_device within the device)");
  }
}

}  // namespace

void DrawFrom(const v1::GeneratorValue& rng, v1::OpCall* call) {
  if (call->has_implicit_generator()) Draw(rng, call->mutable_implicit_generator());
  for (v1::Value& arg : *call->mutable_args()) {
    if (arg.has_generator()) Draw(rng, arg.mutable_generator());
  }
}

absl::Status CapturedGraphs::Define(int device, v1::DefineGraph& part, CommandCheck check) {
  const uint64_t id = part.graph();
  if (id == 0) return absl::InvalidArgumentError("define_graph: graph id 0 is not valid (ids are > 0)");
  absl::MutexLock lock(&mu_);
  auto it = graphs_.find(id);
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphsPerSession) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "define_graph: the session holds ", graphs_.size(), " graphs, the most it may (",
          kMaxGraphsPerSession, "); reset graphs no longer replayed (Graph.reset())"));
    }
    Entry entry;
    entry.graph = std::make_shared<CapturedGraph>();
    entry.graph->device = device;
    it = graphs_.emplace(id, std::move(entry)).first;
  } else if (it->second.complete) {
    return absl::FailedPreconditionError(absl::StrCat(
        "define_graph: graph ", id, " is complete already; reset it before capturing it again"));
  } else if (it->second.graph->device != device) {
    const int other = it->second.graph->device;
    DropLocked(id);
    return absl::FailedPreconditionError(absl::StrCat("define_graph: graph ", id, " is on flagos:",
                                                      other, ", this part on flagos:", device));
  }
  CapturedGraph& graph = *it->second.graph;
  const size_t incoming = static_cast<size_t>(part.commands_size());
  const size_t incoming_bytes = part.ByteSizeLong();
  if (commands_ + incoming > kMaxGraphCommandsPerSession ||
      bytes_ + incoming_bytes > kMaxGraphBytesPerSession) {
    DropLocked(id);
    return absl::ResourceExhaustedError(absl::StrCat(
        "define_graph: graph ", id, " would take the session's graphs past ",
        kMaxGraphCommandsPerSession, " commands or ", kMaxGraphBytesPerSession,
        " bytes; capture less per graph, or reset graphs no longer replayed"));
  }
  graph.commands.reserve(graph.commands.size() + incoming);
  for (v1::Command& command : *part.mutable_commands()) {
    const size_t index = graph.commands.size();
    absl::Status s = CheckCapturable(command, device, index);
    if (s.ok()) s = check(command, index);
    if (!s.ok()) {
      DropLocked(id);
      return absl::Status(s.code(), absl::StrCat("define_graph: graph ", id, ": ", s.message()));
    }
    if (command.has_op() && DrawsRelative(command.op())) {
      graph.random_ops.push_back(static_cast<uint32_t>(index));
    }
    graph.commands.push_back(std::move(command));
    ++commands_;
  }
  graph.bytes += incoming_bytes;
  bytes_ += incoming_bytes;
  if (part.last()) it->second.complete = true;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const CapturedGraph>> CapturedGraphs::Get(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = graphs_.find(id);
  if (it == graphs_.end() || !it->second.complete) {
    return absl::NotFoundError(absl::StrCat(
        "graph ", id, it == graphs_.end() ? " does not exist in this session"
                                          : " is still being defined (its last part has not come)",
        "; capture it (Graph.capture_begin/capture_end) before replaying it"));
  }
  return std::shared_ptr<const CapturedGraph>(it->second.graph);
}

absl::Status CapturedGraphs::Destroy(uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (!graphs_.contains(id)) {
    return absl::NotFoundError(absl::StrCat("graph ", id, " does not exist in this session"));
  }
  DropLocked(id);
  return absl::OkStatus();
}

void CapturedGraphs::Clear() {
  absl::MutexLock lock(&mu_);
  graphs_.clear();
  commands_ = 0;
  bytes_ = 0;
}

void CapturedGraphs::DropLocked(uint64_t id) {
  auto it = graphs_.find(id);
  commands_ -= it->second.graph->commands.size();
  bytes_ -= it->second.graph->bytes;
  graphs_.erase(it);
}

}  // namespace flagos::daemon
