// The BKCL functions (Kunlun's collective library, libbkcl.so, header
// xpu/bkcl.h) the kunlunxin backend loads at run time, as an X-macro table
// like xpurt_symbols.h, with the call shapes public code shows
// (shared/reference/kunlunxin-xpu-runtime.md, "Collective library BKCL":
// PaddlePaddle's process_group_bkcl.cc and bkcl_comm_context.cc, FlagCX's
// kunlunxin adaptor). Every function is extern "C" and returns
// BKCLResult_t (an enum: int to the ABI).
//
// From public sources: the names, the argument order (rank before nranks in
// bkcl_init_rank; the count before the receive buffer in bkcl_all_gather
// and bkcl_all_to_all; the peer before the dtype in bkcl_send/bkcl_recv) and
// the enumerator names. ASSUMED, not found in any public source we have:
// the enumerators' numeric values (taken in the order the names are listed
// publicly, from 0) and BKCL_UNIQUE_ID_BYTES (the opaque id's size; 512).
// docs/vendors/kunlunxin/runtime-api-map.md lists them as assumed until
// someone compares them with a node's xpu/bkcl.h.
//
// BKCL_REQUIRED(name, params): BKCL is not used without it.
// BKCL_OPTIONAL(name, params): used when present (the collectives that need
// it take the daemon's host route otherwise).
//
// XPUStream is void*; BKCLContext_t is an opaque pointer; BKCLDataType and
// BKCLOp are int. Shared with tests/fakes/bkcl, the test-only fake, so both
// sides agree on every prototype.
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_BKCL_SYMBOLS_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_BKCL_SYMBOLS_H_

#include <cstddef>

namespace flagos::kunlunxin::bkcl {

// ASSUMED size of BKCLUniqueId (see above).
inline constexpr size_t kUniqueIdBytes = 512;
struct UniqueId {
  char internal[kUniqueIdBytes];
};
using Context = struct BkclContextOpaque*;

// BKCLResult_t (ASSUMED values).
enum Result : int {
  kSuccess = 0,
  kInvalidArgument = 1,
  kRuntimeError = 2,
  kSystemError = 3,
  kInternalError = 4,
};
// BKCLDataType (ASSUMED values).
enum DataType : int {
  kUint8 = 0,
  kInt32 = 1,
  kInt64 = 2,
  kFloat16 = 3,
  kBfloat16 = 4,
  kFloat = 5,
  kFloat64 = 6,
};
// BKCLOp (ASSUMED values).
enum Op : int {
  kAdd = 0,
  kProduct = 1,
  kMax = 2,
  kMin = 3,
};

}  // namespace flagos::kunlunxin::bkcl

// clang-format off
#define FLAGOS_BKCL_SYMBOLS(BKCL_REQUIRED, BKCL_OPTIONAL)                                        \
  BKCL_REQUIRED(bkcl_get_unique_id, (flagos::kunlunxin::bkcl::UniqueId* id))                     \
  BKCL_REQUIRED(bkcl_init_rank, (flagos::kunlunxin::bkcl::Context* ctx, int rank, int nranks,    \
                                 flagos::kunlunxin::bkcl::UniqueId* id))                         \
  BKCL_REQUIRED(bkcl_destroy_context, (flagos::kunlunxin::bkcl::Context ctx))                    \
  BKCL_REQUIRED(bkcl_all_reduce, (flagos::kunlunxin::bkcl::Context ctx, const void* send,        \
                                  void* recv, size_t count, int dtype, int op, void* stream))    \
  BKCL_REQUIRED(bkcl_broadcast, (flagos::kunlunxin::bkcl::Context ctx, const void* send,         \
                                 void* recv, size_t count, int dtype, int root, void* stream))   \
  BKCL_REQUIRED(bkcl_all_gather, (flagos::kunlunxin::bkcl::Context ctx, const void* send,        \
                                  size_t send_count, void* recv, int dtype, void* stream))       \
  BKCL_REQUIRED(bkcl_reduce_scatter, (flagos::kunlunxin::bkcl::Context ctx, const void* send,    \
                                      void* recv, size_t recv_count, int dtype, int op,          \
                                      void* stream))                                             \
  BKCL_OPTIONAL(bkcl_comm_abort, (flagos::kunlunxin::bkcl::Context ctx))                         \
  BKCL_OPTIONAL(bkcl_all_to_all, (flagos::kunlunxin::bkcl::Context ctx, const void* send,        \
                                  size_t count, void* recv, int dtype, void* stream))            \
  BKCL_OPTIONAL(bkcl_send, (flagos::kunlunxin::bkcl::Context ctx, const void* buf, size_t count, \
                            int peer, int dtype, void* stream))                                  \
  BKCL_OPTIONAL(bkcl_recv, (flagos::kunlunxin::bkcl::Context ctx, void* buf, size_t count,       \
                            int peer, int dtype, void* stream))                                  \
  BKCL_OPTIONAL(bkcl_group_start, ())                                                            \
  BKCL_OPTIONAL(bkcl_group_end, ())
// clang-format on

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_BKCL_SYMBOLS_H_
