// The aten overloads the module runs through xdnn_pytorch, each with the
// function that calls it (xdnn_bindings.cc). docs/vendors/kunlunxin/
// op-api-map.md lists them with the xdnn_pytorch call and its status.
//
// Thread safety: the table is constant.
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_XDNN_XDNN_BINDINGS_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_XDNN_XDNN_BINDINGS_H_

#include <string_view>
#include <vector>

#include "xdnn_invocation.h"

namespace flagos::kunlunxin::xdnn_binding {

// How an overload's outputs are found: a functional op's results (the
// call's `outs`), an in-place op's self (argument 0), or its out=
// arguments (the last `outputs` arguments).
enum class Form { kFunctional, kInPlace, kOut };

struct Binding {
  const char* op;  // "aten::add.out"
  Form form;
  int outputs;  // kOut: how many trailing out= arguments
  // Calls xdnn_pytorch; returns its code (xdnn::SUCCESS, ...). May throw
  // Decline before it issued anything.
  int (*run)(Invocation& call);
};

// Sorted by `op`.
const std::vector<Binding>& Bindings();
// nullptr for an overload the module does not bind.
const Binding* FindBinding(std::string_view op);

}  // namespace flagos::kunlunxin::xdnn_binding

#endif  // FLAGOS_BACKENDS_KUNLUNXIN_XDNN_XDNN_BINDINGS_H_
