// A call the op runner decoded once, to be run again as it is: a captured
// graph's op, prepared by its first replay (OpRunner::Run's `prepare`) and
// run by every later one (OpRunner::RunPrepared), or an eager call a
// session sends again byte for byte (sessions/repeated_op_calls.h), with no
// decoding, no argument rules and no per-op range checks. Only a call that, once
// decoded, is nothing but a kernel call is prepared: the native route (no
// host copies), no values to send back, no out= scratch to copy, no
// generator drawn per call.
//
// The arguments are the tensors the first run wrapped over the memory the
// call names (their ranges were checked then; the session checks them again
// when memory was freed since: sessions/session_graphs.cc) and its decoded
// scalars. A kernel may change a tensor argument in place (resize_,
// restriding an out tensor): `made` keeps what each tensor was made as, and
// a call whose tensors changed is not run prepared (Intact).
//
// Thread safety: immutable once prepared; several replays of one graph (on
// several streams) run it at once, each on its own copy of the stack.
// (ATen TU)
#ifndef FLAGOS_DAEMON_OPS_PREPARED_OP_CALL_H_
#define FLAGOS_DAEMON_OPS_PREPARED_OP_CALL_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace flagos::daemon {

class PreparedOpCall {
 public:
  // `outputs` empty: the kernel of `op` on `stack` writes its results in
  // place (an in-place op, or an out= overload whose outputs are on the
  // stack); else `op` is a functional op whose kernel writes its results
  // into `outputs` (OpExecutor::CallInto).
  PreparedOpCall(const c10::OperatorHandle& op, std::string op_name, int device,
                 torch::jit::Stack stack, std::vector<at::Tensor> outputs, bool outputs_must_stay)
      : op_(op),
        op_name_(std::move(op_name)),
        device_(device),
        stack_(std::move(stack)),
        outputs_(std::move(outputs)),
        outputs_must_stay_(outputs_must_stay) {
    for (const c10::IValue& value : stack_) Remember(value);
    for (const at::Tensor& t : outputs_) Remember(t);
  }

  const c10::OperatorHandle& op() const { return op_; }
  const std::string& op_name() const { return op_name_; }
  int device() const { return device_; }
  const torch::jit::Stack& stack() const { return stack_; }
  const std::vector<at::Tensor>& outputs() const { return outputs_; }
  // An out= overload run into the client's outputs: the kernel must leave
  // those tensors as made (else their bytes are not where the client
  // reads them).
  bool outputs_must_stay() const { return outputs_must_stay_; }

  // True when every tensor of the call is still as it was made.
  bool Intact() const {
    for (const Made& m : made_) {
      if (!m.Same()) return false;
    }
    return true;
  }

 private:
  struct Made {
    at::Tensor tensor;
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;
    int64_t storage_offset = 0;
    const void* data = nullptr;

    explicit Made(const at::Tensor& t)
        : tensor(t),
          sizes(t.sizes().vec()),
          strides(t.strides().vec()),
          storage_offset(t.storage_offset()),
          data(t.const_data_ptr()) {}
    bool Same() const {
      return tensor.sizes().equals(sizes) && tensor.strides().equals(strides) &&
             tensor.storage_offset() == storage_offset && tensor.const_data_ptr() == data;
    }
  };

  void Remember(const c10::IValue& value) {
    if (value.isTensor()) return Remember(value.toTensor());
    if (value.isList()) {
      for (const c10::IValue& element : value.toListRef()) Remember(element);
    }
  }
  void Remember(const at::Tensor& t) {
    if (t.defined()) made_.emplace_back(t);
  }

  const c10::OperatorHandle op_;
  const std::string op_name_;
  const int device_;
  const torch::jit::Stack stack_;
  const std::vector<at::Tensor> outputs_;
  const bool outputs_must_stay_;
  std::vector<Made> made_;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_OPS_PREPARED_OP_CALL_H_
