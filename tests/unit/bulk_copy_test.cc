// hostcopy::BulkCopy and PrepareDestination against memcmp with the source:
// every size class (below and above the streaming threshold, with heads and
// tails), misaligned sources and destinations, destinations already faulted
// in and fresh ones.
#include "flagos/hostcopy/bulk_copy.h"

#include <sys/mman.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace flagos::hostcopy {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// A fresh private anonymous mapping: no page present until written.
class Mapping {
 public:
  explicit Mapping(size_t n) : n_(n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    base_ = static_cast<char*>(p);
  }
  ~Mapping() { munmap(base_, n_); }
  char* data() { return base_; }

 private:
  size_t n_;
  char* base_;
};

std::vector<char> Pattern(size_t n, uint32_t seed) {
  std::vector<char> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& c : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = static_cast<char>(x);
  }
  return v;
}

bool Present(const void* p) {
  unsigned char v = 0;
  const auto page = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{4095};
  return mincore(reinterpret_cast<void*>(page), 4096, &v) == 0 && (v & 1);
}

TEST(BulkCopy, CopiesEverySizeAndAlignmentIntoTouchedMemory) {
  const size_t sizes[] = {0, 1, 63, 64, 65, 4095, kMiB - 1, kMiB, kMiB + 13, 5 * kMiB + 7};
  const size_t offsets[] = {0, 1, 17, 63};
  for (size_t n : sizes) {
    const std::vector<char> src = Pattern(n + 64, static_cast<uint32_t>(n));
    for (size_t src_off : offsets) {
      for (size_t dst_off : offsets) {
        std::vector<char> dst(n + 128, '\x5a');
        BulkCopy(dst.data() + dst_off, src.data() + src_off, n);
        ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + src_off, n), 0)
            << n << " bytes, source +" << src_off << ", destination +" << dst_off;
        // Nothing written outside the range.
        for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], '\x5a');
        for (size_t i = dst_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], '\x5a') << i;
      }
    }
  }
}

TEST(BulkCopy, CopiesIntoFreshPages) {
  const size_t n = 6 * kMiB + 4096 + 5;
  const std::vector<char> src = Pattern(n, 7);
  Mapping fresh(n + 8192);
  ASSERT_FALSE(Present(fresh.data()));
  BulkCopy(fresh.data() + 3, src.data(), n);
  EXPECT_EQ(std::memcmp(fresh.data() + 3, src.data(), n), 0);
}

// The VmFlags of the mapping holding `p` (/proc/self/smaps), "" if none.
std::string VmFlags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2 &&
        line.find(':') > line.find(' ')) {
      inside = lo <= addr && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

bool HugePageAdviceTaken() {
  Mapping probe(4 * kMiB);
  return madvise(probe.data(), 4 * kMiB, MADV_HUGEPAGE) == 0;
}

TEST(PrepareDestination, AdvisesHugePagesForAFreshRangeAndKeepsItsBytes) {
  const size_t n = 8 * kMiB + 100;
  Mapping fresh(n + 3 * 4096);
  char* dst = fresh.data() + 4096 + 9;
  // A page in the middle already holds bytes; the range's ends are absent.
  std::memset(dst + 4 * kMiB, 'k', 4096);
  ASSERT_FALSE(Present(dst));
  PrepareDestination(dst, n);
  EXPECT_EQ(std::memcmp(dst + 4 * kMiB, std::vector<char>(4096, 'k').data(), 4096), 0);
  if (HugePageAdviceTaken()) {
    // The 2 MiB-aligned middle carries the advice ("hg"); the head below
    // the first 2 MiB boundary does not.
    const uintptr_t middle = (reinterpret_cast<uintptr_t>(dst) + 2 * kMiB) & ~(2 * kMiB - 1);
    EXPECT_NE(VmFlags(reinterpret_cast<void*>(middle)).find(" hg"), std::string::npos)
        << VmFlags(reinterpret_cast<void*>(middle));
    EXPECT_EQ(VmFlags(fresh.data()).find(" hg"), std::string::npos) << VmFlags(fresh.data());
  }
  const std::vector<char> src = Pattern(n, 11);
  BulkCopy(dst, src.data(), n);
  EXPECT_EQ(std::memcmp(dst, src.data(), n), 0);
}

TEST(PrepareDestination, LeavesSmallAndPresentRangesAlone) {
  Mapping fresh(4 * kMiB);
  PrepareDestination(fresh.data(), kMiB - 1);  // below the threshold
  EXPECT_EQ(VmFlags(fresh.data()).find(" hg"), std::string::npos);
  std::memset(fresh.data(), 'p', 4096);
  std::memset(fresh.data() + 4 * kMiB - 4096, 'p', 4096);
  PrepareDestination(fresh.data(), 4 * kMiB);  // both ends present
  EXPECT_EQ(VmFlags(fresh.data() + 2 * kMiB).find(" hg"), std::string::npos);
  EXPECT_EQ(fresh.data()[4 * kMiB - 1], 'p');
}

}  // namespace
}  // namespace flagos::hostcopy
