#include "cpu_op_executor.h"

#include "cpu_dtype_widening.h"
#include "cpu_kernel_facts.h"
#include "fused_rnn_kernels.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/from_blob.h>

#include <exception>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace flagos {
namespace {

// c10 messages can run long (kernel lists, hints); keep the first lines.
constexpr int kMaxMessageLines = 6;

std::string Trimmed(absl::string_view message) {
  std::string out;
  int lines = 0;
  while (!message.empty() && lines < kMaxMessageLines) {
    size_t end = message.find('\n');
    absl::string_view line = message.substr(0, end);
    message = end == absl::string_view::npos ? absl::string_view() : message.substr(end + 1);
    // c10 appends "Exception raised from ..." with the C++ backtrace.
    if (absl::StartsWith(line, "Exception raised from")) break;
    if (line.empty()) continue;
    if (!out.empty()) out += "\n";
    absl::StrAppend(&out, line);
    ++lines;
  }
  if (!message.empty() && lines == kMaxMessageLines) out += "\n...";
  return out;
}

std::string OpName(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  return name.overload_name.empty() ? name.name : absl::StrCat(name.name, ".", name.overload_name);
}

}  // namespace

c10::Device CpuOpExecutor::AtenDevice(int /*device*/) const { return c10::Device(c10::kCPU); }

bool CpuOpExecutor::HasKernel(const c10::OperatorHandle& op) const {
  if (op.hasKernelForDispatchKey(c10::DispatchKey::CPU)) return true;
  return foreach_lists_ && absl::StartsWith(op.operator_name().name, "aten::_foreach_") &&
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
}

const std::vector<KernelFact>& CpuOpExecutor::kernel_facts() const { return CpuKernelFacts(); }

at::Tensor CpuOpExecutor::WrapDeviceMemory(int /*device*/, DevicePtr ptr, c10::IntArrayRef sizes,
                                           c10::IntArrayRef strides, c10::ScalarType dtype) {
  // No deleter: the session's segment owns the memory and outlives the call.
  return at::from_blob(reinterpret_cast<void*>(ptr), sizes, strides,
                       at::TensorOptions().dtype(dtype).device(c10::kCPU));
}

absl::Status CpuOpExecutor::Call(int /*device*/, StreamHandle /*stream*/,
                                 const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  try {
    // Autograd runs on the client; here every op is a plain kernel call.
    at::AutoDispatchBelowADInplaceOrView guard;
    // CUDA's dtypes that the CPU kernel lacks run in a wider one
    // (cpu_dtype_widening.h).
    if (const DtypeWidening* widening = FindDtypeWidening(op, *stack)) {
      CallWidened(op, *widening, stack);
    } else {
      op.callBoxed(*stack);
    }
    return absl::OkStatus();
  } catch (const c10::NotImplementedError& e) {
    return absl::UnimplementedError(
        absl::StrCat(OpName(op), ": ", Trimmed(e.what_without_backtrace())));
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(OpName(op), ": ", Trimmed(e.what_without_backtrace())));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpName(op), ": ", Trimmed(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(OpName(op), ": ", Trimmed(e.what())));
  } catch (...) {
    return absl::InternalError(absl::StrCat(OpName(op), ": unknown exception"));
  }
}

std::unique_ptr<OpExecutor> CreateCpuOpExecutor(bool foreach_lists) {
  RegisterFusedRnnKernels();
  return std::make_unique<CpuOpExecutor>(foreach_lists);
}

}  // namespace flagos
