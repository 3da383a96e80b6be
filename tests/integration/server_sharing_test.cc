// Shared segments between sessions: export, import, release and query, a segment living
// until its last holder lets go, and the sharing policy by user.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "server_fixture.h"

namespace flagos::daemon {
namespace {

// ------------------------------------------------------- shared segments

v1::Command ExportMemory(uint64_t addr, int device = 0) {
  v1::Command command;
  command.set_device(device);
  command.mutable_export_memory()->set_addr(addr);
  return command;
}

v1::Command ImportMemory(const std::string& grant, int device = 0) {
  v1::Command command;
  command.set_device(device);
  command.mutable_import_memory()->set_grant(grant);
  return command;
}

v1::Command ReleaseImport(uint64_t addr, int device = 0) {
  v1::Command command;
  command.set_device(device);
  command.mutable_release_import()->set_addr(addr);
  return command;
}

v1::Command QueryExport(uint64_t addr, int device = 0) {
  v1::Command command;
  command.set_device(device);
  command.mutable_query_export()->set_addr(addr);
  return command;
}

TEST_F(ServerTest, ASharedSegmentLivesUntilEveryHolderReleasedIt) {
  // Raw sessions attach no staging region, so flagosd knows no uid for
  // them: the user rule is tested with real processes (test_sharing.py).
  StartServer(MemoryGrants::Policy::kAnyUser);
  RawSession owner(stub_.get());
  owner.Open();
  const uint64_t seg = owner.AllocateOk(4096);
  const std::string marker = "written by the owner before the export";
  owner.Send({CopyTo(seg, marker)});
  v1::Completion exported = owner.Call(ExportMemory(seg + 100));
  ASSERT_EQ(exported.code(), 0) << exported.message();
  EXPECT_EQ(exported.grant().size(), 16u);
  EXPECT_EQ(exported.addr(), seg);
  EXPECT_EQ(exported.segment_nbytes(), 4096u);

  RawSession receiver(stub_.get());
  receiver.Open();
  v1::Completion imported = receiver.Call(ImportMemory(exported.grant()));
  ASSERT_EQ(imported.code(), 0) << imported.message();
  EXPECT_EQ(imported.addr(), seg);
  EXPECT_EQ(imported.segment_nbytes(), 4096u);
  // The same memory, both ways, no copy.
  EXPECT_EQ(receiver.Call(CopyFrom(seg, marker.size())).data(), marker);
  EXPECT_TRUE(receiver.RunAndSync({CopyTo(seg + 4000, "receiver")}).empty());
  EXPECT_EQ(owner.Call(CopyFrom(seg + 4000, 8)).data(), "receiver");
  // Beyond the segment is still out of reach.
  EXPECT_EQ(receiver.Call(CopyFrom(seg + 4090, 8)).code(), kInvalidArgument);

  v1::GetStatsResponse stats = Stats();
  EXPECT_EQ(stats.devices(0).used_memory(), 4096u);  // counted once, for the owner
  for (const v1::SessionInfo& info : stats.sessions()) {
    const bool is_receiver = info.imported_segments() == 1;
    EXPECT_EQ(info.imported_bytes(), is_receiver ? 4096u : 0u);
  }
  v1::Completion in_use = owner.Call(QueryExport(seg + 8));
  ASSERT_EQ(in_use.code(), 0) << in_use.message();
  EXPECT_FALSE(in_use.ready());

  // The owner frees it: the receiver's hold keeps the memory.
  EXPECT_TRUE(owner.RunAndSync({Free(seg)}).empty());
  EXPECT_EQ(owner.Call(CopyFrom(seg, 8)).code(), kInvalidArgument);
  EXPECT_EQ(receiver.Call(CopyFrom(seg, marker.size())).data(), marker);
  EXPECT_EQ(Stats().devices(0).used_memory(), 4096u);

  // A third session imports it too, then dies: its hold goes with it.
  {
    RawSession third(stub_.get());
    third.Open();
    ASSERT_EQ(third.Call(ImportMemory(exported.grant())).code(), 0);
    third.context().TryCancel();
    EXPECT_EQ(third.End().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The daemon sees the cancel a little later, then closes the session on a
  // closer thread; its hold goes when that close is done.
  StatsUntil([](const v1::GetStatsResponse& s) {
    return s.sessions_size() == 2 && s.closing_sessions_size() == 0;
  });
  EXPECT_EQ(receiver.Call(CopyFrom(seg, marker.size())).data(), marker);

  // The last release frees it; the grant dies with the memory.
  EXPECT_TRUE(receiver.RunAndSync({ReleaseImport(seg)}).empty());
  EXPECT_EQ(receiver.Call(CopyFrom(seg, 8)).code(), kInvalidArgument);
  EXPECT_EQ(Stats().devices(0).used_memory(), 0u);
  EXPECT_EQ(backend_->runtime().GetMemoryInfo(0)->free_bytes, kSessionMemory);
  v1::Completion late = receiver.Call(ImportMemory(exported.grant()));
  EXPECT_EQ(late.code(), kNotFound);
  EXPECT_TRUE(absl::StrContains(late.message(), "freed it or ended before this one received it"))
      << late.message();
  std::vector<v1::Completion> twice = receiver.RunAndSync({ReleaseImport(seg)});
  ASSERT_EQ(twice.size(), 1u);
  EXPECT_EQ(twice[0].code(), kNotFound);
  EXPECT_TRUE(absl::StrContains(twice[0].message(), "holds no imported segment")) << twice[0].message();
}

TEST_F(ServerTest, AnImporterThatDiesReleasesTheMemoryItHeldLast) {
  StartServer(MemoryGrants::Policy::kAnyUser);
  RawSession owner(stub_.get());
  owner.Open();
  const uint64_t seg = owner.AllocateOk(8 << 20, 1);
  v1::Completion exported = owner.Call(ExportMemory(seg, 1));
  ASSERT_EQ(exported.code(), 0) << exported.message();
  {
    RawSession receiver(stub_.get());
    receiver.Open();
    // The grant is for flagos:1.
    EXPECT_EQ(receiver.Call(ImportMemory(exported.grant(), 0)).code(), kInvalidArgument);
    ASSERT_EQ(receiver.Call(ImportMemory(exported.grant(), 1)).code(), 0);
    ASSERT_EQ(receiver.Call(ImportMemory(exported.grant(), 1)).code(), 0);
    EXPECT_TRUE(owner.RunAndSync({Free(seg, 1)}).empty());
    EXPECT_EQ(Stats().devices(1).used_memory(), 8u << 20);
    receiver.context().TryCancel();
    EXPECT_EQ(receiver.End().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The owner too may end: nothing is left.
  EXPECT_TRUE(owner.End().ok());
  v1::GetStatsResponse stats = StatsAfterSessionsEnd();
  EXPECT_EQ(stats.devices(1).used_memory(), 0u);
  EXPECT_EQ(backend_->runtime().GetMemoryInfo(1)->free_bytes, kSessionMemory);
}

TEST_F(ServerTest, SharingCommandsCheckWhatTheyName) {
  StartServer(MemoryGrants::Policy::kAnyUser);
  RawSession session(stub_.get());
  session.Open();
  const uint64_t seg = session.AllocateOk(64);
  v1::Completion outside = session.Call(ExportMemory(seg + 64));
  EXPECT_EQ(outside.code(), kNotFound);
  EXPECT_TRUE(absl::StrContains(outside.message(), "is in none of this session's segments"))
      << outside.message();
  v1::Completion unknown = session.Call(ImportMemory(std::string(16, 'x')));
  EXPECT_EQ(unknown.code(), kNotFound);
  EXPECT_EQ(session.Call(QueryExport(seg + 64)).code(), kNotFound);
  // Never exported: nobody else uses it.
  v1::Completion idle = session.Call(QueryExport(seg));
  EXPECT_EQ(idle.code(), 0);
  EXPECT_TRUE(idle.ready());
  // A session's own grant: it may hold its own segment twice.
  v1::Completion exported = session.Call(ExportMemory(seg));
  ASSERT_EQ(exported.code(), 0);
  EXPECT_FALSE(session.Call(QueryExport(seg)).ready());  // one export unclaimed
  ASSERT_EQ(session.Call(ImportMemory(exported.grant())).code(), 0);
  EXPECT_TRUE(session.RunAndSync({ReleaseImport(seg)}).empty());
  EXPECT_TRUE(session.Call(QueryExport(seg)).ready());
  EXPECT_TRUE(session.RunAndSync({Free(seg)}).empty());
  EXPECT_EQ(Stats().devices(0).used_memory(), 0u);
}

TEST_F(ServerTest, SharingNeedsTheSessionsUserByDefault) {
  // A unix-socket session's user is its connection's (the kernel's): it
  // may share. A TCP session has no user: it may not.
  ServerOptions options = DefaultServerOptions();
  options.listen.push_back("127.0.0.1:0");
  options.remote_access.insecure_tcp = true;
  Restart(DefaultBackendOptions(), options);
  RawSession session(stub_.get());
  session.Open();
  EXPECT_EQ(session.Call(ExportMemory(session.AllocateOk(64))).code(), 0);
  EXPECT_TRUE(session.End().ok());
  ASSERT_EQ(server_->endpoints().size(), 2u);
  std::unique_ptr<v1::Flagos::Stub> tcp = v1::Flagos::NewStub(
      grpc::CreateChannel(server_->endpoints()[1], grpc::InsecureChannelCredentials()));
  RawSession remote(tcp.get());
  remote.Open();
  v1::Completion refused = remote.Call(ExportMemory(remote.AllocateOk(64)));
  EXPECT_EQ(refused.code(), static_cast<int>(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_TRUE(absl::StrContains(refused.message(), "this session came over TCP"))
      << refused.message();
  // Its pid is the client's word, its user unknown.
  v1::GetStatsResponse stats = Stats();
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_FALSE(stats.sessions(0).credentials_from_kernel());
  EXPECT_EQ(stats.sessions(0).gid(), -1);
  EXPECT_EQ(stats.sessions(0).pid(), getpid());
  EXPECT_TRUE(remote.End().ok());
  StartServer(MemoryGrants::Policy::kOff);
  RawSession off(stub_.get());
  off.Open();
  v1::Completion disabled = off.Call(ExportMemory(off.AllocateOk(64)));
  EXPECT_EQ(disabled.code(), static_cast<int>(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_TRUE(absl::StrContains(disabled.message(), "--memory-sharing=off")) << disabled.message();
}

}  // namespace
}  // namespace flagos::daemon
