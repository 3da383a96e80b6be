#include "ops/op_host_budget.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <utility>

namespace flagos::daemon {

// What a budget's charged allocations share with it: they may outlive the
// budget (a result the session holds), so it is reference-counted (the
// budget holds one reference, each charged allocation one).
struct OpHostBudget::Account {
  std::atomic<uint64_t> charged{0};
  std::atomic<uint64_t> references{1};

  void Unref() {
    if (references.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
};

namespace {

// The budget charged on this thread, if any.
thread_local OpHostBudget* current_budget = nullptr;

// Above c10's own CPU allocators (priority 0), so that it stays installed.
constexpr uint8_t kAllocatorPriority = 100;

// Every allocation of the allocator starts with this header, kHeaderBytes
// before the data (which keeps the wrapped allocator's alignment): the
// wrapped allocator's pointer and deleter, and whom to uncharge. The data
// pointer is also the DataPtr's context, so ATen's raw interface
// (raw_allocate / raw_deallocate, which oneDNN's scratch space uses) works
// under a budget and outside one alike.
struct Header {
  void* wrapped_context;
  c10::DeleterFnPtr wrapped_deleter;
  OpHostBudget::Account* account;  // nullptr: not charged
  uint64_t nbytes;
};
constexpr size_t kHeaderBytes = 64;  // c10's CPU alignment (gAlignment)
static_assert(sizeof(Header) <= kHeaderBytes);

Header* HeaderOf(void* data) {
  return reinterpret_cast<Header*>(static_cast<char*>(data) - kHeaderBytes);
}

void Free(void* data) {
  if (data == nullptr) return;
  const Header header = *HeaderOf(data);
  if (header.wrapped_deleter != nullptr) header.wrapped_deleter(header.wrapped_context);
  if (header.account != nullptr) {
    header.account->charged.fetch_sub(header.nbytes, std::memory_order_relaxed);
    header.account->Unref();
  }
}

// c10's CPU allocator while flagosd runs: the one it replaced, charging
// allocations made under a budget.
class BudgetingCpuAllocator final : public c10::Allocator {
 public:
  explicit BudgetingCpuAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}

  c10::DataPtr allocate(size_t nbytes) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (nbytes == 0) return c10::DataPtr(nullptr, nullptr, &Free, cpu);
    OpHostBudget::Account* account = nullptr;
    if (OpHostBudget* budget = current_budget) {
      account = budget->account();
      const uint64_t limit = budget->limit_bytes();
      const uint64_t charged = account->charged.load(std::memory_order_relaxed);
      if (nbytes > limit || charged > limit - nbytes) {
        budget->RecordRefusal(nbytes, charged);
        TORCH_CHECK_WITH(OutOfMemoryError, false, "flagosd: the kernel asked for ", nbytes,
                         " bytes of host memory while holding ", charged,
                         "; an op's kernel may hold at most ", limit,
                         " bytes (--max-op-host-memory)");
      }
      account->charged.fetch_add(nbytes, std::memory_order_relaxed);
    }
    c10::DataPtr memory;
    try {
      TORCH_CHECK_WITH(OutOfMemoryError, nbytes <= SIZE_MAX - kHeaderBytes,
                       "flagosd: an allocation of ", nbytes, " bytes does not fit the host");
      memory = wrapped_->allocate(nbytes + kHeaderBytes);
    } catch (...) {
      if (account != nullptr) account->charged.fetch_sub(nbytes, std::memory_order_relaxed);
      throw;
    }
    char* base = static_cast<char*>(memory.get());
    const c10::DeleterFnPtr wrapped_deleter = memory.get_deleter();
    void* wrapped_context = memory.release_context();
    if (account != nullptr) account->references.fetch_add(1, std::memory_order_relaxed);
    *reinterpret_cast<Header*>(base) = Header{wrapped_context, wrapped_deleter, account, nbytes};
    void* data = base + kHeaderBytes;
    return c10::DataPtr(data, data, &Free, cpu);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Free; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    wrapped_->copy_data(dest, src, count);
  }

 private:
  c10::Allocator* const wrapped_;
};

}  // namespace

bool InstallOpHostBudgetAllocator() {
  static BudgetingCpuAllocator* const allocator = [] {
    auto* installed = new BudgetingCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(installed, kAllocatorPriority);
    return installed;
  }();
  return c10::GetCPUAllocator() == allocator;
}

namespace {
// Installed before main(), as c10 registers its own CPU allocator: what the
// raw interface hands out must go back to the allocator that made it, so
// none may come from the replaced allocator before any op ran and be freed
// through this one (oneDNN keeps scratch space across calls).
[[maybe_unused]] const bool installed_at_start = InstallOpHostBudgetAllocator();
}  // namespace

OpHostBudget::OpHostBudget(uint64_t limit_bytes)
    : limit_(limit_bytes), previous_(current_budget) {
  current_budget = this;
}

OpHostBudget::~OpHostBudget() {
  current_budget = previous_;
  if (account_ != nullptr) account_->Unref();
}

uint64_t OpHostBudget::charged_bytes() const {
  return account_ == nullptr ? 0 : account_->charged.load(std::memory_order_relaxed);
}

OpHostBudget::Account* OpHostBudget::account() {
  if (account_ == nullptr) account_ = new Account();
  return account_;
}

void OpHostBudget::RecordRefusal(uint64_t nbytes, uint64_t charged) {
  if (refused_bytes_ > 0) return;
  refused_bytes_ = nbytes;
  charged_when_refused_ = charged;
}

}  // namespace flagos::daemon
