// OwnedBytes: the bytes a reply carries until they are sent — a message's
// data (a std::string moved in) or a buffer made for overwriting, which a
// device→host copy fills without the zero fill a std::string of that size
// costs (a pass over the bytes as long as the copy itself).
//
// Thread safety: none; a value moves between threads with its reply.
#ifndef FLAGOS_DAEMON_TRANSPORT_OWNED_BYTES_H_
#define FLAGOS_DAEMON_TRANSPORT_OWNED_BYTES_H_

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

namespace flagos::daemon {

class OwnedBytes {
 public:
  OwnedBytes() = default;
  explicit OwnedBytes(std::string bytes) : string_(std::move(bytes)) {}

  // `n` bytes of undefined value, for the caller to overwrite.
  static OwnedBytes ForOverwrite(size_t n) {
    OwnedBytes bytes;
    bytes.buffer_ = std::make_unique_for_overwrite<char[]>(n);
    bytes.buffer_size_ = n;
    return bytes;
  }

  OwnedBytes(OwnedBytes&&) = default;
  OwnedBytes& operator=(OwnedBytes&&) = default;
  OwnedBytes(const OwnedBytes&) = delete;
  OwnedBytes& operator=(const OwnedBytes&) = delete;

  char* data() { return buffer_ ? buffer_.get() : string_.data(); }
  const char* data() const { return buffer_ ? buffer_.get() : string_.data(); }
  size_t size() const { return buffer_ ? buffer_size_ : string_.size(); }
  bool empty() const { return size() == 0; }

  // The bytes as a std::string (a message's data): moved when they are one,
  // copied from a buffer otherwise. Leaves this empty.
  std::string TakeString() {
    std::string out = buffer_ ? std::string(buffer_.get(), buffer_size_) : std::move(string_);
    *this = OwnedBytes();
    return out;
  }

 private:
  std::string string_;
  std::unique_ptr<char[]> buffer_;
  size_t buffer_size_ = 0;
};

}  // namespace flagos::daemon

#endif  // FLAGOS_DAEMON_TRANSPORT_OWNED_BYTES_H_
