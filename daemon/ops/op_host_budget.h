// The host memory an op's kernel may take (--max-op-host-memory).
//
// flagosd installs, once and before main() (a static registration, as c10
// registers its own), a c10 CPU allocator that wraps the one ATen had
// (InstallOpHostBudgetAllocator). While an OpHostBudget is alive on a
// thread, every allocation that thread makes through the CPU allocator
// (ATen's host tensors: a kernel's results, temporaries, contiguous copies)
// is charged to it; one that would take the charged bytes beyond the
// budget's limit is refused with c10::OutOfMemoryError before anything is
// allocated, and the budget records it (refused()). Freeing charged memory
// uncharges it, from any thread. Memory that outlives the budget (a
// result the session holds) stays valid and is freed as usual.
//
// Not charged: allocations made outside a budget (decoding, segments,
// which the CPU backend maps itself, the cpu_fallback route's host copies
// of device memory), allocations made by other threads for the kernel
// (ATen's intra-op worker threads), and memory not allocated through the
// CPU allocator (malloc in a vendor library). Zero fill
// (caffe2_cpu_allocator_do_zero_fill) is the wrapped allocator's, so fresh
// memory is cleared as before. Every allocation, charged or not, carries a
// 64-byte header before its data (whom to uncharge, how to free it), so
// that its data pointer is its context and ATen's raw interface
// (raw_allocate / raw_deallocate: oneDNN's scratch space) works under a
// budget too.
//
// This header does not include c10; op_host_budget.cc does.
//
// Thread safety: InstallOpHostBudgetAllocator may be called from any
// thread, any number of times. An OpHostBudget is used by the thread that
// made it; budgets on several threads are independent, and one may be
// nested in another on a thread (the inner one is charged).
#ifndef FLAGOS_DAEMON_OPS_OP_HOST_BUDGET_H_
#define FLAGOS_DAEMON_OPS_OP_HOST_BUDGET_H_

#include <cstdint>

namespace flagos::daemon {

// Makes the budgeting allocator c10's CPU allocator (the first call, made
// before main(); later calls do nothing). False if another allocator of
// higher priority is installed, so that budgets are not enforced.
bool InstallOpHostBudgetAllocator();

class OpHostBudget {
 public:
  // Charges this thread's CPU allocations to a budget of `limit_bytes`
  // until destroyed.
  explicit OpHostBudget(uint64_t limit_bytes);
  ~OpHostBudget();
  OpHostBudget(const OpHostBudget&) = delete;
  OpHostBudget& operator=(const OpHostBudget&) = delete;

  uint64_t limit_bytes() const { return limit_; }
  // Bytes charged and not yet freed.
  uint64_t charged_bytes() const;
  // Whether an allocation was refused; if so, the first one's size and
  // what was charged when it was asked for.
  bool refused() const { return refused_bytes_ > 0; }
  uint64_t refused_bytes() const { return refused_bytes_; }
  uint64_t charged_when_refused() const { return charged_when_refused_; }

  // For the allocator (op_host_budget.cc).
  struct Account;
  Account* account();  // made on the first charged allocation
  void RecordRefusal(uint64_t nbytes, uint64_t charged);

 private:
  const uint64_t limit_;
  OpHostBudget* const previous_;
  Account* account_ = nullptr;
  uint64_t refused_bytes_ = 0;
  uint64_t charged_when_refused_ = 0;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_OP_HOST_BUDGET_H_
