// libflagos_kunlunxin_xdnn.so's entry point (xdnn_module_abi.h): the
// module descriptor, one xdnn::Context per stream, and each call's trip
// from descriptors through its binding to a result code.
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "xdnn_bindings.h"
#include "xdnn_invocation.h"
#include "xdnn_module_abi.h"

#ifndef FLAGOS_XDNN_HEADER
#define FLAGOS_XDNN_HEADER "xdnn_pytorch/xdnn_pytorch.h"
#endif

namespace flagos::kunlunxin::xdnn_binding {
namespace {

// Contexts are made once per stream and kept: the vendor's create_context
// may be costly, and a context only remembers its stream (a stream handle
// the runtime reuses later binds the same way).
xdnn::Context* ContextFor(void* stream) {
  static std::mutex mu;
  static auto* contexts = new std::unordered_map<void*, xdnn::Context*>();
  std::lock_guard<std::mutex> lock(mu);
  xdnn::Context*& ctx = (*contexts)[stream];
  if (ctx == nullptr) {
    ctx = xdnn::create_context();
    if (ctx != nullptr) ctx->xpu_stream = stream;
  }
  return ctx;
}

const char* CodeName(int code) {
  switch (code) {
    case xdnn::SUCCESS: return "SUCCESS";
    case xdnn::INVALID_PARAM: return "INVALID_PARAM";
    case xdnn::RUNTIME_ERROR: return "RUNTIME_ERROR";
    case xdnn::NO_ENOUGH_WORKSPACE: return "NO_ENOUGH_WORKSPACE";
    case xdnn::NOT_IMPLEMENT: return "NOT_IMPLEMENT";
    default: return "an unknown code";
  }
}

void Set(flagos_xdnn_result* result, int32_t code, const std::string& message) {
  result->code = code;
  std::snprintf(result->message, sizeof(result->message), "%s", message.c_str());
}

// The outputs `binding`'s form implies for `call`.
std::vector<xdnn_pytorch::Tensor> Outputs(const Binding& binding, const flagos_xdnn_call& call) {
  std::vector<xdnn_pytorch::Tensor> outs;
  switch (binding.form) {
    case Form::kFunctional:
      for (int32_t k = 0; k < call.nouts; ++k) outs.push_back(ToXdnn(call.outs[k]));
      break;
    case Form::kInPlace:
      if (call.nargs > 0 && call.args[0].kind == FLAGOS_XDNN_ARG_TENSOR) {
        outs.push_back(ToXdnn(call.args[0].tensor));
      }
      break;
    case Form::kOut:
      if (call.nargs < binding.outputs) throw Decline{"fewer arguments than out= tensors"};
      for (int32_t k = call.nargs - binding.outputs; k < call.nargs; ++k) {
        if (call.args[k].kind != FLAGOS_XDNN_ARG_TENSOR) throw Decline{"an out= argument is None"};
        outs.push_back(ToXdnn(call.args[k].tensor));
      }
      break;
  }
  return outs;
}

void Call(const flagos_xdnn_call* call, flagos_xdnn_result* result) {
  std::memset(result, 0, sizeof(*result));
  const Binding* binding = FindBinding(call->op);
  if (binding == nullptr) {
    Set(result, FLAGOS_XDNN_DECLINED, std::string(call->op) + " is not bound to xdnn_pytorch");
    return;
  }
  try {
    xdnn::Context* ctx = ContextFor(call->stream);
    if (ctx == nullptr) {
      Set(result, FLAGOS_XDNN_FAILED, "xdnn::create_context() returned null");
      std::snprintf(result->vendor_call, sizeof(result->vendor_call), "create_context");
      return;
    }
    Invocation invocation(ctx, *call, Outputs(*binding, *call));
    const int rc = binding->run(invocation);
    std::snprintf(result->vendor_call, sizeof(result->vendor_call), "%s",
                  invocation.vendor_call());
    std::snprintf(result->vendor_code, sizeof(result->vendor_code), "%s", CodeName(rc));
    switch (rc) {
      case xdnn::SUCCESS: result->code = FLAGOS_XDNN_OK; return;
      case xdnn::NOT_IMPLEMENT:
        Set(result, FLAGOS_XDNN_DECLINED, "xdnn_pytorch does not implement it for these dtypes");
        return;
      case xdnn::INVALID_PARAM: Set(result, FLAGOS_XDNN_INVALID, "invalid parameters"); return;
      case xdnn::NO_ENOUGH_WORKSPACE:
        Set(result, FLAGOS_XDNN_NO_WORKSPACE, "not enough workspace");
        return;
      default: Set(result, FLAGOS_XDNN_FAILED, "the call failed"); return;
    }
  } catch (const Decline& decline) {
    Set(result, FLAGOS_XDNN_DECLINED, decline.why);
  } catch (const std::exception& e) {
    Set(result, FLAGOS_XDNN_FAILED, e.what());
  }
}

const flagos_xdnn_module& Module() {
  static const flagos_xdnn_module* const module = [] {
    static std::vector<const char*> names;
    for (const Binding& b : Bindings()) names.push_back(b.op);
    auto* m = new flagos_xdnn_module{};
    m->abi = FLAGOS_XDNN_MODULE_ABI;
    m->built_against = "xdnn_pytorch header " FLAGOS_XDNN_HEADER;
    m->nops = static_cast<int32_t>(names.size());
    m->ops = names.data();
    m->call = &Call;
    return m;
  }();
  return *module;
}

}  // namespace
}  // namespace flagos::kunlunxin::xdnn_binding

extern "C" __attribute__((visibility("default"))) const flagos_xdnn_module* flagos_xdnn_module_v1(
    void) {
  return &flagos::kunlunxin::xdnn_binding::Module();
}
