// CapturedGraphs: a session's captured graphs (daemon/sessions/captured_graphs.h):
// what a graph may hold, parts, completeness, bounds, and the random ops
// drawn relative to a replay.
#include "sessions/captured_graphs.h"

#include <gtest/gtest.h>

#include <string>

namespace flagos::daemon {
namespace {

v1::Command Op(int device, bool random = false) {
  v1::Command c;
  c.set_device(device);
  c.mutable_op()->set_op_id(7);
  c.mutable_op()->add_args()->set_i(1);
  if (random) {
    v1::GeneratorValue* g = c.mutable_op()->add_args()->mutable_generator();
    g->set_offset(3);
    g->set_replay_relative(true);
  }
  return c;
}

v1::DefineGraph Part(uint64_t id, std::initializer_list<v1::Command> commands, bool last) {
  v1::DefineGraph part;
  part.set_graph(id);
  for (const v1::Command& c : commands) *part.add_commands() = c;
  part.set_last(last);
  return part;
}

absl::Status Ok(const v1::Command&, size_t) { return absl::OkStatus(); }

TEST(CapturedGraphsTest, PartsAppendUntilTheLastAndOnlyThenTheGraphReplays) {
  CapturedGraphs graphs;
  v1::DefineGraph first = Part(5, {Op(0), Op(0, true)}, false);
  ASSERT_TRUE(graphs.Define(0, first, Ok).ok());
  EXPECT_EQ(graphs.Get(5).status().code(), absl::StatusCode::kNotFound);
  v1::DefineGraph second = Part(5, {Op(0), Op(0, true)}, true);
  ASSERT_TRUE(graphs.Define(0, second, Ok).ok());
  auto graph = graphs.Get(5);
  ASSERT_TRUE(graph.ok());
  EXPECT_EQ((*graph)->commands.size(), 4u);
  EXPECT_EQ((*graph)->random_ops, (std::vector<uint32_t>{1, 3}));
  v1::DefineGraph more = Part(5, {Op(0)}, true);
  EXPECT_EQ(graphs.Define(0, more, Ok).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(graphs.Destroy(5).ok());
  EXPECT_EQ(graphs.Destroy(5).code(), absl::StatusCode::kNotFound);
  // A graph Get returned outlives its Destroy.
  EXPECT_EQ((*graph)->commands.size(), 4u);
}

TEST(CapturedGraphsTest, ACommandAGraphCannotHoldDropsTheWholeGraph) {
  CapturedGraphs graphs;
  v1::Command sync;
  sync.set_device(0);
  sync.mutable_copy_from_device()->set_nbytes(4);
  v1::Command wants;
  wants = Op(0);
  wants.mutable_op()->set_want_values(true);
  v1::Command cross;
  cross.set_device(0);
  cross.mutable_copy_device_to_device()->set_src_device(1);
  for (const v1::Command& bad : {sync, wants, cross, Op(1)}) {
    v1::DefineGraph part = Part(9, {Op(0), bad}, true);
    const absl::Status s = graphs.Define(0, part, Ok);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find("graph 9: the graph's command"), std::string::npos) << s;
    EXPECT_EQ(graphs.Get(9).status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(graphs.Destroy(9).code(), absl::StatusCode::kNotFound);  // dropped, not left half
  }
  v1::DefineGraph zero = Part(0, {Op(0)}, true);
  EXPECT_EQ(graphs.Define(0, zero, Ok).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CapturedGraphsTest, TheCheckSeesEveryCommandWithItsIndexAndItsRefusalDropsTheGraph) {
  CapturedGraphs graphs;
  std::vector<size_t> seen;
  v1::DefineGraph part = Part(3, {Op(0), Op(0), Op(0)}, true);
  const absl::Status s = graphs.Define(0, part, [&](const v1::Command&, size_t i) {
    seen.push_back(i);
    return i == 2 ? absl::InvalidArgumentError("outside the segments") : absl::OkStatus();
  });
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("outside the segments"), std::string::npos);
  EXPECT_EQ(graphs.Get(3).status().code(), absl::StatusCode::kNotFound);
}

TEST(CapturedGraphsTest, AGraphStaysOnItsDeviceAndTheBoundsHold) {
  CapturedGraphs graphs;
  v1::DefineGraph first = Part(1, {Op(0)}, false);
  ASSERT_TRUE(graphs.Define(0, first, Ok).ok());
  v1::DefineGraph other = Part(1, {Op(1)}, true);
  EXPECT_EQ(graphs.Define(1, other, Ok).code(), absl::StatusCode::kFailedPrecondition);
  for (uint64_t id = 1; id <= kMaxGraphsPerSession; ++id) {
    v1::DefineGraph empty = Part(id, {}, true);
    ASSERT_TRUE(graphs.Define(0, empty, Ok).ok()) << id;
  }
  v1::DefineGraph one_more = Part(kMaxGraphsPerSession + 1, {}, true);
  EXPECT_EQ(graphs.Define(0, one_more, Ok).code(), absl::StatusCode::kResourceExhausted);
  graphs.Clear();
  EXPECT_TRUE(graphs.Define(0, one_more, Ok).ok());
}

TEST(CapturedGraphsTest, DrawFromSetsOnlyTheRelativeGeneratorsToTheReplaysState) {
  v1::OpCall call = Op(0, true).op();
  v1::GeneratorValue* fixed = call.add_args()->mutable_generator();
  fixed->set_seed(11);
  fixed->set_offset(4);
  call.mutable_implicit_generator()->set_offset(2);
  call.mutable_implicit_generator()->set_replay_relative(true);
  v1::GeneratorValue rng;
  rng.set_seed(99);
  rng.set_offset(1000);
  DrawFrom(rng, &call);
  EXPECT_EQ(call.args(1).generator().seed(), 99u);
  EXPECT_EQ(call.args(1).generator().offset(), 1003u);
  EXPECT_FALSE(call.args(1).generator().replay_relative());
  EXPECT_EQ(call.args(2).generator().seed(), 11u);
  EXPECT_EQ(call.args(2).generator().offset(), 4u);
  EXPECT_EQ(call.implicit_generator().seed(), 99u);
  EXPECT_EQ(call.implicit_generator().offset(), 1002u);
}

}  // namespace
}  // namespace flagos::daemon
