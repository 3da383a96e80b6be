// What an operator's schema says about aliasing, for the fallback.
#pragma once

#include <ATen/core/function_schema.h>

#include <cstddef>

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

}  // namespace torch_fl
