// Host kernels for the CUDA-only ATen operators torch.nn.SyncBatchNorm
// calls (sync_batch_norm_kernels.cc).
#ifndef FLAGOS_DAEMON_COLLECTIVES_SYNC_BATCH_NORM_KERNELS_H_
#define FLAGOS_DAEMON_COLLECTIVES_SYNC_BATCH_NORM_KERNELS_H_

namespace flagos::daemon {

// How many operators the file registers. Calling it keeps the file's
// registrations in the linked daemon (collective_ops.cc does).
int SyncBatchNormKernelCount();

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_COLLECTIVES_SYNC_BATCH_NORM_KERNELS_H_
