// A rank between daemons whose collectives run through the devices'
// collective library (rank_between_daemons.h, RunThroughLibrary): joining
// the library's communicator across the daemons, and waiting for a part on
// the device with the group's timeout.
// (ATen TU: compiled in the collectives' unity group, so its names in the
// anonymous namespace differ from rank_between_daemons.cc's.)
#include <ATen/ATen.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collectives/rank_between_daemons.h"

namespace flagos::daemon {
namespace {

// This daemon, among the group's: random, made once per process.
int64_t DaemonToken() {
  static const int64_t token = [] {
    std::random_device rd;
    return static_cast<int64_t>((static_cast<uint64_t>(rd()) << 32 | rd()) >> 1);
  }();
  return token;
}

constexpr char kLibraryIdKey[] = "library/id";  // in the group's notes: "I" + id, or "E" + why

// How often a part's completion is polled, and how long an aborted part
// may take to give up.
constexpr auto kLibraryPoll = std::chrono::microseconds(200);
constexpr auto kLibraryAbortGrace = std::chrono::seconds(10);

}  // namespace

CollectiveRank& RankBetweenDaemons::LibraryRank(DeviceCollectives& library, int device,
                                                std::chrono::milliseconds timeout) {
  if (library_rank_ != nullptr) {
    TORCH_CHECK(library_device_ == device, "rank ", rank_, " joined ", library.description(),
                " on flagos:", library_device_, " and now calls a collective on flagos:", device,
                ": a rank keeps one device for the life of its process group");
    return *library_rank_;
  }
  // One rank per device: the ranks tell each other their daemon and device
  // (one small gloo allgather), and all refuse alike.
  at::Tensor mine = at::tensor({DaemonToken(), static_cast<int64_t>(device)}, at::kLong);
  at::Tensor all = at::empty({nranks_ * 2}, at::kLong);
  c10d::AllgatherOptions gather;
  gather.timeout = timeout;
  group_->_allgather_base(all, mine, gather)->wait();
  const int64_t* v = all.const_data_ptr<int64_t>();
  for (int i = 0; i < nranks_; ++i) {
    for (int j = i + 1; j < nranks_; ++j) {
      TORCH_CHECK(v[2 * i] != v[2 * j] || v[2 * i + 1] != v[2 * j + 1], "ranks ", i, " and ", j,
                  " are both on flagos:", v[2 * i + 1], " of one daemon, and ",
                  library.description(), " runs one rank per device: give each rank its own "
                  "device (torch.flagos.set_device(LOCAL_RANK))");
    }
  }
  // The communicator's id: rank 0's daemon makes it, the others read it.
  std::string id;
  if (rank_ == 0) {
    absl::StatusOr<std::string> made = library.NewUniqueId();
    const std::string note = made.ok() ? absl::StrCat("I", *made)
                                       : absl::StrCat("E", made.status().message());
    notes_->set(kLibraryIdKey, std::vector<uint8_t>(note.begin(), note.end()));
    TORCH_CHECK(made.ok(), "rank 0's daemon could not make a communicator id: ",
                made.status().message());
    id = *made;
  } else {
    notes_->wait({kLibraryIdKey}, timeout);
    const std::vector<uint8_t> note = notes_->get(kLibraryIdKey);
    TORCH_CHECK(!note.empty() && note[0] == 'I', "rank 0's daemon could not make a communicator "
                "id: ", std::string(note.begin() + (note.empty() ? 0 : 1), note.end()));
    id.assign(note.begin() + 1, note.end());
  }
  absl::StatusOr<std::unique_ptr<CollectiveRank>> joined =
      library.InitRank(device, id, rank_, nranks_);
  TORCH_CHECK(joined.ok(), "rank ", rank_, " could not join ", library.description(), ": ",
              joined.status().message());
  library_rank_ = *std::move(joined);
  library_device_ = device;
  return *library_rank_;
}

void RankBetweenDaemons::RunThroughLibrary(
    const std::string& signature, double timeout_s, DeviceCollectives& library, int device,
    const std::function<absl::Status(CollectiveRank&)>& issue,
    const std::function<absl::StatusOr<bool>()>& done) {
  RunBody(
      signature, timeout_s,
      [&](std::chrono::milliseconds timeout) {
        CollectiveRank& part = LibraryRank(library, device, timeout);
        const absl::Status issued = issue(part);
        TORCH_CHECK(issued.ok(), issued.message());
        // The part completes on the device once every rank's part ran; past
        // the group's timeout it is aborted (it returns writing nothing).
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        bool aborted = false;
        while (true) {
          absl::StatusOr<bool> complete = done();
          TORCH_CHECK(complete.ok(), "the device reported: ", complete.status().message());
          if (*complete) break;
          const auto now = std::chrono::steady_clock::now();
          if (!aborted && now >= deadline) {
            part.Abort();
            aborted = true;
          }
          TORCH_CHECK(!aborted || now < deadline + kLibraryAbortGrace, "its part did not give up within ",
                      std::chrono::duration_cast<std::chrono::seconds>(kLibraryAbortGrace).count(),
                      " s of being aborted");
          std::this_thread::sleep_for(kLibraryPoll);
        }
        TORCH_CHECK(!aborted, "its part did not complete within the group's timeout (",
                    timeout.count(), " ms): a peer did not issue its part; the communicator "
                    "was aborted");
      },
      Check::kSameCall, nullptr, absl::StrCat(library.description(), " between the daemons"));
}

}  // namespace flagos::daemon
