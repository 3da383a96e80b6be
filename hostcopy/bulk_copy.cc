#include "flagos/hostcopy/bulk_copy.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace flagos::hostcopy {
namespace {

constexpr uintptr_t kPage = 4096;
constexpr uintptr_t kHugePage = uintptr_t{2} << 20;

// Whether the page holding `addr` is present (mincore; a range the kernel
// cannot answer for counts as absent).
bool PagePresent(uintptr_t addr) {
  unsigned char present = 0;
  if (mincore(reinterpret_cast<void*>(addr & ~(kPage - 1)), kPage, &present) != 0) return false;
  return (present & 1) != 0;
}

bool EndsPresent(const void* dst, size_t n) {
  const auto first = reinterpret_cast<uintptr_t>(dst);
  return PagePresent(first) && PagePresent(first + n - 1);
}

#if defined(__SSE2__)
// 64 bytes per step: four unaligned loads, four non-temporal stores to a
// 64-byte-aligned destination; the head and tail through memcpy.
void StreamingCopy(char* dst, const char* src, size_t n) {
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63;
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  // Non-temporal stores are weakly ordered: fence them before whatever
  // tells another thread or process that the bytes are there.
  _mm_sfence();
  std::memcpy(dst + i, src + i, n - i);
}
#endif

}  // namespace

void BulkCopy(void* dst, const void* src, size_t n) {
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto s = reinterpret_cast<uintptr_t>(src);
  if (d < s + n && s < d + n) {
    std::memmove(dst, src, n);
    return;
  }
#if defined(__SSE2__)
  if (n >= kStreamingMinBytes && EndsPresent(dst, n)) {
    StreamingCopy(static_cast<char*>(dst), static_cast<const char*>(src), n);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

void PrepareDestination(void* dst, size_t n) {
  if (n < kStreamingMinBytes || EndsPresent(dst, n)) return;
  const auto begin = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t huge_begin = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t huge_end = (begin + n) & ~(kHugePage - 1);
  // Advice only: EINVAL where THP is not built in, which changes nothing.
  if (huge_end > huge_begin) {
    (void)madvise(reinterpret_cast<void*>(huge_begin), huge_end - huge_begin, MADV_HUGEPAGE);
  }
}

}  // namespace flagos::hostcopy
