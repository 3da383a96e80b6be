// Session: captured graphs (captured_graphs.h): defined once, with every
// address they name checked against the session's memory then; a replay
// is one queued task on the replaying stream that runs the graph's
// commands in order.
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "protocol/command_addresses.h"
#include "protocol/command_validation.h"
#include "sessions/session.h"

namespace flagos::daemon {

void Session::DefineGraph(v1::Command& command) {
  const uint64_t seq = command.seq();
  absl::Status status;
  {
    absl::ReaderMutexLock lock(&memory_mu_);
    status = graphs_.Define(
        command.device(), *command.mutable_define_graph(),
        [&](const v1::Command& captured, size_t index) {
          absl::Status s;
          // ForEachDeviceAddress may rewrite addresses; this one only reads.
          ForEachDeviceAddress(const_cast<v1::Command&>(captured), [&](int device, uint64_t& addr) {
            // 0: an undefined tensor or one of no elements (no memory). The
            // full ranges are checked when the ops decode them at replay.
            if (!s.ok() || addr == 0 || CheckRange(captured, device, addr, 1).ok()) return;
            s = absl::InvalidArgumentError(absl::StrCat(
                "the graph's command ", index, " (", CommandKindName(captured), ") names address 0x",
                absl::Hex(addr), " on flagos:", device,
                ", outside this session's segments: a graph names only memory the session holds"));
          });
          return s;
        });
  }
  if (!status.ok()) return ReplyError(seq, "define_graph", status);
  Reply(Done(seq));
}

void Session::ReplayGraph(const v1::Command& command) {
  const uint64_t seq = command.seq();
  const v1::ReplayGraph& replay = command.replay_graph();
  absl::StatusOr<std::shared_ptr<const CapturedGraph>> graph = graphs_.Get(replay.graph());
  if (!graph.ok()) return ReplyError(seq, "replay_graph", graph.status());
  if ((*graph)->device != command.device()) {
    return ReplyError(seq, "replay_graph",
                      absl::InvalidArgumentError(absl::StrCat(
                          "graph ", replay.graph(), " was captured on flagos:", (*graph)->device,
                          " and replays only there, not on flagos:", command.device())));
  }
  absl::StatusOr<SessionStream*> state = streams_.Get(command.device(), command.stream());
  if (!state.ok()) return ReplyError(seq, "replay_graph", state.status());
  const StreamHandle backend_stream = (*state)->backend_stream;
  (*state)->queue->Push([this, graph = *std::move(graph), seq, id = replay.graph(),
                         rng = replay.rng(), backend_stream]() {
    RunReplay(*graph, id, seq, rng, backend_stream);
  });
}

void Session::DestroyGraph(const v1::Command& command) {
  if (absl::Status s = graphs_.Destroy(command.destroy_graph().graph()); !s.ok()) {
    ReplyError(command.seq(), "destroy_graph", s);
  }
}

void Session::RunReplay(const CapturedGraph& graph, uint64_t id, uint64_t seq,
                        const v1::GeneratorValue& rng, StreamHandle backend_stream) {
  size_t i = 0;
  const std::optional<absl::Status> status = RunQueued([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    size_t next_random = 0;
    v1::Command drawn;
    for (; i < graph.commands.size(); ++i) {
      // Op, memset and copy_device_to_device only read their command, so
      // replays of one graph on several streams share it.
      v1::Command* command = const_cast<v1::Command*>(&graph.commands[i]);
      if (next_random < graph.random_ops.size() && graph.random_ops[next_random] == i) {
        drawn = *command;
        DrawFrom(rng, drawn.mutable_op());
        command = &drawn;
        ++next_random;
      }
      v1::Completion unused;
      bool reply = false;
      if (absl::Status s = ExecuteLocked(*command, backend_stream, &unused, &reply); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  });
  if (!status.has_value() || status->ok()) return;
  const v1::Command& failed = graph.commands[std::min(i, graph.commands.size() - 1)];
  ReplyError(seq, "replay_graph",
             absl::Status(status->code(),
                          absl::StrCat("graph ", id, ", its command ", i, " of ",
                                       graph.commands.size(), " (", CommandKindName(failed),
                                       "): ", status->message(),
                                       "; the rest of this replay did not run")));
}

}  // namespace flagos::daemon
