// The autograd engine's device queues for flagos devices, whenever
// torch_fl was imported.
//
// torch's autograd engine sizes its per-device ready queues once, at the
// first backward of the process, from the device count of every device type
// registered then (Engine::start_device_threads). A program that ran a CPU
// backward before `import torch_fl` (or before torch's autoload imported it)
// has an engine with no queue for flagos devices, and its first flagos
// backward fails inside the engine ("device_ready_queues_ ... INTERNAL
// ASSERT FAILED"). EnsureAutogradDeviceQueues gives such an engine the
// queues and worker threads it would have made had flagos been registered
// at its start, as start_device_threads makes them.
#ifndef TORCH_FL_AUTOGRAD_DEVICE_QUEUES_H_
#define TORCH_FL_AUTOGRAD_DEVICE_QUEUES_H_

namespace torch_fl {

// Makes sure the default autograd engine has a ready queue (and its worker
// thread) for every device index below `devices`, if the engine started
// already; an engine that has not started sizes its queues itself, counting
// flagos's devices. Idempotent; called when a session opens (the device
// count is known then), never with the runtime's lock held: the new
// workers ask every device type for its count as they start.
// `in_device_count`: the session opened inside a device count, perhaps the
// engine's own as it starts; then nothing grows now, and the next
// EnsurePendingAutogradDeviceQueues (the next session call outside a device
// count) grows what the engine, once started, still lacks.
void EnsureAutogradDeviceQueues(int devices, bool in_device_count);
void EnsurePendingAutogradDeviceQueues();  // lock-free when nothing is pending

}  // namespace torch_fl

#endif  // TORCH_FL_AUTOGRAD_DEVICE_QUEUES_H_
