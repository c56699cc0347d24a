// algo::node_direct (the default reduce-scatter and all-gather) over inproc
// with node memory: threads stand in for the shm ranks, and ThreadSanitizer
// runs this suite. Checked against straightforward references: exact
// rank-order float sums for reduce-scatter, exact copies for all-gather.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>
#include <support/outcome.hpp>
#include <support/reference.hpp>
#include <unit/exec_support.hpp>
#include <unit/node_memory_support.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

namespace {

namespace ex = pdcoll::exec;
using pdcoll::testing::outcome_of;
using namespace std::chrono_literals;

constexpr std::size_t region_bytes = pdcoll::testing::small_region_bytes;
using pdcoll::testing::clear_direct_votes;
using pdcoll::testing::clear_slots;
using pdcoll::testing::slots_untouched;
using pdcoll::testing::contribution;
using pdcoll::testing::rank_order_sum;
using pdcoll::testing::voted_yes;

// Whether `got` is element i's sum in some order: within (P-1) roundings,
// each at most FLT_EPSILON/2 of the magnitude of the partial sum.
bool near_sum(float got, int P, std::size_t i, std::uint64_t salt) {
  double magnitude = 0;
  for (int q = 0; q < P; ++q) magnitude += std::fabs(contribution(q, i, salt));
  return std::fabs(static_cast<double>(got) - rank_order_sum(P, i, salt)) <=
         (P - 1) * static_cast<double>(FLT_EPSILON) * magnitude;
}

// The smallest block (elements) whose whole buffer reaches node_direct_bytes.
std::size_t threshold_block(int P) {
  const auto whole = pdcoll::algo::node_direct_bytes / sizeof(float);
  return (whole + static_cast<std::size_t>(P) - 1) / static_cast<std::size_t>(P);
}

// A small all-reduce (the mailbox path: no vote) as a barrier.
void meet(pdcoll::communicator& comm) {
  std::vector<float> one(1, 1.0f);
  ex::sync_wait(pdcoll::all_reduce(comm, one));
}

struct failure_list {
  std::mutex mutex;
  std::vector<std::string> items;
  void add(std::string s) {
    std::lock_guard lock(mutex);
    items.push_back(std::move(s));
  }
};

// Reduce-scatter of blocks of n from a shareable input (at an offset inside
// its allocation); out of place into an ordinary vector, which peers never
// read. The direct path sums in rank order (bit-exact); the ring in ring
// order (within near_sum). Returns what went wrong ("" when nothing did).
std::string reduce_scatter_case(pdcoll::communicator& comm, std::size_t n, std::uint64_t salt, bool in_place,
                                bool input_shareable, bool rank_order) {
  const int P = comm.world_size(), r = comm.rank();
  const std::size_t total = n * static_cast<std::size_t>(P), mine = n * static_cast<std::size_t>(r);
  pdcoll::memory::host_buffer<float> shared;
  std::vector<float> plain;
  float* base = nullptr;
  if (input_shareable) {
    shared = pdcoll::memory::host::allocate_shareable<float>(total + 2);
    base = shared.data();
  } else {
    plain.resize(total + 2);
    base = plain.data();
  }
  base[0] = base[total + 1] = -1.0f;
  std::span<float> input(base + 1, total);
  for (std::size_t i = 0; i < total; ++i) input[i] = contribution(r, i, salt);
  std::vector<float> separate(n + 2, -1.0f);
  std::span<float> output = in_place ? input.subspan(mine, n) : std::span<float>(separate).subspan(1, n);
  meet(comm);
  const auto ec = outcome_of(pdcoll::reduce_scatter(comm, std::span<const float>(input), output));
  if (ec) return "reduce_scatter failed: " + ec.message();
  for (std::size_t i = 0; i < n; ++i)
    if (rank_order ? output[i] != rank_order_sum(P, mine + i, salt) : !near_sum(output[i], P, mine + i, salt))
      return "reduce_scatter wrong at " + std::to_string(i);
  for (std::size_t i = 0; i < total && !in_place; ++i)
    if (input[i] != contribution(r, i, salt)) return "reduce_scatter changed its input at " + std::to_string(i);
  if (base[0] != -1.0f || base[total + 1] != -1.0f || separate.front() != -1.0f || separate.back() != -1.0f)
    return "reduce_scatter wrote outside its buffers";
  return {};
}

// All-gather of n per rank: out of place from a shareable input into an
// ordinary vector; in place on a shareable output.
std::string all_gather_case(pdcoll::communicator& comm, std::size_t n, std::uint64_t salt, bool in_place,
                            bool input_shareable) {
  const int P = comm.world_size(), r = comm.rank();
  const std::size_t total = n * static_cast<std::size_t>(P), mine = n * static_cast<std::size_t>(r);
  auto make = [&](std::size_t count, pdcoll::memory::host_buffer<float>& shared, std::vector<float>& plain) {
    if (input_shareable) {
      shared = pdcoll::memory::host::allocate_shareable<float>(count + 2);
      std::fill(shared.data(), shared.data() + count + 2, -1.0f);
      return shared.data();
    }
    plain.assign(count + 2, -1.0f);
    return plain.data();
  };
  pdcoll::memory::host_buffer<float> shared_in, shared_out;
  std::vector<float> plain_in, plain_out, separate(total + 2, -1.0f);
  float* const out_base = in_place ? make(total, shared_out, plain_out) : separate.data();
  std::span<float> output(out_base + 1, total);
  float* const in_base = in_place ? nullptr : make(n, shared_in, plain_in);
  std::span<float> input = in_place ? output.subspan(mine, n) : std::span<float>(in_base + 1, n);
  for (std::size_t i = 0; i < n; ++i) input[i] = contribution(r, i, salt);
  meet(comm);
  const auto ec = outcome_of(pdcoll::all_gather(comm, std::span<const float>(input), output));
  if (ec) return "all_gather failed: " + ec.message();
  for (int q = 0; q < P; ++q)
    for (std::size_t i = 0; i < n; ++i)
      if (output[static_cast<std::size_t>(q) * n + i] != contribution(q, i, salt))
        return "all_gather wrong in block " + std::to_string(q) + " at " + std::to_string(i);
  if (out_base[0] != -1.0f || out_base[total + 1] != -1.0f) return "all_gather wrote outside its output";
  return {};
}

}  // namespace

TEST_CASE("default reduce-scatter and all-gather on shareable inputs run directly: exact results on every rank, 2 to 8 ranks, in and out of place") {
  for (int P : {2, 3, 4, 5, 8}) {
    CAPTURE(P);
    failure_list failures;
    pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
      std::uint64_t salt = 10;
      const std::size_t t = threshold_block(P);
      // The threshold, an odd block, and one far larger than a slot.
      for (std::size_t n : {t, t + 7, 5 * t + 3}) {
        for (bool in_place : {true, false}) {
          for (bool gather : {false, true}) {
            ++salt;
            clear_direct_votes(comm);
            auto msg = gather ? all_gather_case(comm, n, salt, in_place, true)
                              : reduce_scatter_case(comm, n, salt, in_place, true, true);
            if (msg.empty() && !voted_yes(comm)) msg = "the direct path did not run";
            if (!msg.empty())
              failures.add("rank " + std::to_string(comm.rank()) + " n=" + std::to_string(n) +
                           (in_place ? " in place: " : ": ") + msg);
          }
        }
      }
    }, {}, region_bytes);
    for (const auto& f : failures.items) MESSAGE(f);
    CHECK(failures.items.empty());
  }
}

TEST_CASE("reduce-scatter and all-gather fall back when one rank's input is ordinary or the buffer is small: through the slots on 3 or more ranks, by the ring on 2, with exact results") {
  for (int P : {2, 3, 5}) {
    CAPTURE(P);
    failure_list failures;
    pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
      const int r = comm.rank();
      std::uint64_t salt = 60;
      for (int plain : {0, P - 1, -1}) {  // the rank with ordinary memory (-1: none, and a small buffer)
        const std::size_t n = plain < 0 ? threshold_block(P) - 1 : threshold_block(P) + 2;
        for (bool in_place : {true, false}) {
          for (bool gather : {false, true}) {
            ++salt;
            clear_direct_votes(comm);
            meet(comm);  // no peer reads this rank's slots any more
            clear_slots(comm);
            const bool shareable = r != plain;
            auto msg = gather ? all_gather_case(comm, n, salt, in_place, shareable)
                              : reduce_scatter_case(comm, n, salt, in_place, shareable, false);
            if (msg.empty() && voted_yes(comm)) msg = "voted for the direct path";
            if (msg.empty() && slots_untouched(comm) == (P > 2))
              msg = P > 2 ? "the slots were not used" : "the slots were used on 2 ranks";
            if (!msg.empty())
              failures.add("rank " + std::to_string(r) + " plain rank " + std::to_string(plain) +
                           (in_place ? " in place: " : ": ") + msg);
          }
        }
      }
    }, {}, region_bytes);
    for (const auto& f : failures.items) MESSAGE(f);
    CHECK(failures.items.empty());
  }
}

TEST_CASE("reduce-scatters and all-gathers in flight with direct and chunked all-reduces stay exact, direct or not, with one or many reserved slot steps") {
  // Small regions: the fallback through the slots reserves many steps; large
  // ones (1 MiB slots): a single step, the other parity's skip.
  const std::size_t large_region = pdcoll::detail::node_slot_offset + 2 * (std::size_t{1} << 20);
  for (std::size_t region : {region_bytes, large_region}) {
    for (int P : {2, 3}) {
      CAPTURE(region);
      CAPTURE(P);
      failure_list failures;
      pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
        const int r = comm.rank();
        const std::size_t n = threshold_block(P) + 5, total = n * static_cast<std::size_t>(P);
        for (std::uint64_t round = 0; round < 6; ++round) {
          const std::uint64_t salt = 200 + 10 * round;
          // Odd rounds: the last rank's reduce-scatter input is ordinary, so
          // it answers at once and every rank falls back (the slots on 3
          // ranks, the ring on 2) while the others run directly.
          const bool plain = round % 2 == 1 && r == P - 1;
          auto rs_shared = plain ? pdcoll::memory::host_buffer<float>{} : pdcoll::memory::host::allocate_shareable<float>(total);
          std::vector<float> rs_plain(plain ? total : 0);
          std::span<float> rs_in = plain ? std::span<float>(rs_plain) : rs_shared.span();
          auto ag_in = pdcoll::memory::host::allocate_shareable<float>(n);
          auto direct = pdcoll::memory::host::allocate_shareable<float>(total);
          std::vector<float> rs_out(n), ag_out(total), chunked(total + 9);
          for (std::size_t i = 0; i < total; ++i) rs_in[i] = contribution(r, i, salt);
          for (std::size_t i = 0; i < n; ++i) ag_in.data()[i] = contribution(r, i, salt + 1);
          for (std::size_t i = 0; i < total; ++i) direct.data()[i] = contribution(r, i, salt + 2);
          for (std::size_t i = 0; i < chunked.size(); ++i) chunked[i] = contribution(r, i, salt + 3);
          namespace algo = pdcoll::algo;
          try {
            ex::sync_wait(ex::when_all(pdcoll::reduce_scatter(comm, std::span<const float>(rs_in), std::span<float>(rs_out)),
                                       pdcoll::all_reduce<algo::shared_memory_scatter>(comm, std::span<float>(chunked)),
                                       pdcoll::all_gather(comm, std::span<const float>(ag_in.span()), std::span<float>(ag_out)),
                                       pdcoll::all_reduce<algo::shared_memory_scatter>(comm, direct.span())));
          } catch (const std::system_error& e) {
            failures.add("rank " + std::to_string(r) + " round " + std::to_string(round) + ": " + e.what());
            return;
          }
          // The ring (2 ranks, odd rounds) sums in ring order: near_sum.
          bool right = true;
          for (std::size_t i = 0; i < n && right; ++i) right = near_sum(rs_out[i], P, r * n + i, salt);
          for (std::size_t i = 0; i < total && right; ++i) right = ag_out[i] == contribution(static_cast<int>(i / n), i % n, salt + 1);
          for (std::size_t i = 0; i < total && right; ++i) right = direct.data()[i] == rank_order_sum(P, i, salt + 2);
          for (std::size_t i = 0; i < chunked.size() && right; ++i) right = chunked[i] == rank_order_sum(P, i, salt + 3);
          if (!right) {
            failures.add("rank " + std::to_string(r) + " round " + std::to_string(round) + ": wrong result");
            return;
          }
        }
      }, {}, region);
      for (const auto& f : failures.items) MESSAGE(f);
      CHECK(failures.items.empty());
    }
  }
}

TEST_CASE("a direct reduce-scatter whose peer never joins times out, marks its step abandoned, and its buffer keeps its pages") {
  auto fabric = pdcoll::transport::inproc::fabric::create(2);
  fabric->enable_node_memory(region_bytes);
  pdcoll::communicator_options o;
  o.timeout = 200ms;
  pdcoll::communicator comm(fabric->endpoint_for(0), o);
  pdcoll::communicator absent(fabric->endpoint_for(1), o);  // never joins
  const std::size_t n = threshold_block(2);
  auto in = pdcoll::memory::host::allocate_shareable<float>(2 * n);
  std::vector<float> out(n);
  const auto ec = outcome_of(pdcoll::reduce_scatter(comm, std::span<const float>(in.span()), std::span<float>(out)));
  CHECK(ec == pdcoll::errc::timeout);
  // The step is marked abandoned, so a peer still reading fails its release.
  auto& flags = pdcoll::detail::flags_of(*comm.endpoint().shared_node_memory(), 0);
  CHECK((pdcoll::detail::load_flag(flags.direct_abandoned[0]) | pdcoll::detail::load_flag(flags.direct_abandoned[1])) != 0);
  // Freeing the input leaves the file its pages: a peer may still read them.
  const auto range = pdcoll::memory::find_shareable(in.data(), 2 * n * sizeof(float));
  REQUIRE(range);
  const int kept = ::dup(static_cast<int>(range->fd));
  REQUIRE(kept >= 0);
  const std::size_t mapped = in.mapped_bytes();
  in.reset();
  struct stat st {};
  REQUIRE(::fstat(kept, &st) == 0);
  CHECK(static_cast<std::size_t>(st.st_size) == mapped);
  ::close(kept);
}

TEST_CASE("a direct all-gather whose output reaches node_direct_gather_stream_bytes (non-temporal stores) stays exact") {
  const std::size_t n = pdcoll::algo::node_direct_gather_stream_bytes / sizeof(float) / 2 + 5;
  failure_list failures;
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    std::uint64_t salt = 400;
    for (bool in_place : {true, false}) {
      clear_direct_votes(comm);
      auto msg = all_gather_case(comm, n, ++salt, in_place, true);
      if (msg.empty() && !voted_yes(comm)) msg = "the direct path did not run";
      if (!msg.empty()) failures.add("rank " + std::to_string(comm.rank()) + (in_place ? " in place: " : ": ") + msg);
    }
  }, {}, region_bytes);
  for (const auto& f : failures.items) MESSAGE(f);
  CHECK(failures.items.empty());
}

namespace {

// A direct reduce-scatter of T with Op, checked against the reference
// within the tolerance that follows from the order of reduction.
template <class T, class Op>
std::string typed_reduce_scatter(pdcoll::communicator& comm, std::size_t n, std::uint64_t salt, bool in_place) {
  const int P = comm.world_size(), r = comm.rank();
  const std::size_t total = n * static_cast<std::size_t>(P), mine = n * static_cast<std::size_t>(r);
  auto in = pdcoll::memory::host::allocate_shareable<T>(total);
  const auto values = pdcoll::testing::make_input<T>(salt, r, total, std::is_same_v<Op, pdcoll::op::prod_t>);
  std::copy(values.begin(), values.end(), in.data());
  std::vector<T> separate(in_place ? 0 : n);
  const std::span<T> out = in_place ? in.span().subspan(mine, n) : std::span<T>(separate);
  clear_direct_votes(comm);
  meet(comm);
  const auto ec = outcome_of(pdcoll::reduce_scatter(comm, std::span<const T>(in.span()), out, Op{}));
  if (ec) return "failed: " + ec.message();
  if (auto msg = pdcoll::testing::check_reduced<T, Op>(out.data(), n, salt, P, mine); !msg.empty()) return msg;
  return voted_yes(comm) ? std::string{} : "the direct path did not run";
}

}  // namespace

TEST_CASE("direct reduce-scatters of int32 sums, double averages, bfloat16 sums and float products match the reference") {
  for (int P : {3, 4}) {
    CAPTURE(P);
    failure_list failures;
    pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
      // Blocks of the threshold's bytes in the widest type cover it in every type.
      const std::size_t n = threshold_block(P) + 3;
      std::uint64_t salt = 500;
      for (bool in_place : {true, false}) {
        const std::string where = "rank " + std::to_string(comm.rank()) + (in_place ? " in place " : " ");
        auto note = [&](const char* what, const std::string& msg) {
          if (!msg.empty()) failures.add(where + what + ": " + msg);
        };
        note("int32 sum", typed_reduce_scatter<std::int32_t, pdcoll::op::sum_t>(comm, n, ++salt, in_place));
        note("double avg", typed_reduce_scatter<double, pdcoll::op::avg_t>(comm, n, ++salt, in_place));
        note("bfloat16 sum", typed_reduce_scatter<pdcoll::bfloat16, pdcoll::op::sum_t>(comm, 2 * n, ++salt, in_place));
        note("float prod", typed_reduce_scatter<float, pdcoll::op::prod_t>(comm, n, ++salt, in_place));
      }
    }, {}, region_bytes);
    for (const auto& f : failures.items) MESSAGE(f);
    CHECK(failures.items.empty());
  }
}
