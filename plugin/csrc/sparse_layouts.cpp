// Sparse layouts are not supported on flagos: every way of making a sparse
// flagos tensor is refused at the call with one error that says so and what
// works instead (dense tensors).
//
// A sparse tensor reaches its kernels through the SparsePrivateUse1 (COO) or
// SparseCsrPrivateUse1 (CSR, CSC, BSR, BSC) dispatch keys; without a kernel
// there, the dispatcher's "could not run" or the daemon's failure to hold a
// sparse result would be the only message. Three kinds of entry:
// - operators dispatched on a sparse flagos key (sparse_coo_tensor,
//   sparse.to("flagos"), torch.empty(..., layout=torch.sparse_coo)): the
//   boxed fallbacks of both sparse keys below;
// - dense-to-sparse conversions of a dense flagos tensor (to_sparse*), which
//   dispatch on PrivateUse1: explicit kernels below;
// - the compressed-layout constructors, composite kernels that would build a
//   CSR/CSC/BSR/BSC tensor around dense flagos components without calling
//   any sparse kernel (torch.sparse_csr_tensor(..., device="flagos"),
//   csr.to("flagos")): explicit kernels on PrivateUse1 and on
//   SparseCsrPrivateUse1, which take precedence over the composite ones.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace torch_fl {
namespace {

[[noreturn]] void RefuseSparse(const c10::OperatorHandle& op, torch::jit::Stack*) {
  const c10::OperatorName& name = op.operator_name();
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "flagos: ", name.name, name.overload_name.empty() ? "" : ".", name.overload_name,
      ": sparse tensors are not supported on flagos (only the strided layout is); use dense "
      "tensors on flagos: keep a sparse tensor on the CPU, or move it with "
      ".to_dense().to(\"flagos\")");
}

// Dense flagos tensor -> sparse layout.
constexpr const char* kDenseToSparse[] = {
    "_to_sparse", "_to_sparse.sparse_dim", "_to_sparse_csr",
    "_to_sparse_csc", "_to_sparse_bsr", "_to_sparse_bsc",
};

// Compressed-layout tensors around (dense flagos) components.
constexpr const char* kCompressedConstructors[] = {
    "sparse_compressed_tensor.comp_plain_value_size",
    "sparse_compressed_tensor.comp_plain_value",
    "sparse_csr_tensor.crow_col_value_size",
    "sparse_csr_tensor.crow_col_value",
    "sparse_csc_tensor.ccol_row_value_size",
    "sparse_csc_tensor.ccol_row_value",
    "sparse_bsr_tensor.crow_col_value_size",
    "sparse_bsr_tensor.crow_col_value",
    "sparse_bsc_tensor.ccol_row_value_size",
    "sparse_bsc_tensor.ccol_row_value",
    "_sparse_compressed_tensor_unsafe",
    "_sparse_csr_tensor_unsafe",
    "_sparse_csc_tensor_unsafe",
    "_sparse_bsr_tensor_unsafe",
    "_sparse_bsc_tensor_unsafe",
    "_sparse_compressed_tensor_with_dims",
};

void RegisterRefusals(torch::Library& m, c10::ArrayRef<const char*> ops) {
  for (const char* op : ops) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&RefuseSparse>());
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&RefuseSparse>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&RefuseSparse>());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  RegisterRefusals(m, kDenseToSparse);
  RegisterRefusals(m, kCompressedConstructors);
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  RegisterRefusals(m, kCompressedConstructors);
}

}  // namespace torch_fl
