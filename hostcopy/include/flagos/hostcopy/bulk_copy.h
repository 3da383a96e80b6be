// Bulk host-memory copies: the copies of tensor bytes between host buffers
// that flagos makes on a transfer (the client between a user's tensor and
// the session's staging region; the cpu backend between its device memory
// and host memory).
//
// glibc's memcpy writes through the caches up to a size near the last-level
// cache (240 MiB on the 32 MiB-L3 development machine): each written line is
// first read (read-for-ownership), so two such copies running at once, the
// client's and the daemon's halves of a staged transfer, share the memory
// bus at 2 reads + 1 write per byte. Measured there: one memcpy of 64 MiB
// 10-12 GB/s, two at once 6.4 GB/s each; one streaming copy 15-19 GB/s, two
// at once 17 GB/s each.
//
// A destination whose pages are not yet faulted in (a fresh allocation such
// as the tensor `.cpu()` returns) costs a page fault per 4 KiB page, 2.4
// GB/s however the bytes are written; with transparent huge pages, one per
// 2 MiB, 10 GB/s with memcpy (whose stores find the lines the kernel just
// zeroed in cache; streaming stores there ran at 7 GB/s). Faulting the range
// in ahead (MADV_POPULATE_WRITE) while the daemon produced the bytes gained
// nothing measurable on 2 cores, so PrepareDestination only advises.
//
// Thread safety: both functions are reentrant.
#ifndef FLAGOS_HOSTCOPY_BULK_COPY_H_
#define FLAGOS_HOSTCOPY_BULK_COPY_H_

#include <cstddef>

namespace flagos::hostcopy {

// Copies below this many bytes are plain memcpy (the destination likely
// read soon, and in cache).
inline constexpr size_t kStreamingMinBytes = size_t{1} << 20;

// Copies `n` bytes from `src` to `dst`. From kStreamingMinBytes on, with
// non-temporal stores where the CPU has them (x86-64) and the destination's
// pages are present; otherwise memcpy, or memmove when the ranges overlap.
void BulkCopy(void* dst, const void* src, size_t n);

// Readies [dst, dst + n) for a copy into it: when the range is at least
// kStreamingMinBytes and its first or last page is not present, advises
// transparent huge pages for the 2 MiB-aligned part inside it (what torch's
// CPU allocator does itself under THP_MEM_ALLOC_ENABLE=1). Bytes and pages
// already there are untouched. The kernel follows the advice in its
// "madvise" and "always" modes.
void PrepareDestination(void* dst, size_t n);

}  // namespace flagos::hostcopy

#endif  // FLAGOS_HOSTCOPY_BULK_COPY_H_
