// OpCallWire: the Command of an asynchronous operator call, written straight
// into its wire bytes, for the arguments most calls have (tensors on flagos,
// None, ints, doubles, bools, int lists).
//
// The per-op cost of the client is mostly building protobuf messages and
// serializing them (a dozen messages for a binary op). This writes the same
// bytes without them: the sizes are computed from plain fields, then each
// field is written once. What it cannot take (host tensors, strings,
// generators, nested lists, ...) makes the caller build the protobuf Command
// instead (fallback.cpp); both produce the message
// tests/python/test_op_call_wire.py compares, field by field and in size.
//
// The field numbers are the generated code's; the types (varint int64,
// fixed64 double, packed sizes) are the proto's as written today: a change
// of a field's type in flagos.proto must change this file (the test fails
// until it does).
//
// Thread safety: none; one per thread.
#ifndef TORCH_FL_CSRC_OP_CALL_WIRE_H_
#define TORCH_FL_CSRC_OP_CALL_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace torch_fl {

// A TensorRef's fields (flagos.proto), as tensor_codec.h reads them from a
// tensor. The spans point into the tensor, which must outlive their use.
struct WireTensorRef {
  bool undefined = false;
  uint64_t addr = 0;
  int64_t storage_offset = 0;
  absl::Span<const int64_t> sizes;
  absl::Span<const int64_t> strides;
  int32_t dtype = 0;
  int32_t device = 0;
  bool conj = false;
  bool neg = false;
};

class OpCallWire {
 public:
  // Forgets the arguments and outputs added so far.
  void Clear();

  // The next argument (OpCall.args), as a Value.
  void AddNone();
  void AddInt(int64_t value);
  void AddDouble(double value);
  void AddBool(bool value);
  void AddTensor(const WireTensorRef& tensor);
  void AddInts(absl::Span<const int64_t> values);  // copied
  // The next output (OpCall.outputs).
  void AddOutput(const WireTensorRef& tensor);

  // Command{device, stream, op: OpCall{op_id, args, outputs}}, without its
  // seq (EncodedBatch adds it); valid until the next call on this object.
  absl::string_view Serialize(int32_t device, uint64_t stream, uint32_t op_id);

 private:
  enum class Kind { kNone, kInt, kDouble, kBool, kTensor, kInts };
  struct Arg {
    Kind kind = Kind::kNone;
    int64_t i = 0;
    double d = 0;
    bool b = false;
    WireTensorRef tensor;
    size_t ints_begin = 0;  // into ints_
    size_t ints_count = 0;
    size_t inner = 0;  // the tensor's TensorRef or the IntList: bytes
    size_t size = 0;   // the Value's bytes
  };
  struct Output {
    WireTensorRef tensor;
    size_t size = 0;  // the TensorRef's bytes
  };

  absl::InlinedVector<Arg, 6> args_;
  absl::InlinedVector<Output, 2> outputs_;
  absl::InlinedVector<int64_t, 8> ints_;
  std::string bytes_;
};

}  // namespace torch_fl

#endif  // TORCH_FL_CSRC_OP_CALL_WIRE_H_
