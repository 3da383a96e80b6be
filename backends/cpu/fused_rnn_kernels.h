// CPU kernels for the fused recurrent cells that ATen implements only for
// CUDA. ATen routes LSTM and GRU cells of every non-CPU device — flagos'
// included — to `_thnn_fused_lstm_cell` / `_thnn_fused_gru_cell` and their
// backwards, so the CPU backend provides them, computed with ATen ops.
// Workspace layouts (ours, consistent between forward and backward):
//   LSTM: [B, 4H] = activated gates (i, f, g, o);
//   GRU:  [B, 5H] = (r, z, n, hx, hidden-gate n part incl. its bias).
#ifndef FLAGOS_BACKENDS_CPU_FUSED_RNN_KERNELS_H_
#define FLAGOS_BACKENDS_CPU_FUSED_RNN_KERNELS_H_

namespace flagos {

// Registers the kernels with the dispatcher (CPU key) once per process.
void RegisterFusedRnnKernels();

}  // namespace flagos

#endif  // FLAGOS_BACKENDS_CPU_FUSED_RNN_KERNELS_H_
