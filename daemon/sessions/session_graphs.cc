// Session: captured graphs (captured_graphs.h): defined once, with every
// address they name checked against the session's memory then; a replay
// is one queued task on the replaying stream that runs the graph's
// commands in order.
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "collectives/communicators.h"
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
  (*state)->window->Count((*graph)->commands.size());
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
    const CollectiveCaller caller(id_, pid_);  // for prepared flagos_c10d kernels
    // memory_mu_ is held: no segment goes away during the replay.
    const uint64_t removals = MemoryRemovals();
    const std::shared_ptr<const PreparedCalls> prepared = graph.prepared();
    // The prepared calls name memory whose ranges were checked when no more
    // segments had been removed than now; else every command runs as sent,
    // its ranges checked, and the next replay runs prepared again.
    const bool run_prepared =
        prepared != nullptr && graph.ranges_checked_at.load(std::memory_order_acquire) == removals;
    PreparedCalls preparing(prepared == nullptr ? graph.commands.size() : 0);
    // Prepared calls are timed by runs of them, for the metrics.
    DeviceMetrics* const metrics = MetricsFor(graph.device);
    std::optional<std::chrono::steady_clock::time_point> run_start;
    uint64_t prepared_ops = 0;
    double prepared_seconds = 0;
    const auto end_run = [&] {
      if (!run_start.has_value()) return;
      prepared_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - *run_start).count();
      run_start.reset();
    };
    absl::Cleanup count = [&] {
      end_run();
      if (metrics != nullptr) metrics->CountPreparedOps(prepared_ops, prepared_seconds);
    };
    size_t next_random = 0;
    v1::Command drawn;
    for (; i < graph.commands.size(); ++i) {
      // Op, memset and copy_device_to_device only read their command, so
      // replays of one graph on several streams share it.
      v1::Command* command = const_cast<v1::Command*>(&graph.commands[i]);
      const bool random =
          next_random < graph.random_ops.size() && graph.random_ops[next_random] == i;
      if (random) {
        drawn = *command;
        DrawFrom(rng, drawn.mutable_op());
        command = &drawn;
        ++next_random;
      } else if (run_prepared && (*prepared)[i] != nullptr) {
        if (metrics != nullptr && !run_start.has_value()) {
          run_start = std::chrono::steady_clock::now();
        }
        absl::StatusOr<bool> ran = ops_->RunPrepared(*(*prepared)[i], backend_stream);
        if (ran.ok() && *ran) {
          ++prepared_ops;
          continue;
        }
        end_run();
        if (!ran.ok()) {
          if (metrics != nullptr) metrics->CountOp(OpRoute::kNative, 0, /*ok=*/false);
          return ran.status();
        }
        // Not runnable prepared: as sent, below.
      }
      end_run();
      v1::Completion unused;
      bool reply = false;
      std::shared_ptr<const PreparedOpCall>* prepare =
          !preparing.empty() && !random && command->has_op() ? &preparing[i] : nullptr;
      if (absl::Status s = ExecuteLocked(*command, backend_stream, &unused, &reply, prepare);
          !s.ok()) {
        return s;
      }
    }
    if (!preparing.empty()) {
      graph.set_prepared(std::make_shared<const PreparedCalls>(std::move(preparing)));
    }
    graph.ranges_checked_at.store(removals, std::memory_order_release);
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
