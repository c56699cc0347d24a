// Unit tests: the 16-bit collective signature (detail/tags.hpp) that ranks
// compare to catch mismatched collectives. Every defining field must reach
// it, and it must spread values as a random 16-bit function would.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <set>

#include "pdcoll/detail/tags.hpp"

using pdcoll::detail::collective_signature;

namespace {

struct fields {
  std::uint32_t kind;
  std::uint64_t count;
  std::uint32_t type;
  std::uint32_t op;
  std::int32_t root;
  std::uint16_t signature() const { return collective_signature(kind, count, type, op, root); }
};

}  // namespace

TEST_SUITE("collectives.signature") {

TEST_CASE("changing any one field changes the signature, but for the 2^-16 chance of a collision") {
  std::mt19937_64 rng(20261122);
  constexpr int samples = 20000;
  int same[5] = {};
  for (int i = 0; i < samples; ++i) {
    const fields f{static_cast<std::uint32_t>(rng() % 8), rng() % (1ull << 40), static_cast<std::uint32_t>(rng() % 16),
                   static_cast<std::uint32_t>(rng() % 256), static_cast<std::int32_t>(rng() % 1024)};
    const auto s = f.signature();
    fields g = f;
    g.kind ^= 1;
    same[0] += g.signature() == s;
    g = f;
    g.count += 1;
    same[1] += g.signature() == s;
    g = f;
    g.type ^= 1;
    same[2] += g.signature() == s;
    g = f;
    g.op ^= 1;
    same[3] += g.signature() == s;
    g = f;
    g.root += 1;
    same[4] += g.signature() == s;
  }
  // Expected 0.3 of 20000 per field for a random function; a field left
  // out of the hash would give 20000.
  for (int field = 0; field < 5; ++field) {
    CAPTURE(field);
    CHECK(same[field] <= 5);
  }
}

TEST_CASE("consecutive counts spread over the 16-bit range at least as a random function's values would") {
  std::set<std::uint16_t> seen;
  constexpr std::uint64_t counts = 1u << 16;
  for (std::uint64_t n = 0; n < counts; ++n) seen.insert(collective_signature(1, n, 3, 0, 0));
  // A random function hits 1 - 1/e of 2^16 values (about 41427, sd about
  // 110); one that mixed only the count's low byte would hit 256.
  CHECK(seen.size() > 40800);
}

}  // TEST_SUITE
