// algo::shared_memory, algo::shared_memory_scatter and the signature check
// through node memory, over
// inproc with node memory (threads stand in for the shm ranks; this is the
// suite ThreadSanitizer runs on them).
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>
#include <support/outcome.hpp>
#include <unit/exec_support.hpp>
#include <unit/node_memory_support.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace {

namespace ex = pdcoll::exec;
using pdcoll::testing::outcome_of;
using namespace std::chrono_literals;

constexpr std::size_t region_bytes = pdcoll::testing::small_region_bytes;
using pdcoll::testing::contribution;

// What every rank must get: contributions combined in rank order, which is
// the order both shared-memory algorithms reduce in (so float results are exact).
std::vector<float> expected_sum(int P, std::size_t n, std::uint64_t salt) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    float acc = contribution(0, i, salt);
    for (int r = 1; r < P; ++r) acc += contribution(r, i, salt);
    out[i] = acc;
  }
  return out;
}

pdcoll::communicator_options quick(std::chrono::milliseconds timeout) {
  pdcoll::communicator_options o;
  o.timeout = timeout;
  return o;
}

}  // namespace

TEST_CASE_TEMPLATE("shared-memory all-reduce: exact rank-order float sums and int32 max, in and out of place, 1 to 8 ranks",
                   Algo, pdcoll::algo::shared_memory, pdcoll::algo::shared_memory_scatter) {
  for (int P : {1, 2, 3, 5, 8}) {
    CAPTURE(P);
    std::mutex failures_mutex;
    std::vector<std::string> failures;
    pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
      CHECK(comm.endpoint().shared_node_memory() != nullptr);
      const int r = comm.rank();
      std::uint64_t salt = 0;
      // 4000: the largest kind of buffer shared_memory runs as the operation's
      // one-step path (node_small_all_reduce.hpp); 7169: one element more than
      // a chunk, so the last chunk has fewer elements than ranks.
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t(P - 1 > 0 ? P - 1 : 0), std::size_t(P + 1),
                            std::size_t{4000}, std::size_t{7169}, std::size_t{20000}}) {
        for (bool in_place : {true, false}) {
          ++salt;
          std::vector<float> in(n), out(n, -1.0f);
          for (std::size_t i = 0; i < n; ++i) in[i] = contribution(r, i, salt);
          auto ec = in_place ? outcome_of(pdcoll::all_reduce<Algo>(comm, in))
                             : outcome_of(pdcoll::all_reduce<Algo>(comm, std::span<const float>(in), out));
          const auto& got = in_place ? in : out;
          const bool right = !ec && got == expected_sum(P, n, salt);
          std::vector<std::int32_t> m(n);
          for (std::size_t i = 0; i < n; ++i) m[i] = static_cast<std::int32_t>((i * 13 + static_cast<std::size_t>(r) * 101) % 977);
          auto ec2 = outcome_of(pdcoll::all_reduce<Algo>(comm, m, pdcoll::op::max));
          bool max_right = !ec2;
          for (std::size_t i = 0; i < n && max_right; ++i) {
            std::int32_t want = 0;
            for (int q = 0; q < P; ++q) want = std::max(want, static_cast<std::int32_t>((i * 13 + static_cast<std::size_t>(q) * 101) % 977));
            max_right = m[i] == want;
          }
          if (!right || !max_right) {
            std::lock_guard lock(failures_mutex);
            failures.push_back("rank " + std::to_string(r) + " n=" + std::to_string(n) + (in_place ? " in place" : "") +
                               (ec ? " " + ec.message() : "") + (right ? "" : " sum wrong") + (max_right ? "" : " max wrong"));
          }
        }
      }
    }, {}, region_bytes);
    for (const auto& f : failures) MESSAGE(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("out-of-place shared_memory_scatter all-reduces from node_stream_output_bytes up (non-temporal stores) stay exact") {
  // One element over the threshold and an odd count, so the last chunk and
  // every block end off a 16-byte boundary; output misaligned by one float.
  const std::size_t n = pdcoll::algo::node_stream_output_bytes / sizeof(float) + 2049;
  for (int P : {2, 3}) {
    CAPTURE(P);
    std::mutex failures_mutex;
    std::vector<std::string> failures;
    pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
      const int r = comm.rank();
      std::vector<float> in(n), out_storage(n + 2, -1.0f);
      for (std::size_t i = 0; i < n; ++i) in[i] = contribution(r, i, 7);
      std::span<float> out(out_storage.data() + 1, n);
      auto ec = outcome_of(pdcoll::all_reduce<pdcoll::algo::shared_memory_scatter>(comm, std::span<const float>(in), out));
      const auto want = expected_sum(P, n, 7);
      const bool right = !ec && std::equal(out.begin(), out.end(), want.begin()) && out_storage.front() == -1.0f &&
                         out_storage.back() == -1.0f;
      if (!right) {
        std::lock_guard lock(failures_mutex);
        failures.push_back("rank " + std::to_string(r) + (ec ? " " + ec.message() : " wrong values"));
      }
    }, {}, region_bytes);
    for (const auto& f : failures) MESSAGE(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("shared_memory and shared_memory_scatter all-reduces in flight together interleave their chunks correctly") {
  const int P = 3;
  std::mutex failures_mutex;
  int wrong = 0;
  pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
    const int r = comm.rank();
    for (int round = 0; round < 5; ++round) {
      // 1 and 3000 floats take shared_memory's one-step path, 9000 its chunks.
      const std::array<std::size_t, 7> n{9000, 1, 30000, 0, 20000, 2, 3000};
      std::array<std::vector<float>, 7> b;
      for (std::size_t k = 0; k < b.size(); ++k) {
        b[k].resize(n[k]);
        for (std::size_t i = 0; i < n[k]; ++i) b[k][i] = contribution(r, i, 100 + k + 10 * static_cast<std::uint64_t>(round));
      }
      namespace algo = pdcoll::algo;
      ex::sync_wait(ex::when_all(pdcoll::all_reduce<algo::shared_memory>(comm, b[0]),
                                 pdcoll::all_reduce<algo::shared_memory>(comm, b[1]),
                                 pdcoll::all_reduce<algo::ring>(comm, b[2]),
                                 pdcoll::all_reduce<algo::shared_memory>(comm, b[3]),
                                 pdcoll::all_reduce<algo::shared_memory_scatter>(comm, b[4]),
                                 pdcoll::all_reduce<algo::shared_memory_scatter>(comm, b[5]),
                                 pdcoll::all_reduce<algo::shared_memory>(comm, b[6])));
      for (std::size_t k : {0u, 1u, 3u, 4u, 5u, 6u}) {
        if (b[k] != expected_sum(P, n[k], 100 + k + 10 * static_cast<std::uint64_t>(round))) {
          std::lock_guard lock(failures_mutex);
          ++wrong;
        }
      }
    }
  }, {}, region_bytes);
  CHECK(wrong == 0);
}

TEST_CASE("small all-reduces on the one-step path, broadcasts and chunked all-reduces in turn stay exact, checked or not") {
  // More rounds than the signature check's ring has entries, so its entries
  // and the steps' slots are reused many times by both paths.
  for (bool verify : {true, false}) {
    CAPTURE(verify);
    auto options = quick(10s);
    options.verify_collectives = verify;
    std::mutex failures_mutex;
    std::vector<std::string> failures;
    pdcoll::testing::run_inproc(3, [&](pdcoll::communicator& comm) {
      const int r = comm.rank();
      for (std::uint64_t round = 0; round < 300; ++round) {
        const std::size_t n = round % 3 == 2 ? 9000 : 1 + round % 50 * 40;  // one-step path but every third
        std::vector<float> data(n);
        for (std::size_t i = 0; i < n; ++i) data[i] = contribution(r, i, round);
        const bool sum_right = !outcome_of(pdcoll::all_reduce(comm, data)) && data == expected_sum(3, n, round);
        std::vector<float> bcast(17, static_cast<float>(r == static_cast<int>(round % 3) ? round : 0));
        const bool bcast_right = !outcome_of(pdcoll::broadcast(comm, bcast, static_cast<int>(round % 3))) &&
                                 bcast[16] == static_cast<float>(round);
        if (!sum_right || !bcast_right) {
          std::lock_guard lock(failures_mutex);
          failures.push_back("rank " + std::to_string(r) + " round " + std::to_string(round));
        }
      }
    }, options, region_bytes);
    for (const auto& f : failures) MESSAGE(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("with node memory, a rank calling broadcast while the others all-reduce fails every rank with collective_mismatch") {
  std::mutex m;
  std::vector<std::error_code> codes;
  pdcoll::testing::run_inproc(3, [&](pdcoll::communicator& comm) {
    std::vector<float> data(100, 1.0f);
    auto ec = comm.rank() == 1 ? outcome_of(pdcoll::broadcast(comm, data, 0))
                               : outcome_of(pdcoll::all_reduce<pdcoll::algo::shared_memory>(comm, data));
    std::lock_guard lock(m);
    codes.push_back(ec);
  }, quick(10s), region_bytes);
  REQUIRE(codes.size() == 3);
  for (auto ec : codes) CHECK(ec == pdcoll::errc::collective_mismatch);
}

TEST_CASE_TEMPLATE("a shared-memory all-reduce whose peer never joins times out, and later operations fail at once", Algo,
                   pdcoll::algo::shared_memory, pdcoll::algo::shared_memory_scatter) {
  pdcoll::testing::run_inproc(2, [&](pdcoll::communicator& comm) {
    if (comm.rank() == 1) return;  // never joins
    std::vector<float> data(5000, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    CHECK(outcome_of(pdcoll::all_reduce<Algo>(comm, data)) == pdcoll::errc::timeout);
    CHECK(std::chrono::steady_clock::now() - start < 2s);
    CHECK(outcome_of(pdcoll::all_reduce<Algo>(comm, data)) == pdcoll::errc::aborted);
  }, quick(300ms), region_bytes);
}

TEST_CASE("a communicator destroyed under a pending all-reduce on node memory completes it with aborted, at once") {
  for (bool shared : {true, false}) {  // shared_memory's flags, or only the signature check's
    CAPTURE(shared);
    auto fabric = pdcoll::transport::inproc::fabric::create(2);
    fabric->enable_node_memory(region_bytes);
    auto comm = std::make_unique<pdcoll::communicator>(fabric->endpoint_for(0), quick(10s));
    pdcoll::communicator absent(fabric->endpoint_for(1), quick(10s));  // never joins
    std::vector<float> data(5000, 1.0f);
    ex::test::record rec;
    auto sender = shared ? pdcoll::all_reduce<pdcoll::algo::shared_memory>(*comm, data)
                         : pdcoll::all_reduce<pdcoll::algo::ring>(*comm, data);
    auto op = ex::connect(std::move(sender), ex::test::recording_receiver{&rec});
    ex::start(op);
    const auto start = std::chrono::steady_clock::now();
    comm.reset();
    CHECK(std::chrono::steady_clock::now() - start < 500ms);
    CHECK(rec.done.load());
    CHECK(rec.error == pdcoll::errc::aborted);
  }
}

TEST_CASE("node memory smaller than min_node_memory_bytes is not offered, and shared_memory runs the ring") {
  pdcoll::testing::run_inproc(2, [](pdcoll::communicator& comm) {
    CHECK(comm.endpoint().shared_node_memory() == nullptr);
    std::vector<float> data(1000, 1.0f);
    ex::sync_wait(pdcoll::all_reduce<pdcoll::algo::shared_memory>(comm, data));
    CHECK(data[999] == 2.0f);
  }, {}, pdcoll::transport::min_node_memory_bytes - 1);
}

namespace {

using pdcoll::testing::clear_slots;
using pdcoll::testing::slots_untouched;

// A small all-reduce (the mailbox path: no slot) as a barrier, so no rank
// clears its slots while a peer still reads them.
void meet(pdcoll::communicator& comm) {
  std::vector<float> one(1, 1.0f);
  ex::sync_wait(pdcoll::all_reduce(comm, one));
}

// Clears this rank's slots once no rank still reads them, and returns once
// every rank has: the next collective's slot writes are then the only ones.
void fresh_slots_of(pdcoll::communicator& comm) {
  meet(comm);
  clear_slots(comm);
  meet(comm);
}

}  // namespace

TEST_CASE("shared_memory_scatter over shareable buffers on every rank reduces in place on them: exact sums, no slot written, 2 to 8 ranks") {
  constexpr std::size_t threshold = pdcoll::algo::node_direct_bytes / sizeof(float);
  for (int P : {2, 3, 4, 5, 8}) {
    CAPTURE(P);
    std::mutex failures_mutex;
    std::vector<std::string> failures;
    pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
      const int r = comm.rank();
      std::uint64_t salt = 40;
      // The threshold itself, an odd count one element over a block
      // boundary, and a count that takes many slot-sized chunks.
      for (std::size_t n : {threshold, threshold + static_cast<std::size_t>(P) + 1, 3 * threshold + 7}) {
        for (bool in_place : {true, false}) {
          ++salt;
          // Ranges inside larger allocations (offset by one float), so the
          // offsets travel too.
          auto in = pdcoll::memory::host::allocate_shareable<float>(n + 2);
          auto out = pdcoll::memory::host::allocate_shareable<float>(n + 2);
          std::span<float> input(in.data() + 1, n), output(out.data() + 1, n);
          for (std::size_t i = 0; i < n; ++i) input[i] = contribution(r, i, salt);
          std::fill(out.data(), out.data() + n + 2, -1.0f);
          meet(comm);
          clear_slots(comm);
          meet(comm);
          auto ec = in_place ? outcome_of(pdcoll::all_reduce<pdcoll::algo::shared_memory_scatter>(comm, input))
                             : outcome_of(pdcoll::all_reduce<pdcoll::algo::shared_memory_scatter>(
                                   comm, std::span<const float>(input), output));
          const auto& got = in_place ? input : output;
          const auto want = expected_sum(P, n, salt);
          const bool right = !ec && std::equal(got.begin(), got.end(), want.begin());
          const bool untouched = slots_untouched(comm);
          const bool fenced = out.data()[0] == -1.0f && out.data()[n + 1] == -1.0f;
          if (!right || !untouched || !fenced) {
            std::lock_guard lock(failures_mutex);
            failures.push_back("rank " + std::to_string(r) + " n=" + std::to_string(n) + (in_place ? " in place" : "") +
                               (ec ? " " + ec.message() : "") + (right ? "" : " wrong") +
                               (untouched ? "" : " slots written") + (fenced ? "" : " wrote outside the output"));
          }
        }
      }
    }, {}, region_bytes);
    for (const auto& f : failures) MESSAGE(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("shared_memory_scatter falls back to the slots when one rank's buffer is not shareable, or the buffer is below node_direct_bytes") {
  constexpr std::size_t threshold = pdcoll::algo::node_direct_bytes / sizeof(float);
  for (int P : {2, 3, 5}) {
    CAPTURE(P);
    std::mutex failures_mutex;
    std::vector<std::string> failures;
    pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
      const int r = comm.rank();
      std::uint64_t salt = 90;
      for (int plain : {0, P - 1, -1}) {  // the rank with an ordinary vector (-1: none, and a small buffer)
        const std::size_t n = plain < 0 ? threshold - 1 : threshold + 3;
        ++salt;
        std::vector<float> vector_buffer;
        pdcoll::memory::host_buffer<float> shareable_buffer;
        std::span<float> data;
        if (r == plain) {
          vector_buffer.resize(n);
          data = vector_buffer;
        } else {
          shareable_buffer = pdcoll::memory::host::allocate_shareable<float>(n);
          data = shareable_buffer.span();
        }
        for (std::size_t i = 0; i < n; ++i) data[i] = contribution(r, i, salt);
        meet(comm);
        clear_slots(comm);
        meet(comm);
        auto ec = outcome_of(pdcoll::all_reduce<pdcoll::algo::shared_memory_scatter>(comm, data));
        const auto want = expected_sum(P, n, salt);
        const bool right = !ec && std::equal(data.begin(), data.end(), want.begin());
        const bool copied = !slots_untouched(comm);
        if (!right || !copied) {
          std::lock_guard lock(failures_mutex);
          failures.push_back("rank " + std::to_string(r) + " plain rank " + std::to_string(plain) +
                             (ec ? " " + ec.message() : "") + (right ? "" : " wrong") +
                             (copied ? "" : " slots unused"));
        }
      }
    }, {}, region_bytes);
    for (const auto& f : failures) MESSAGE(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("direct all-reduces in flight with chunked and one-step ones leave every later step its slot") {
  constexpr std::size_t threshold = pdcoll::algo::node_direct_bytes / sizeof(float);
  const int P = 3;
  std::mutex failures_mutex;
  int wrong = 0;
  pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
    const int r = comm.rank();
    for (std::uint64_t round = 0; round < 4; ++round) {
      // Direct (shareable, large), chunked (vector, large), one-step (small), direct again.
      auto a = pdcoll::memory::host::allocate_shareable<float>(threshold + 5);
      std::vector<float> b(threshold + 11), c(7);
      auto d = pdcoll::memory::host::allocate_shareable<float>(2 * threshold);
      std::array<std::span<float>, 4> spans{a.span(), std::span<float>(b), std::span<float>(c), d.span()};
      for (std::size_t k = 0; k < spans.size(); ++k)
        for (std::size_t i = 0; i < spans[k].size(); ++i) spans[k][i] = contribution(r, i, 300 + 10 * round + k);
      namespace algo = pdcoll::algo;
      ex::sync_wait(ex::when_all(pdcoll::all_reduce<algo::shared_memory_scatter>(comm, spans[0]),
                                 pdcoll::all_reduce<algo::shared_memory_scatter>(comm, spans[1]),
                                 pdcoll::all_reduce<algo::shared_memory>(comm, spans[2]),
                                 pdcoll::all_reduce<algo::shared_memory_scatter>(comm, spans[3])));
      for (std::size_t k = 0; k < spans.size(); ++k) {
        const auto want = expected_sum(P, spans[k].size(), 300 + 10 * round + k);
        if (!std::equal(spans[k].begin(), spans[k].end(), want.begin())) {
          std::lock_guard lock(failures_mutex);
          ++wrong;
        }
      }
    }
  }, {}, region_bytes);
  CHECK(wrong == 0);
}

TEST_CASE("a direct all-reduce that finishes before the chunked one started ahead of it leaves that one's last step alone") {
  // X (chunked, ordinary memory) then D (direct) in flight together, then Y
  // (chunked) alone: D may complete while X still reads its last step's
  // slots, and must not mark that step consumed for X.
  constexpr std::size_t threshold = pdcoll::algo::node_direct_bytes / sizeof(float);
  for (int P : {2, 3}) {
    CAPTURE(P);
    std::mutex failures_mutex;
    int wrong = 0;
    pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
      const int r = comm.rank();
      auto d = pdcoll::memory::host::allocate_shareable<float>(threshold);
      for (std::uint64_t round = 0; round < 20; ++round) {
        // X's size varies, so both parities end X and both step counts occur.
        std::vector<float> x(20000 + 7000 * (round % 3)), y(15000);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] = contribution(r, i, 500 + round);
        for (std::size_t i = 0; i < d.size(); ++i) d.data()[i] = contribution(r, i, 600 + round);
        for (std::size_t i = 0; i < y.size(); ++i) y[i] = contribution(r, i, 700 + round);
        namespace algo = pdcoll::algo;
        bool ok = true;
        try {
          ex::sync_wait(ex::when_all(pdcoll::all_reduce<algo::shared_memory_scatter>(comm, x),
                                     pdcoll::all_reduce<algo::shared_memory_scatter>(comm, d.span())));
        } catch (const std::system_error&) {
          ok = false;
        }
        ok = ok && !outcome_of(pdcoll::all_reduce<algo::shared_memory_scatter>(comm, y));
        const bool right = ok && x == expected_sum(P, x.size(), 500 + round) &&
                           std::equal(d.data(), d.data() + d.size(), expected_sum(P, d.size(), 600 + round).begin()) &&
                           y == expected_sum(P, y.size(), 700 + round);
        if (!right) {
          std::lock_guard lock(failures_mutex);
          ++wrong;
          return;
        }
      }
    }, quick(5s), region_bytes);
    CHECK(wrong == 0);
  }
}

TEST_CASE("shared_memory reduce-scatter and all-gather go through the slots: exact rank-order results, 1 to 8 ranks, in and out of place, one and several chunks") {
  // Slots of 28 KiB: 7168 floats, so an all-gather block of 2·7168+5 takes
  // three steps, and a reduce-scatter block of 2·(7168/P)+3 three too.
  constexpr std::size_t slot_floats = 28 * 1024 / sizeof(float);
  for (int P : {1, 2, 3, 4, 5, 8}) {
    CAPTURE(P);
    const auto Pz = static_cast<std::size_t>(P);
    pdcoll::testing::rank_failures failures;
    pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
      const int r = comm.rank();
      const auto rz = static_cast<std::size_t>(r);
      std::uint64_t salt = 800;
      for (bool in_place : {true, false}) {
        for (std::size_t n : {std::size_t{1}, Pz + 1, 2 * (slot_floats / Pz) + 3, 2 * slot_floats + 5}) {
          const std::string where = "n=" + std::to_string(n) + (in_place ? " in place" : "");
          {  // reduce-scatter
            ++salt;
            std::vector<float> in(n * Pz + 2, -1.0f), separate(n + 2, -1.0f);
            for (std::size_t i = 0; i < n * Pz; ++i) in[i + 1] = contribution(r, i, salt);
            std::span<float> input(in.data() + 1, n * Pz);
            std::span<float> out = in_place ? input.subspan(rz * n, n) : std::span<float>(separate).subspan(1, n);
            fresh_slots_of(comm);
            const auto ec = outcome_of(pdcoll::reduce_scatter<pdcoll::algo::shared_memory>(
                comm, std::span<const float>(input), out));
            bool right = !ec;
            for (std::size_t i = 0; i < n && right; ++i) right = out[i] == pdcoll::testing::rank_order_sum(P, rz * n + i, salt);
            const bool fenced = in.front() == -1.0f && in.back() == -1.0f && separate.front() == -1.0f && separate.back() == -1.0f;
            failures.check(r, "reduce_scatter " + where, ec, right, fenced, P == 1 || !slots_untouched(comm));
          }
          {  // all-gather
            ++salt;
            std::vector<float> out_buffer(n * Pz + 2, -1.0f), separate(n);
            std::span<float> output(out_buffer.data() + 1, n * Pz);
            std::span<float> input = in_place ? output.subspan(rz * n, n) : std::span<float>(separate);
            for (std::size_t i = 0; i < n; ++i) input[i] = contribution(r, i, salt);
            fresh_slots_of(comm);
            const auto ec = outcome_of(pdcoll::all_gather<pdcoll::algo::shared_memory>(
                comm, std::span<const float>(input), output));
            bool right = !ec;
            for (std::size_t i = 0; i < n * Pz && right; ++i) right = output[i] == contribution(static_cast<int>(i / n), i % n, salt);
            const bool fenced = out_buffer.front() == -1.0f && out_buffer.back() == -1.0f;
            failures.check(r, "all_gather " + where, ec, right, fenced, P == 1 || !slots_untouched(comm));
          }
        }
      }
    }, {}, region_bytes);
    failures.report();
  }
}

TEST_CASE("slot reduce-scatters and all-gathers in flight with chunked and one-step all-reduces interleave their steps correctly") {
  const int P = 3;
  std::mutex failures_mutex;
  int wrong = 0;
  pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
    const int r = comm.rank();
    const std::size_t n = 5000;  // several steps of every kind
    for (std::uint64_t round = 0; round < 4; ++round) {
      const std::uint64_t salt = 900 + 10 * round;
      std::vector<float> rs_in(n * P), rs_out(n), ag_in(n), ag_out(n * P), chunked(3 * n), small(5);
      for (std::size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = contribution(r, i, salt);
      for (std::size_t i = 0; i < n; ++i) ag_in[i] = contribution(r, i, salt + 1);
      for (std::size_t i = 0; i < chunked.size(); ++i) chunked[i] = contribution(r, i, salt + 2);
      for (std::size_t i = 0; i < small.size(); ++i) small[i] = contribution(r, i, salt + 3);
      namespace algo = pdcoll::algo;
      ex::sync_wait(ex::when_all(
          pdcoll::reduce_scatter<algo::shared_memory>(comm, std::span<const float>(rs_in), std::span<float>(rs_out)),
          pdcoll::all_reduce<algo::shared_memory_scatter>(comm, std::span<float>(chunked)),
          pdcoll::all_gather<algo::shared_memory>(comm, std::span<const float>(ag_in), std::span<float>(ag_out)),
          pdcoll::all_reduce<algo::shared_memory>(comm, std::span<float>(small))));
      bool right = true;
      for (std::size_t i = 0; i < n && right; ++i) right = rs_out[i] == pdcoll::testing::rank_order_sum(P, r * n + i, salt);
      for (std::size_t i = 0; i < n * P && right; ++i) right = ag_out[i] == contribution(static_cast<int>(i / n), i % n, salt + 1);
      for (std::size_t i = 0; i < chunked.size() && right; ++i) right = chunked[i] == pdcoll::testing::rank_order_sum(P, i, salt + 2);
      for (std::size_t i = 0; i < small.size() && right; ++i) right = small[i] == pdcoll::testing::rank_order_sum(P, i, salt + 3);
      if (!right) {
        std::lock_guard lock(failures_mutex);
        ++wrong;
      }
    }
  }, {}, region_bytes);
  CHECK(wrong == 0);
}

TEST_CASE("shared_memory broadcast, reduce and all-to-all go through the slots: exact results, 1 to 8 ranks, first, middle and last root, in and out of place, one and several chunks") {
  // Slots of 28 KiB: 7168 floats. A broadcast or reduce of 2·7168+5 takes
  // three steps; an all-to-all block of 2·(7168/P)+3 three too.
  constexpr std::size_t slot_floats = 28 * 1024 / sizeof(float);
  for (int P : {1, 2, 3, 4, 5, 8}) {
    CAPTURE(P);
    const auto Pz = static_cast<std::size_t>(P);
    pdcoll::testing::rank_failures failures;
    pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
      const int r = comm.rank();
      const auto rz = static_cast<std::size_t>(r);
      std::uint64_t salt = 1200;
      // Whether this rank's slots were written since they were cleared, as
      // the collective requires: `expected` on ranks that fill a slot.
      auto slots_as_expected = [&](bool expected) { return P == 1 || slots_untouched(comm) != expected; };
      for (int root : {0, P / 2, P - 1}) {
        for (bool in_place : {true, false}) {
          for (std::size_t n : {std::size_t{1}, Pz + 1, slot_floats, 2 * slot_floats + 5}) {
            const std::string where =
                "n=" + std::to_string(n) + " root " + std::to_string(root) + (in_place ? " in place" : "");
            {  // broadcast: only the root fills its slot
              ++salt;
              std::vector<float> buffer(n + 2, -1.0f), separate(n + 2, -1.0f);
              std::span<float> data(buffer.data() + 1, n);
              if (r == root)
                for (std::size_t i = 0; i < n; ++i) data[i] = contribution(root, i, salt);
              std::span<float> out = in_place ? data : std::span<float>(separate).subspan(1, n);
              fresh_slots_of(comm);
              const auto ec = outcome_of(pdcoll::broadcast<pdcoll::algo::shared_memory>(comm, data, out, root));
              bool right = !ec;
              for (std::size_t i = 0; i < n && right; ++i) right = out[i] == contribution(root, i, salt);
              const bool fenced = buffer.front() == -1.0f && buffer.back() == -1.0f && separate.front() == -1.0f &&
                                  separate.back() == -1.0f;
              failures.check(r, "broadcast " + where, ec, right, fenced, slots_as_expected(r == root));
            }
            {  // reduce: every rank but the root fills its slot (an in-place
               // root of rank 2 or later sums through its own)
              ++salt;
              std::vector<float> buffer(n + 2, -1.0f), separate(n + 2, -1.0f);
              std::span<float> input(buffer.data() + 1, n);
              for (std::size_t i = 0; i < n; ++i) input[i] = contribution(r, i, salt);
              // Non-roots pass an output too: it must stay as it was.
              std::span<float> out = in_place ? input : std::span<float>(separate).subspan(1, n);
              fresh_slots_of(comm);
              const auto ec = outcome_of(
                  pdcoll::reduce<pdcoll::algo::shared_memory>(comm, std::span<const float>(input), out, pdcoll::op::sum, root));
              bool right = !ec;
              for (std::size_t i = 0; i < n && right; ++i)
                right = out[i] == (r == root ? pdcoll::testing::rank_order_sum(P, i, salt)
                                             : in_place ? contribution(r, i, salt) : -1.0f);
              const bool fenced = buffer.front() == -1.0f && buffer.back() == -1.0f && separate.front() == -1.0f &&
                                  separate.back() == -1.0f;
              const bool root_sums_in_slot = r == root && in_place && r >= 2;
              failures.check(r, "reduce " + where, ec, right, fenced, slots_as_expected(r != root || root_sums_in_slot));
            }
          }
        }
      }
      // all-to-all (never in place): block q of rank r's output is block r of rank q's input.
      for (std::size_t n : {std::size_t{1}, Pz + 1, 2 * (slot_floats / Pz) + 3}) {
        ++salt;
        std::vector<float> in(n * Pz), buffer(n * Pz + 2, -1.0f);
        for (std::size_t i = 0; i < in.size(); ++i) in[i] = contribution(r, i, salt);
        std::span<float> out(buffer.data() + 1, n * Pz);
        fresh_slots_of(comm);
        const auto ec = outcome_of(pdcoll::all_to_all<pdcoll::algo::shared_memory>(comm, std::span<const float>(in), out));
        bool right = !ec;
        for (std::size_t i = 0; i < n * Pz && right; ++i)
          right = out[i] == contribution(static_cast<int>(i / n), rz * n + i % n, salt);
        const bool fenced = buffer.front() == -1.0f && buffer.back() == -1.0f;
        failures.check(r, "all_to_all n=" + std::to_string(n), ec, right, fenced, slots_as_expected(true));
      }
    }, {}, region_bytes);
    failures.report();
  }
}

TEST_CASE("slot broadcasts, reduces and all-to-alls in flight with a chunked all-reduce interleave their steps correctly") {
  const int P = 3;
  std::mutex failures_mutex;
  int wrong = 0;
  pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
    const int r = comm.rank();
    const std::size_t n = 5000;  // several steps of every kind
    for (std::uint64_t round = 0; round < 4; ++round) {
      const std::uint64_t salt = 1300 + 10 * round;
      const int root = static_cast<int>(round % P);
      std::vector<float> bc(2 * n), red_in(2 * n), red_out(r == root ? 2 * n : 0), a2a_in(n * P), a2a_out(n * P),
          chunked(3 * n);
      if (r == root)
        for (std::size_t i = 0; i < bc.size(); ++i) bc[i] = contribution(root, i, salt);
      for (std::size_t i = 0; i < red_in.size(); ++i) red_in[i] = contribution(r, i, salt + 1);
      for (std::size_t i = 0; i < a2a_in.size(); ++i) a2a_in[i] = contribution(r, i, salt + 2);
      for (std::size_t i = 0; i < chunked.size(); ++i) chunked[i] = contribution(r, i, salt + 3);
      namespace algo = pdcoll::algo;
      ex::sync_wait(ex::when_all(
          pdcoll::broadcast<algo::shared_memory>(comm, std::span<float>(bc), root),
          pdcoll::all_reduce<algo::shared_memory_scatter>(comm, std::span<float>(chunked)),
          pdcoll::reduce<algo::shared_memory>(comm, std::span<const float>(red_in), std::span<float>(red_out),
                                              pdcoll::op::sum, root),
          pdcoll::all_to_all<algo::shared_memory>(comm, std::span<const float>(a2a_in), std::span<float>(a2a_out))));
      bool right = true;
      for (std::size_t i = 0; i < bc.size() && right; ++i) right = bc[i] == contribution(root, i, salt);
      for (std::size_t i = 0; i < red_out.size() && right; ++i)
        right = red_out[i] == pdcoll::testing::rank_order_sum(P, i, salt + 1);
      for (std::size_t i = 0; i < a2a_out.size() && right; ++i)
        right = a2a_out[i] == contribution(static_cast<int>(i / n), static_cast<std::size_t>(r) * n + i % n, salt + 2);
      for (std::size_t i = 0; i < chunked.size() && right; ++i)
        right = chunked[i] == pdcoll::testing::rank_order_sum(P, i, salt + 3);
      if (!right) {
        std::lock_guard lock(failures_mutex);
        ++wrong;
      }
    }
  }, {}, region_bytes);
  CHECK(wrong == 0);
}

TEST_CASE("automatic follows the node's copy verdict: where it favours the slots, broadcasts, all-to-alls, all-gathers and reduce-scatters of every size go through them") {
  // The cases the thresholds send as messages where the verdict favours
  // messages (the test above); all-gathers and reduce-scatters on 2 ranks
  // from automatic_node_slots_bytes(2), below and from node_direct_bytes
  // (ordinary buffers: node_direct's fallback), take the ring there.
  struct expectation {
    int world;
    const char* collective;
    std::size_t floats;  // broadcast: the buffer; the others: one block
    bool bulk_through_slots;
    bool slots;
  };
  namespace algo = pdcoll::algo;
  const std::size_t window_from = algo::automatic::automatic_message_broadcast_from / sizeof(float);
  const std::size_t a2a_slots_2 = algo::automatic::automatic_node_slots_bytes(2) / sizeof(float) / 2;
  const std::size_t a2a_slots_3 = algo::automatic::automatic_node_slots_bytes(3) / sizeof(float) / 3;
  const std::size_t gather_2 = algo::automatic::automatic_node_slots_bytes(2) / sizeof(float) / 2;
  const std::size_t direct_2 = algo::node_direct_bytes / sizeof(float) / 2;
  const expectation cases[] = {
      {2, "broadcast", window_from, true, true},         {2, "all_to_all", a2a_slots_2, true, true},
      {2, "all_to_all", 4 * a2a_slots_2 + 3, true, true}, {3, "all_to_all", a2a_slots_3 + 1, true, true},
      {2, "all_gather", gather_2, true, true},           {2, "all_gather", gather_2, false, false},
      {2, "all_gather", direct_2 + 5, true, true},       {2, "all_gather", direct_2 + 5, false, false},
      {2, "reduce_scatter", gather_2, true, true},       {2, "reduce_scatter", gather_2, false, false},
      {2, "reduce_scatter", direct_2 + 5, true, true},   {2, "reduce_scatter", direct_2 + 5, false, false},
      {3, "all_gather", direct_2, true, true},           {3, "reduce_scatter", direct_2, false, true},
  };
  for (const auto& e : cases) {
    CAPTURE(e.world);
    CAPTURE(e.collective);
    CAPTURE(e.floats);
    CAPTURE(e.bulk_through_slots);
    pdcoll::testing::rank_failures failures;
    pdcoll::testing::run_inproc(e.world, [&](pdcoll::communicator& comm) {
      const int r = comm.rank(), P = comm.world_size();
      const auto Pz = static_cast<std::size_t>(P);
      const std::uint64_t salt = 1500 + e.floats;
      const std::string what = e.collective;
      const std::size_t n = e.floats;
      CHECK(comm.endpoint().shared_node_memory()->bulk_through_slots() == e.bulk_through_slots);
      fresh_slots_of(comm);
      std::error_code ec;
      bool right = false;
      bool involved = true;  // whether this rank's slots show the path
      if (what == "broadcast") {
        std::vector<float> data(n, -1.0f);
        if (r == 0)
          for (std::size_t i = 0; i < n; ++i) data[i] = contribution(0, i, salt);
        ec = outcome_of(pdcoll::broadcast(comm, std::span<float>(data), 0));
        right = !ec;
        for (std::size_t i = 0; i < n && right; ++i) right = data[i] == contribution(0, i, salt);
        involved = r == 0;
      } else if (what == "all_to_all") {
        std::vector<float> in(n * Pz), out(n * Pz);
        for (std::size_t i = 0; i < in.size(); ++i) in[i] = contribution(r, i, salt);
        ec = outcome_of(pdcoll::all_to_all(comm, std::span<const float>(in), std::span<float>(out)));
        right = !ec;
        for (std::size_t i = 0; i < out.size() && right; ++i)
          right = out[i] == contribution(static_cast<int>(i / n), static_cast<std::size_t>(r) * n + i % n, salt);
      } else if (what == "all_gather") {
        std::vector<float> in(n), out(n * Pz);
        for (std::size_t i = 0; i < n; ++i) in[i] = contribution(r, i, salt);
        ec = outcome_of(pdcoll::all_gather(comm, std::span<const float>(in), std::span<float>(out)));
        right = !ec;
        for (std::size_t i = 0; i < out.size() && right; ++i) right = out[i] == contribution(static_cast<int>(i / n), i % n, salt);
      } else {
        std::vector<float> in(n * Pz), out(n);
        for (std::size_t i = 0; i < in.size(); ++i) in[i] = contribution(r, i, salt);
        ec = outcome_of(pdcoll::reduce_scatter(comm, std::span<const float>(in), std::span<float>(out), pdcoll::op::sum));
        const auto sums = expected_sum(P, n * Pz, salt);
        right = !ec;
        for (std::size_t i = 0; i < n && right; ++i) right = out[i] == sums[static_cast<std::size_t>(r) * n + i];
      }
      failures.check(r, what, ec, right, true, !involved || slots_untouched(comm) != e.slots);
    }, {}, region_bytes, e.bulk_through_slots);
    failures.report();
  }
}

TEST_CASE("automatic broadcast, reduce and all-to-all on node memory under the messages verdict (inproc's default): the slots, one message for 2-rank broadcasts from 64 KiB to below 512 KiB, all-to-alls above the slot threshold posted at once") {
  // Which path ran shows in the slots: the root's for a broadcast, the
  // others' for a reduce, every rank's for an all-to-all.
  struct expectation {
    int world;
    const char* collective;
    std::size_t floats;  // broadcast and reduce: the buffer; all-to-all: one block
    bool slots;
  };
  namespace algo = pdcoll::algo;
  const std::size_t window_from = algo::automatic::automatic_message_broadcast_from / sizeof(float);
  const std::size_t window_below = algo::automatic::automatic_message_broadcast_below / sizeof(float);
  const std::size_t a2a_slots_2 = algo::automatic::automatic_node_slots_bytes(2) / sizeof(float) / 2;
  const std::size_t a2a_slots_3 = algo::automatic::automatic_node_slots_bytes(3) / sizeof(float) / 3;
  const expectation cases[] = {
      {2, "broadcast", window_from - 1, true},   {2, "broadcast", window_from, false},
      {2, "broadcast", window_below - 1, false}, {2, "broadcast", window_below, true},
      {3, "broadcast", window_from, true},       {2, "reduce", window_from, true},
      {3, "reduce", window_below, true},         {2, "all_to_all", a2a_slots_2 - 1, true},
      {2, "all_to_all", a2a_slots_2, false},     {3, "all_to_all", a2a_slots_3 - 1, true},
      {3, "all_to_all", a2a_slots_3 + 1, false},
  };
  for (const auto& e : cases) {
    CAPTURE(e.world);
    CAPTURE(e.collective);
    CAPTURE(e.floats);
    pdcoll::testing::rank_failures failures;
    pdcoll::testing::run_inproc(e.world, [&](pdcoll::communicator& comm) {
      const int r = comm.rank(), P = comm.world_size();
      const std::uint64_t salt = 1400 + e.floats;
      const std::string what = e.collective;
      const std::size_t n = e.floats;
      fresh_slots_of(comm);
      if (what == "broadcast") {
        std::vector<float> data(n, -1.0f);
        if (r == 0)
          for (std::size_t i = 0; i < n; ++i) data[i] = contribution(0, i, salt);
        const auto ec = outcome_of(pdcoll::broadcast(comm, std::span<float>(data), 0));
        bool right = !ec;
        for (std::size_t i = 0; i < n && right; ++i) right = data[i] == contribution(0, i, salt);
        failures.check(r, what, ec, right, true, r != 0 || slots_untouched(comm) != e.slots);
      } else if (what == "reduce") {
        std::vector<float> in(n), out(r == 0 ? n : 0);
        for (std::size_t i = 0; i < n; ++i) in[i] = contribution(r, i, salt);
        const auto ec = outcome_of(
            pdcoll::reduce(comm, std::span<const float>(in), std::span<float>(out), pdcoll::op::sum, 0));
        bool right = !ec;
        for (std::size_t i = 0; r == 0 && i < n && right; ++i) right = out[i] == pdcoll::testing::rank_order_sum(P, i, salt);
        failures.check(r, what, ec, right, true, r == 0 || slots_untouched(comm) != e.slots);
      } else {
        const auto Pz = static_cast<std::size_t>(P);
        std::vector<float> in(n * Pz), out(n * Pz);
        for (std::size_t i = 0; i < in.size(); ++i) in[i] = contribution(r, i, salt);
        const auto ec = outcome_of(pdcoll::all_to_all(comm, std::span<const float>(in), std::span<float>(out)));
        bool right = !ec;
        for (std::size_t i = 0; i < out.size() && right; ++i)
          right = out[i] == contribution(static_cast<int>(i / n), static_cast<std::size_t>(r) * n + i % n, salt);
        failures.check(r, what, ec, right, true, slots_untouched(comm) != e.slots);
      }
    }, {}, region_bytes);
    failures.report();
  }
}
