// What an operator's schema says about aliasing, for the fallback.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace torch_fl {

// The alias annotation of an argument or return; for lists (`Tensor(a!)[]`)
// the annotation of the elements. nullptr when there is none.
const c10::AliasInfo* AliasOf(const c10::Argument& a);
// The op writes this argument (`Tensor(a!)`).
bool IsWritten(const c10::Argument& a);
// The index of the argument that return `ret` aliases; throws if none.
size_t AliasedArgument(const c10::FunctionSchema& schema, size_t ret);
// Every return is a Tensor or a Tensor[].
bool ReturnsOnlyTensors(const c10::FunctionSchema& schema);
// Only views are returned and nothing is written: no work for the daemon.
bool IsPureView(const c10::FunctionSchema& schema);

// Everything the fallback and shape inference ask of an operator's schema,
// tags and name, worked out once per operator (the per-call path then reads
// fields instead of walking alias sets and comparing names).
struct OpTraits {
  enum class ReturnKind : uint8_t {
    kFresh,    // a new tensor (or list): allocated, filled by the daemon
    kView,     // a view of argument `aliased`, built locally
    kWritten,  // argument `aliased` itself, written in place
  };
  struct Return {
    ReturnKind kind = ReturnKind::kFresh;
    bool tensor = true;  // Tensor (else Tensor[] or another type)
    // kView and kWritten: the argument aliased (AliasedArgument), or
    // kNoArgument for a schema whose return aliases none (the fallback then
    // reports it with AliasedArgument's error).
    size_t aliased = 0;
  };
  static constexpr size_t kNoArgument = static_cast<size_t>(-1);

  // The operator these traits describe (checked on every lookup).
  std::string name;
  std::string overload;
  // "aten::add.Tensor": how commands and errors name the op.
  std::string describe;

  bool returns_only_tensors = false;
  bool pure_view = false;
  // Tagged nondeterministic_seeded / dynamic_output_shape.
  bool nondeterministic_seeded = false;
  bool dynamic_output_shape = false;
  // aten::index (a dynamic shape only for boolean masks).
  bool is_index = false;
  // Tagged pointwise, or a _foreach_ op: no float (or complex) argument's
  // value decides an output's sizes, strides or dtype, only its kind (type
  // promotion), so shape inference keys such values by kind. An
  // optimizer's per-step scalars (Adam's bias corrections, a scheduler's
  // learning rate) then hit its cache instead of running meta kernels on
  // every step (shape_inference.cpp).
  bool float_values_keep_metadata = false;
  // Advanced indexing: CPU index tensors may join a flagos call.
  bool allows_host_operands = false;
  // Which of the daemon's kernel facts (NegotiateResponse.kernel_facts)
  // names this op: kFactUnknown until looked up, kNoFact when none does,
  // else its index (shape_inference.cpp).
  static constexpr int kFactUnknown = -2;
  static constexpr int kNoFact = -1;
  mutable std::atomic<int> kernel_fact{kFactUnknown};
  // How a composite operator registered for forwarding runs
  // (composite_forwarding.cpp): kCompositeUnknown until the daemon's report
  // was looked up.
  static constexpr uint8_t kCompositeUnknown = 0;
  static constexpr uint8_t kCompositeForward = 1;        // one op call on the daemon
  static constexpr uint8_t kCompositeDecompose = 2;      // CompositeExplicitAutograd
  static constexpr uint8_t kCompositeDecomposeNonFunctional = 3;  // ...NonFunctional
  mutable std::atomic<uint8_t> composite{kCompositeUnknown};
  // Index of the bool `training` argument, or -1.
  int training_argument = -1;

  // Per argument.
  std::vector<uint8_t> written;    // IsWritten
  std::vector<uint8_t> generator;  // a Generator or Generator? argument
  // Written Tensor (not Tensor[]) arguments.
  size_t written_tensors = 0;

  std::vector<Return> returns;

  // The session's id for the op; 0 until minted (see OpIdOf in fallback.cpp).
  mutable std::atomic<uint32_t> op_id{0};
};

// The traits of `op`, computed on first use and kept for the process.
// Thread-safe; the per-thread lookup takes no lock.
const OpTraits& TraitsOf(const c10::OperatorHandle& op);

}  // namespace torch_fl
