// Tests of model/cost_model.hpp (the alpha–beta–gamma all-reduce model), of
// algo::automatic's thresholds against it, of PDCOLL_ALGO validation, and of
// the chunk pipeline the model assumes for the ring (small chunks and windows
// over inproc, so every path of the pipeline runs).
#include <doctest/doctest.h>

#include <pdcoll/model/cost_model.hpp>
#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <system_error>
#include <vector>

namespace model = pdcoll::model;

TEST_CASE("every algorithm's predicted time is non-decreasing in bytes, for small and huge worlds") {
  for (const auto& m : {model::reference_shm, model::reference_tcp}) {
    for (int P : {2, 3, 4, 5, 7, 8, 64, 1000, 1024}) {
      for (auto a : model::all_algorithms) {
        double previous = 0;
        for (double bytes = 1; bytes <= double(std::size_t{1} << 34); bytes *= 1.5) {
          const double t = model::predict(a, P, bytes, m);
          CAPTURE(model::to_string(a));
          CAPTURE(P);
          CAPTURE(bytes);
          CHECK(std::isfinite(t));
          CHECK(t > 0);
          CHECK(t >= previous);
          previous = t;
        }
      }
    }
  }
}

TEST_CASE("one rank or zero bytes cost nothing") {
  for (auto a : model::all_algorithms) {
    CHECK(model::predict(a, 1, 1 << 20, model::reference_shm) == 0);
    CHECK(model::predict(a, 8, 0, model::reference_shm) == 0);
  }
}

TEST_CASE("the ring's bandwidth term is 2(P-1)/P times n times beta") {
  const model::parameters wire_only{0, 1e-9, 0};
  for (int P : {2, 3, 4, 64, 1024}) {
    for (double n : {1024.0, 1e6, 64e6}) {
      const double expected = 2.0 * (P - 1) / P * n * 1e-9;
      CHECK(model::predict(model::algorithm::ring, P, n, wire_only) == doctest::Approx(expected).epsilon(1e-12));
    }
  }
  // The reduction overlaps the wire: (P-1)/P·n·gamma plus one chunk that cannot.
  const model::parameters reduce_only{0, 0, 2e-9};
  CHECK(model::predict(model::algorithm::ring, 4, 4e6, reduce_only) ==
        doctest::Approx((0.75 * 4e6 + std::min(1e6, model::ring_chunk_bytes)) * 2e-9));
  CHECK(model::predict(model::algorithm::ring, 2, 64e6, reduce_only) ==
        doctest::Approx((0.5 * 64e6 + model::ring_chunk_bytes) * 2e-9));
}

TEST_CASE("the latency terms count the messages each algorithm sends") {
  const model::parameters latency_only{1e-6, 0, 0};
  CHECK(model::predict(model::algorithm::ring, 8, 8, latency_only) == doctest::Approx(14e-6));
  CHECK(model::predict(model::algorithm::recursive_doubling, 8, 8, latency_only) == doctest::Approx(3e-6));
  CHECK(model::predict(model::algorithm::rabenseifner, 8, 8, latency_only) == doctest::Approx(6e-6));
  // 6 = 4 + 2 folded: two more exchanges.
  CHECK(model::predict(model::algorithm::recursive_doubling, 6, 8, latency_only) == doctest::Approx(4e-6));
  CHECK(model::predict(model::algorithm::direct, 64, 8, latency_only) == doctest::Approx(1e-6));
}

TEST_CASE("automatic's thresholds agree with the model's crossovers over TCP loopback, on 2 and 4 ranks") {
  namespace algo = pdcoll::algo;
  const auto& m = model::reference_tcp;
  struct world {
    int P;
    std::size_t latency, bandwidth;
    const char* (*name_for)(std::size_t);
  };
  for (const world w : {world{2, algo::automatic_pair_latency_threshold, algo::automatic_pair_bandwidth_threshold,
                              &algo::automatic_pair_by_size::name_for},
                        world{4, algo::automatic_latency_threshold, algo::automatic_bandwidth_threshold,
                              &algo::automatic_by_size::name_for}}) {
    CAPTURE(w.P);
    const auto latency = model::crossover(model::algorithm::recursive_doubling, model::algorithm::rabenseifner, w.P, m);
    const auto bandwidth = model::crossover(model::algorithm::rabenseifner, model::algorithm::ring, w.P, m);
    CHECK(latency == w.latency);
    CHECK(bandwidth == w.bandwidth);
    // Away from the thresholds the model and the compile-time choice name the same algorithm.
    for (std::size_t bytes = 8; bytes <= (std::size_t{1} << 30); bytes *= 2) {
      if (bytes * 2 >= latency && bytes <= latency * 2) continue;
      if (bytes * 2 >= bandwidth && bytes <= bandwidth * 2) continue;
      CAPTURE(bytes);
      CHECK(model::to_string(model::choose(w.P, double(bytes), m)) == w.name_for(bytes));
    }
  }
}

TEST_CASE("the model predicts 64- and 1024-rank worlds: latency-bound small, ring-bound large") {
  const auto& m = model::reference_shm;
  for (int P : {64, 1024}) {
    CAPTURE(P);
    CHECK(model::choose(P, 8, m) == model::algorithm::recursive_doubling);
    CHECK(model::choose(P, double(std::size_t{4} << 30), m) == model::algorithm::ring);
    // An 8-byte all-reduce costs log2 P exchanges.
    CHECK(model::predict(model::algorithm::recursive_doubling, P, 8, m) ==
          doctest::Approx(std::log2(P) * m.alpha).epsilon(0.01));
    // The ring's bus bandwidth tends to 1 / beta as n grows (the reduction hides behind the wire).
    const double limit = 1.0 / m.beta;
    CHECK(model::predicted_bus_bandwidth(model::algorithm::ring, P, 1e12, m) == doctest::Approx(limit).epsilon(0.05));
  }
  // Bigger worlds pay more alphas on the ring: its crossover moves up.
  const auto at4 = model::crossover(model::algorithm::rabenseifner, model::algorithm::ring, 4, m);
  const auto at64 = model::crossover(model::algorithm::rabenseifner, model::algorithm::ring, 64, m);
  const auto at1024 = model::crossover(model::algorithm::rabenseifner, model::algorithm::ring, 1024, m);
  CHECK(at4 < at64);
  CHECK(at64 < at1024);
}

TEST_CASE("PDCOLL_ALGO names are parsed and an unknown name is rejected") {
  using pdcoll::algo::automatic;
  CHECK(bool(automatic::parse(nullptr).algorithm == nullptr));
  CHECK_FALSE(automatic::parse("").invalid);
  CHECK(bool(automatic::parse("automatic").algorithm == nullptr));
  CHECK_FALSE(automatic::parse("automatic").invalid);
  CHECK(bool(automatic::parse("ring").algorithm == &pdcoll::algo::ring::all_reduce));
  CHECK(bool(automatic::parse("direct").algorithm == &pdcoll::algo::direct::all_reduce));
  CHECK(automatic::parse("rign").invalid);
  CHECK(automatic::parse("RING").invalid);
}

TEST_CASE("an automatic all_reduce under an unknown PDCOLL_ALGO completes with invalid_argument") {
  // forced() reads the variable once per process; no other test here runs automatic.
  ::setenv("PDCOLL_ALGO", "no_such_algorithm", 1);
  pdcoll::testing::run_inproc(2, [](pdcoll::communicator& comm) {
    std::vector<float> data(16, 1.0f);
    try {
      pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, data, pdcoll::op::sum));
      FAIL("the all_reduce succeeded");
    } catch (const std::system_error& e) {
      CHECK(e.code() == pdcoll::make_error_code(pdcoll::errc::invalid_argument));
    }
    CHECK(data[0] == 1.0f);  // nothing was reduced
    // Refused before it started: the communicator was not aborted.
    CHECK_FALSE(comm.aborted());
    int word = comm.rank() == 0 ? 7 : 0;
    pdcoll::exec::sync_wait(pdcoll::broadcast(comm, std::span<int>(&word, 1), 0));
    CHECK(word == 7);
  });
  ::unsetenv("PDCOLL_ALGO");
}

TEST_CASE("the ring pipeline with tiny chunks and windows sums correctly for every world size 2..7") {
  using tiny = pdcoll::algo::ring_chunked<8, 2>;  // 2 floats per chunk, 2 in flight
  using deep = pdcoll::algo::ring_chunked<12, 5>;  // 3 floats per chunk, 5 in flight
  for (int P = 2; P <= 7; ++P) {
    pdcoll::testing::run_inproc(P, [P](pdcoll::communicator& comm) {
      for (std::size_t n : {std::size_t{1}, std::size_t(P - 1), std::size_t(P + 1), std::size_t{37}, std::size_t{1001}}) {
        std::vector<float> in(n), out(n, -1.0f);
        for (std::size_t i = 0; i < n; ++i) in[i] = float(comm.rank() + 1) + float(i % 7);
        std::vector<float> inplace = in;
        pdcoll::exec::sync_wait(pdcoll::all_reduce<tiny>(comm, in, out, pdcoll::op::sum));
        pdcoll::exec::sync_wait(pdcoll::all_reduce<deep>(comm, inplace, pdcoll::op::sum));
        int wrong = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const float expected = float(P * (P + 1) / 2) + float(P) * float(i % 7);
          wrong += out[i] != expected;
          wrong += inplace[i] != expected;
        }
        CAPTURE(n);
        CHECK(wrong == 0);
        CHECK(in[0] == float(comm.rank() + 1));  // out of place leaves the input alone
      }
    });
  }
}
