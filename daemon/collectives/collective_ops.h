// The flagos_c10d operators (collective_ops.cc): torch.distributed's
// collectives on flagos tensors, run by the sessions of one daemon.
#ifndef FLAGOS_DAEMON_COLLECTIVES_COLLECTIVE_OPS_H_
#define FLAGOS_DAEMON_COLLECTIVES_COLLECTIVE_OPS_H_

namespace flagos::daemon {

// "flagos_c10d": the namespace op servability admits beside aten. Calling
// it also keeps collective_ops.cc's registrations in the linked daemon.
const char* CollectiveOpsNamespace();

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_COLLECTIVES_COLLECTIVE_OPS_H_
