#include "op_host_budget.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
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

// A charged allocation: the wrapped allocator's DataPtr and whom to
// uncharge when it is freed.
struct ChargedAllocation {
  c10::DataPtr memory;
  OpHostBudget::Account* account;
  uint64_t nbytes;
};

void FreeCharged(void* context) {
  auto* allocation = static_cast<ChargedAllocation*>(context);
  OpHostBudget::Account* account = allocation->account;
  account->charged.fetch_sub(allocation->nbytes, std::memory_order_relaxed);
  delete allocation;  // frees the memory through the wrapped allocator
  account->Unref();
}

// c10's CPU allocator while flagosd runs: the one it replaced, charging
// allocations made under a budget.
class BudgetingCpuAllocator final : public c10::Allocator {
 public:
  explicit BudgetingCpuAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}

  c10::DataPtr allocate(size_t nbytes) override {
    OpHostBudget* budget = current_budget;
    if (budget == nullptr || nbytes == 0) return wrapped_->allocate(nbytes);
    OpHostBudget::Account* account = budget->account();
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
    c10::DataPtr memory;
    try {
      memory = wrapped_->allocate(nbytes);
    } catch (...) {
      account->charged.fetch_sub(nbytes, std::memory_order_relaxed);
      throw;
    }
    void* data = memory.get();
    const c10::Device device = memory.device();
    account->references.fetch_add(1, std::memory_order_relaxed);
    auto* allocation = new ChargedAllocation{std::move(memory), account, nbytes};
    return c10::DataPtr(data, allocation, &FreeCharged, device);
  }

  // Uncharged allocations are the wrapped allocator's own, so its raw
  // interface stays usable outside a budget. (Under a budget
  // raw_allocate's check that context and data agree fails: an error, not
  // a leak.)
  c10::DeleterFnPtr raw_deleter() const override { return wrapped_->raw_deleter(); }

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
