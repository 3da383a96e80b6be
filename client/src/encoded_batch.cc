#include "encoded_batch.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace flagos::client {
namespace {

using google::protobuf::io::CodedOutputStream;
using google::protobuf::internal::WireFormatLite;

constexpr uint32_t LengthDelimitedTag(int field) {
  return static_cast<uint32_t>(field) << 3 | WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
}
constexpr uint32_t kCommandTag = LengthDelimitedTag(v1::CommandBatch::kCommandsFieldNumber);
constexpr uint32_t kBatchTag = LengthDelimitedTag(v1::ClientMessage::kBatchFieldNumber);
constexpr uint32_t kSeqTag = static_cast<uint32_t>(v1::Command::kSeqFieldNumber) << 3 |
                             WireFormatLite::WIRETYPE_VARINT;

void DestroyBuffer(void* p) { delete[] static_cast<uint8_t*>(p); }

}  // namespace

uint8_t* EncodedBatch::Extend(size_t n) {
  if (size_ + n > capacity_) {
    size_t capacity = std::max({capacity_ * 2, last_capacity_, size_ + n});
    std::unique_ptr<uint8_t[]> grown(new uint8_t[capacity]);  // not zeroed: written next
    if (size_ > 0) std::memcpy(grown.get(), data_.get(), size_);
    data_ = std::move(grown);
    capacity_ = capacity;
  }
  uint8_t* at = data_.get() + size_;
  size_ += n;
  return at;
}

void EncodedBatch::Append(const v1::Command& command, uint64_t seq) {
  const size_t body = command.ByteSizeLong();
  uint8_t* p = Frame(body, seq);
  p = command.SerializeWithCachedSizesToArray(p);
  WriteSeq(seq, p);
}

void EncodedBatch::AppendSerialized(absl::string_view command, uint64_t seq) {
  uint8_t* p = Frame(command.size(), seq);
  if (!command.empty()) std::memcpy(p, command.data(), command.size());
  WriteSeq(seq, p + command.size());
}

uint8_t* EncodedBatch::Frame(size_t body, uint64_t seq) {
  // Lengths fit 32 bits: a batch stays below kMaxBatchBytes plus one
  // command (SessionConnection sends it once it is over), far below 2 GiB.
  const size_t length =
      body + CodedOutputStream::VarintSize32(kSeqTag) + CodedOutputStream::VarintSize64(seq);
  const size_t framed = CodedOutputStream::VarintSize32(kCommandTag) +
                        CodedOutputStream::VarintSize32(static_cast<uint32_t>(length)) + length;
  uint8_t* p = Extend(framed);
  p = CodedOutputStream::WriteVarint32ToArray(kCommandTag, p);
  p = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(length), p);
  ++commands_;
  return p;
}

void EncodedBatch::WriteSeq(uint64_t seq, uint8_t* p) {
  p = CodedOutputStream::WriteVarint32ToArray(kSeqTag, p);
  CodedOutputStream::WriteVarint64ToArray(seq, p);
}

grpc::ByteBuffer EncodedBatch::Take() {
  uint8_t head[16];
  uint8_t* p = CodedOutputStream::WriteVarint32ToArray(kBatchTag, head);
  p = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(size_), p);
  grpc::Slice slices[2] = {
      grpc::Slice(head, static_cast<size_t>(p - head)),
      size_ == 0 ? grpc::Slice() : grpc::Slice(data_.release(), size_, &DestroyBuffer),
  };
  grpc::ByteBuffer message(slices, size_ == 0 ? 1 : 2);
  last_capacity_ = std::max<size_t>(capacity_, 4096);
  data_.reset();
  size_ = 0;
  capacity_ = 0;
  commands_ = 0;
  return message;
}

}  // namespace flagos::client
