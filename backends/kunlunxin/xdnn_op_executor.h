// The kunlunxin backend's native route: an OpExecutor that runs operators
// through the xdnn binding module (xdnn_module_loader.h), on the op's
// stream, over device memory.
//
// Tensors are made over device memory on c10's PrivateUse1 device (never
// dereferenced here: the module hands their addresses to xdnn_pytorch).
// Call takes in-place and out= overloads (the results land in their
// arguments); CallInto takes functional overloads with the client's output
// tensors. A call the module declines (not bound, NOT_IMPLEMENT, a dtype or
// argument it does not take, an operand on the host) comes back as
// DeclinedError before anything was issued, and the op runner runs it on
// cpu_fallback. A NOT_IMPLEMENT is remembered per (overload, dtype of the
// first tensor): later such calls are declined without asking xdnn.
// Other vendor failures are errors naming the op, the xdnn_pytorch call
// and its code.
//
// Completion: the module issues the work on the stream and returns; it
// completes later, as every stream-ordered call of the runtime contract.
//
// Thread safety: any method from any thread (calls on one stream are
// serialised by the caller).
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_XDNN_OP_EXECUTOR_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_XDNN_OP_EXECUTOR_H_

#include <memory>
#include <vector>

#include "flagos/op_executor.h"
#include "flagos/runtime.h"
#include "xdnn_module_loader.h"

namespace flagos {

// `runtime` must be the kunlunxin runtime (KunlunxinStreams) and outlive
// the executor. `facts`: what its kernels return that their meta functions
// do not say; an overload is routed native only after its results matched
// ATen's CPU kernel's (scripts/kunlunxin-calibrate), so ATen CPU's facts.
std::unique_ptr<OpExecutor> CreateXdnnOpExecutor(DeviceRuntime& runtime, XdnnModule module,
                                                 std::vector<KernelFact> facts);

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_XDNN_OP_EXECUTOR_H_
