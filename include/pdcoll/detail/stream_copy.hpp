// File: detail/stream_copy.hpp — a memcpy whose stores bypass the caches,
// for results written into memory that is not in cache and will not be read
// again soon.
//
// An ordinary store to a line that is not cached first reads the line from
// memory (read for ownership), then writes it back when it is evicted: two
// memory transfers per line written. A non-temporal store goes through the
// write-combining buffers and writes the line once. An out-of-place
// all-reduce through node memory writes its whole output this way: the
// output was last touched when the caller filled or zeroed it, long out of
// cache at tens of MiB, so its lines cost a read each that in place they do
// not (there the output's lines were just read as input). That read is a
// third of the memory traffic of a 2-rank out-of-place all-reduce
// (shared_memory.hpp).
//
// Non-temporal stores are weakly ordered: stream_copy ends with a store
// fence, so a flag raised or a completion signalled after it is seen only
// after the data. Where SSE2 is missing (not x86-64) it is memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pdcoll::detail {

/// Copies `bytes` from `src` to `dst` (which must not overlap) with
/// non-temporal stores for the 16-byte-aligned part of `dst`, then fences
/// them (see the file comment). Meant for destinations that are not in
/// cache and large (hundreds of KiB and up); for small or cached ones plain
/// memcpy is faster.
inline void stream_copy(void* dst, const void* src, std::size_t bytes) noexcept {
#if defined(__SSE2__)
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  const std::size_t misalign = reinterpret_cast<std::uintptr_t>(d) & 15;
  const std::size_t head = misalign ? 16 - misalign : 0;
  if (bytes < head + 64) {
    std::memcpy(d, s, bytes);
    return;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const std::size_t body = bytes & ~std::size_t{63};
  for (std::size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + body, s + body, bytes - body);
  _mm_sfence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace pdcoll::detail
