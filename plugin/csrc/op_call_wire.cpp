#include "op_call_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include "flagos/v1/flagos.pb.h"

namespace torch_fl {
namespace {

using google::protobuf::io::CodedOutputStream;
using google::protobuf::internal::WireFormatLite;
namespace v1 = flagos::v1;

constexpr uint32_t Tag(int field, WireFormatLite::WireType type) {
  return static_cast<uint32_t>(field) << 3 | type;
}
constexpr auto kVarint = WireFormatLite::WIRETYPE_VARINT;
constexpr auto kFixed64 = WireFormatLite::WIRETYPE_FIXED64;
constexpr auto kLength = WireFormatLite::WIRETYPE_LENGTH_DELIMITED;

size_t TagSize(uint32_t tag) { return CodedOutputStream::VarintSize32(tag); }
// A length-delimited field of `n` bytes, framed.
size_t Framed(uint32_t tag, size_t n) {
  return TagSize(tag) + CodedOutputStream::VarintSize32(static_cast<uint32_t>(n)) + n;
}

size_t PackedBody(absl::Span<const int64_t> values) {
  size_t n = 0;
  for (int64_t v : values) n += CodedOutputStream::VarintSize64(static_cast<uint64_t>(v));
  return n;
}

size_t Int32Size(uint32_t tag, int32_t v) {
  return v == 0 ? 0 : TagSize(tag) + CodedOutputStream::VarintSize32SignExtended(v);
}
size_t Int64Size(uint32_t tag, uint64_t v) {
  return v == 0 ? 0 : TagSize(tag) + CodedOutputStream::VarintSize64(v);
}
size_t BoolSize(uint32_t tag, bool v) { return v ? TagSize(tag) + 1 : 0; }
size_t PackedSize(uint32_t tag, absl::Span<const int64_t> values) {
  return values.empty() ? 0 : Framed(tag, PackedBody(values));
}

constexpr uint32_t kRefAddr = Tag(v1::TensorRef::kAddrFieldNumber, kVarint);
constexpr uint32_t kRefOffset = Tag(v1::TensorRef::kStorageOffsetFieldNumber, kVarint);
constexpr uint32_t kRefSizes = Tag(v1::TensorRef::kSizesFieldNumber, kLength);
constexpr uint32_t kRefStrides = Tag(v1::TensorRef::kStridesFieldNumber, kLength);
constexpr uint32_t kRefDtype = Tag(v1::TensorRef::kDtypeFieldNumber, kVarint);
constexpr uint32_t kRefDevice = Tag(v1::TensorRef::kDeviceFieldNumber, kVarint);
constexpr uint32_t kRefUndefined = Tag(v1::TensorRef::kUndefinedFieldNumber, kVarint);
constexpr uint32_t kRefConj = Tag(v1::TensorRef::kConjFieldNumber, kVarint);
constexpr uint32_t kRefNeg = Tag(v1::TensorRef::kNegFieldNumber, kVarint);

constexpr uint32_t kValueNone = Tag(v1::Value::kNoneFieldNumber, kVarint);
constexpr uint32_t kValueInt = Tag(v1::Value::kIFieldNumber, kVarint);
constexpr uint32_t kValueDouble = Tag(v1::Value::kDFieldNumber, kFixed64);
constexpr uint32_t kValueBool = Tag(v1::Value::kBFieldNumber, kVarint);
constexpr uint32_t kValueTensor = Tag(v1::Value::kTensorFieldNumber, kLength);
constexpr uint32_t kValueInts = Tag(v1::Value::kIntsFieldNumber, kLength);
constexpr uint32_t kIntListValues = Tag(v1::IntList::kValuesFieldNumber, kLength);

constexpr uint32_t kCallOpId = Tag(v1::OpCall::kOpIdFieldNumber, kVarint);
constexpr uint32_t kCallArgs = Tag(v1::OpCall::kArgsFieldNumber, kLength);
constexpr uint32_t kCallOutputs = Tag(v1::OpCall::kOutputsFieldNumber, kLength);

constexpr uint32_t kCommandDevice = Tag(v1::Command::kDeviceFieldNumber, kVarint);
constexpr uint32_t kCommandStream = Tag(v1::Command::kStreamFieldNumber, kVarint);
constexpr uint32_t kCommandOp = Tag(v1::Command::kOpFieldNumber, kLength);

// A TensorRef's body, fields in number order (as protobuf writes them).
size_t TensorRefSize(const WireTensorRef& t) {
  return Int64Size(kRefAddr, t.addr) +
         Int64Size(kRefOffset, static_cast<uint64_t>(t.storage_offset)) +
         PackedSize(kRefSizes, t.sizes) + PackedSize(kRefStrides, t.strides) +
         Int32Size(kRefDtype, t.dtype) + Int32Size(kRefDevice, t.device) +
         BoolSize(kRefUndefined, t.undefined) + BoolSize(kRefConj, t.conj) +
         BoolSize(kRefNeg, t.neg);
}

uint8_t* WriteTag(uint32_t tag, uint8_t* p) { return CodedOutputStream::WriteVarint32ToArray(tag, p); }
uint8_t* WriteLength(size_t n, uint8_t* p) {
  return CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(n), p);
}
uint8_t* WriteUInt64(uint32_t tag, uint64_t v, uint8_t* p) {
  if (v == 0) return p;
  return CodedOutputStream::WriteVarint64ToArray(v, WriteTag(tag, p));
}
uint8_t* WriteInt32(uint32_t tag, int32_t v, uint8_t* p) {
  if (v == 0) return p;
  return CodedOutputStream::WriteVarint32SignExtendedToArray(v, WriteTag(tag, p));
}
uint8_t* WriteBool(uint32_t tag, bool v, uint8_t* p) {
  if (!v) return p;
  p = WriteTag(tag, p);
  *p++ = 1;
  return p;
}
uint8_t* WritePacked(uint32_t tag, absl::Span<const int64_t> values, uint8_t* p) {
  if (values.empty()) return p;
  p = WriteLength(PackedBody(values), WriteTag(tag, p));
  for (int64_t v : values) p = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(v), p);
  return p;
}

uint8_t* WriteTensorRef(const WireTensorRef& t, uint8_t* p) {
  p = WriteUInt64(kRefAddr, t.addr, p);
  p = WriteUInt64(kRefOffset, static_cast<uint64_t>(t.storage_offset), p);
  p = WritePacked(kRefSizes, t.sizes, p);
  p = WritePacked(kRefStrides, t.strides, p);
  p = WriteInt32(kRefDtype, t.dtype, p);
  p = WriteInt32(kRefDevice, t.device, p);
  p = WriteBool(kRefUndefined, t.undefined, p);
  p = WriteBool(kRefConj, t.conj, p);
  p = WriteBool(kRefNeg, t.neg, p);
  return p;
}

}  // namespace

void OpCallWire::Clear() {
  args_.clear();
  outputs_.clear();
  ints_.clear();
}

// A oneof member is written even when it holds its type's default.
void OpCallWire::AddNone() {
  Arg& a = args_.emplace_back();
  a.kind = Kind::kNone;
  a.size = TagSize(kValueNone) + 1;
}

void OpCallWire::AddInt(int64_t value) {
  Arg& a = args_.emplace_back();
  a.kind = Kind::kInt;
  a.i = value;
  a.size = TagSize(kValueInt) + CodedOutputStream::VarintSize64(static_cast<uint64_t>(value));
}

void OpCallWire::AddDouble(double value) {
  Arg& a = args_.emplace_back();
  a.kind = Kind::kDouble;
  a.d = value;
  a.size = TagSize(kValueDouble) + 8;
}

void OpCallWire::AddBool(bool value) {
  Arg& a = args_.emplace_back();
  a.kind = Kind::kBool;
  a.b = value;
  a.size = TagSize(kValueBool) + 1;
}

void OpCallWire::AddTensor(const WireTensorRef& tensor) {
  Arg& a = args_.emplace_back();
  a.kind = Kind::kTensor;
  a.tensor = tensor;
  a.inner = TensorRefSize(tensor);
  a.size = Framed(kValueTensor, a.inner);
}

void OpCallWire::AddInts(absl::Span<const int64_t> values) {
  Arg& a = args_.emplace_back();
  a.kind = Kind::kInts;
  a.ints_begin = ints_.size();
  a.ints_count = values.size();
  ints_.insert(ints_.end(), values.begin(), values.end());
  // The IntList is set even when empty (a message of no bytes).
  a.inner = PackedSize(kIntListValues, values);
  a.size = Framed(kValueInts, a.inner);
}

void OpCallWire::AddOutput(const WireTensorRef& tensor) {
  Output& o = outputs_.emplace_back();
  o.tensor = tensor;
  o.size = TensorRefSize(tensor);
}

absl::string_view OpCallWire::Serialize(int32_t device, uint64_t stream, uint32_t op_id) {
  size_t call = op_id == 0 ? 0 : TagSize(kCallOpId) + CodedOutputStream::VarintSize32(op_id);
  for (const Arg& a : args_) call += Framed(kCallArgs, a.size);
  for (const Output& o : outputs_) call += Framed(kCallOutputs, o.size);
  const size_t total = Int32Size(kCommandDevice, device) + Int64Size(kCommandStream, stream) +
                       Framed(kCommandOp, call);
  bytes_.resize(total);
  auto* const begin = reinterpret_cast<uint8_t*>(bytes_.data());
  uint8_t* p = begin;
  p = WriteInt32(kCommandDevice, device, p);
  p = WriteUInt64(kCommandStream, stream, p);
  p = WriteLength(call, WriteTag(kCommandOp, p));
  if (op_id != 0) p = CodedOutputStream::WriteVarint32ToArray(op_id, WriteTag(kCallOpId, p));
  for (const Arg& a : args_) {
    p = WriteLength(a.size, WriteTag(kCallArgs, p));
    switch (a.kind) {
      case Kind::kNone:
        p = WriteTag(kValueNone, p);
        *p++ = 1;
        break;
      case Kind::kInt:
        p = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(a.i),
                                                    WriteTag(kValueInt, p));
        break;
      case Kind::kDouble:
        p = WireFormatLite::WriteDoubleNoTagToArray(a.d, WriteTag(kValueDouble, p));
        break;
      case Kind::kBool:
        p = WriteTag(kValueBool, p);
        *p++ = a.b ? 1 : 0;
        break;
      case Kind::kTensor:
        p = WriteLength(a.inner, WriteTag(kValueTensor, p));
        p = WriteTensorRef(a.tensor, p);
        break;
      case Kind::kInts: {
        const absl::Span<const int64_t> values(ints_.data() + a.ints_begin, a.ints_count);
        p = WriteLength(a.inner, WriteTag(kValueInts, p));
        p = WritePacked(kIntListValues, values, p);
        break;
      }
    }
  }
  for (const Output& o : outputs_) {
    p = WriteLength(o.size, WriteTag(kCallOutputs, p));
    p = WriteTensorRef(o.tensor, p);
  }
  bytes_.resize(static_cast<size_t>(p - begin));  // == total
  return bytes_;
}

}  // namespace torch_fl
