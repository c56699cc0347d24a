// detail::stream_copy against memcpy: every alignment of source and
// destination within a vector register, sizes around the 64-byte body and
// its tails, and the bytes on either side of the destination left alone.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pdcoll/detail/stream_copy.hpp"

TEST_CASE("stream_copy copies exactly the bytes asked for, at every alignment, and touches nothing around them") {
  constexpr std::size_t guard = 64;
  int wrong = 0;
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{63},
                            std::size_t{64}, std::size_t{65}, std::size_t{79}, std::size_t{80}, std::size_t{127},
                            std::size_t{128}, std::size_t{129}, std::size_t{1000}, std::size_t{4103},
                            std::size_t{100003}}) {
    for (std::size_t src_offset = 0; src_offset < 17; ++src_offset) {
      for (std::size_t dst_offset = 0; dst_offset < 17; ++dst_offset) {
        std::vector<std::uint8_t> src(bytes + 2 * guard), dst(bytes + 2 * guard);
        for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 131 + bytes + src_offset);
        for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<std::uint8_t>(0xA5 ^ i);
        const std::vector<std::uint8_t> before = dst;
        pdcoll::detail::stream_copy(dst.data() + dst_offset, src.data() + src_offset, bytes);
        bool right = true;
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dst_offset && i < dst_offset + bytes;
          const std::uint8_t want = inside ? src[i - dst_offset + src_offset] : before[i];
          right = right && dst[i] == want;
        }
        if (!right) {
          ++wrong;
          MESSAGE("bytes " << bytes << " src offset " << src_offset << " dst offset " << dst_offset);
        }
      }
    }
  }
  CHECK(wrong == 0);
}
