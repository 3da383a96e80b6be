// Composite operators: those whose PrivateUse1 entry would otherwise be a
// CompositeExplicitAutograd (or ...NonFunctional) default, a decomposition
// into other operators or a functional wrapper around the out= variant.
// Each runs on flagos as one op call when the daemon says it runs it whole
// (NegotiateResponse.composite_ops, the backend's own kernel: its values,
// fused, with its accumulation types, in one command instead of several),
// and decomposed, as PyTorch runs it on a device without the kernel,
// otherwise.
#pragma once

namespace torch_fl {

// Registers, once at import, a PrivateUse1 kernel for every composite
// operator of this torch that a daemon may run whole: those with a CPU
// kernel (ATen's), and those without one that return no view (a native
// route's kernel: the kunlunxin xdnn module binds embedding, which ATen
// runs decomposed everywhere); returns how many. Which way a call goes is
// decided at an operator's first call, from the daemon's report read once
// from the session's handshake: forwarded when listed, decomposed when
// not. A daemon that sends no report (one from before the field) gets
// those with a CPU kernel forwarded. FLAGOS_COMPOSITE_OPS=decompose registers none (every
// composite operator runs decomposed).
int ForwardCompositeOps();

}  // namespace torch_fl
