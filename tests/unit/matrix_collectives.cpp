// The correctness matrix over the inproc transport: every collective and
// algorithm, world sizes 1..8, counts {0, 1, P-1, P+1} for every type and op,
// plus 1000003 elements sampled (one type/op per algorithm and world size),
// in place and out of place, each rank compared with a reference built from
// every rank's input (see support/reference.hpp for the tolerance).
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>
#include <support/reference.hpp>
#include <support/variable_blocks.hpp>
#include <unit/failure_endpoints.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace pdcoll;
using pdcoll::testing::check_reduced;
using pdcoll::testing::make_input;

constexpr std::size_t large_count = 1000003;

// Collects the first failure of any rank (doctest asserts are checked on the main thread).
struct failures {
  std::mutex mutex;
  std::vector<std::string> first;
  std::atomic<int> count{0};
  void add(std::string what) {
    ++count;
    std::lock_guard lock(mutex);
    if (first.size() < 5) first.push_back(std::move(what));
  }
  void report() {
    for (auto& f : first) MESSAGE(f);
    CHECK(count.load() == 0);
  }
};

std::vector<std::size_t> counts_for(int world, bool with_large) {
  std::vector<std::size_t> c{0, 1, static_cast<std::size_t>(world > 1 ? world - 1 : 2), static_cast<std::size_t>(world + 1)};
  if (with_large) c.push_back(large_count);
  return c;
}


template <class Algo, class T, class Op>
void all_reduce_case(communicator& comm, failures& f, std::size_t count, std::uint64_t salt, bool in_place) {
  constexpr bool prod = std::is_same_v<Op, op::prod_t>;
  auto in = make_input<T>(salt, comm.rank(), count, prod);
  std::vector<T> out(count);
  try {
    if (in_place) {
      exec::sync_wait(all_reduce<Algo>(comm, in, Op{}));
      out = in;
    } else {
      exec::sync_wait(all_reduce<Algo>(comm, std::span<const T>(in), out, Op{}));
    }
  } catch (const std::exception& e) {
    f.add(std::string(Algo::name) + " threw " + e.what());
    return;
  }
  if (auto msg = check_reduced<T, Op>(out.data(), count, salt, comm.world_size()); !msg.empty())
    f.add(std::string("all_reduce ") + Algo::name + " " + std::string(to_string(data_type_of<T>)) + " " +
          std::string(to_string(reduction_of<Op>)) + " P=" + std::to_string(comm.world_size()) +
          " n=" + std::to_string(count) + (in_place ? " in-place" : "") + " rank " + std::to_string(comm.rank()) +
          ": " + msg);
}

template <class Algo, class T>
void all_reduce_all_ops(communicator& comm, failures& f, std::size_t count, std::uint64_t& salt) {
  for (bool in_place : {false, true}) {
    all_reduce_case<Algo, T, op::sum_t>(comm, f, count, ++salt, in_place);
    all_reduce_case<Algo, T, op::prod_t>(comm, f, count, ++salt, in_place);
    all_reduce_case<Algo, T, op::min_t>(comm, f, count, ++salt, in_place);
    all_reduce_case<Algo, T, op::max_t>(comm, f, count, ++salt, in_place);
    all_reduce_case<Algo, T, op::avg_t>(comm, f, count, ++salt, in_place);
  }
}

template <class Algo>
void all_reduce_matrix(communicator& comm, failures& f) {
  std::uint64_t salt = 1000;
  for (std::size_t count : counts_for(comm.world_size(), false)) {
    all_reduce_all_ops<Algo, float>(comm, f, count, salt);
    all_reduce_all_ops<Algo, double>(comm, f, count, salt);
    all_reduce_all_ops<Algo, float16>(comm, f, count, salt);
    all_reduce_all_ops<Algo, bfloat16>(comm, f, count, salt);
    all_reduce_all_ops<Algo, std::int8_t>(comm, f, count, salt);
    all_reduce_all_ops<Algo, std::uint8_t>(comm, f, count, salt);
    all_reduce_all_ops<Algo, std::int32_t>(comm, f, count, salt);
    all_reduce_all_ops<Algo, std::uint32_t>(comm, f, count, salt);
    all_reduce_all_ops<Algo, std::int64_t>(comm, f, count, salt);
    all_reduce_all_ops<Algo, std::uint64_t>(comm, f, count, salt);
  }
  // The large count, sampled: a float sum and a bfloat16 sum out of place, an int32 max in place.
  all_reduce_case<Algo, float, op::sum_t>(comm, f, large_count, ++salt, false);
  all_reduce_case<Algo, bfloat16, op::sum_t>(comm, f, large_count, ++salt, false);
  all_reduce_case<Algo, std::int32_t, op::max_t>(comm, f, large_count, ++salt, true);
}

template <class T>
void check_equal(failures& f, const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size() || (!got.empty() && std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) != 0)) {
    std::size_t i = 0;
    while (i < got.size() && i < want.size() && std::memcmp(&got[i], &want[i], sizeof(T)) == 0) ++i;
    f.add(what + ": first difference at element " + std::to_string(i));
  }
}

template <class Algo, class T>
void broadcast_case(communicator& comm, failures& f, std::size_t count, std::uint64_t salt, int root, bool in_place) {
  auto expected = make_input<T>(salt, root, count, false);
  std::vector<T> buf = comm.rank() == root ? expected : std::vector<T>(count);
  std::string what = std::string("broadcast ") + Algo::name + " P=" + std::to_string(comm.world_size()) +
                     " n=" + std::to_string(count) + " root=" + std::to_string(root) + " rank " + std::to_string(comm.rank());
  try {
    if (in_place) {
      exec::sync_wait(broadcast<Algo>(comm, buf, root));
    } else {
      std::vector<T> out(count);
      exec::sync_wait(broadcast<Algo>(comm, buf, out, root));
      buf = out;
    }
  } catch (const std::exception& e) {
    return f.add(what + " threw " + e.what());
  }
  check_equal(f, what, buf, expected);
}

template <class Algo, class T, class Op>
void reduce_case(communicator& comm, failures& f, std::size_t count, std::uint64_t salt, int root) {
  auto in = make_input<T>(salt, comm.rank(), count, std::is_same_v<Op, op::prod_t>);
  std::vector<T> out(comm.rank() == root ? count : 0);
  std::string what = std::string("reduce ") + Algo::name + " P=" + std::to_string(comm.world_size()) +
                     " n=" + std::to_string(count) + " root=" + std::to_string(root) + " rank " + std::to_string(comm.rank());
  try {
    exec::sync_wait(reduce<Algo>(comm, in, out, Op{}, root));
  } catch (const std::exception& e) {
    return f.add(what + " threw " + e.what());
  }
  if (comm.rank() == root)
    if (auto msg = check_reduced<T, Op>(out.data(), count, salt, comm.world_size()); !msg.empty()) f.add(what + ": " + msg);
}

// In place (as ncclAllGather): the input is this rank's block of the output.
template <class Algo, class T>
void all_gather_case(communicator& comm, failures& f, std::size_t count, std::uint64_t salt, bool in_place) {
  const int P = comm.world_size();
  const std::size_t mine = count * static_cast<std::size_t>(comm.rank());
  auto in = make_input<T>(salt, comm.rank(), count, false);
  std::vector<T> out(count * static_cast<std::size_t>(P)), expected;
  for (int r = 0; r < P; ++r) {
    auto part = make_input<T>(salt, r, count, false);
    expected.insert(expected.end(), part.begin(), part.end());
  }
  std::string what = std::string("all_gather ") + Algo::name + " P=" + std::to_string(P) + " n=" + std::to_string(count) +
                     (in_place ? " in-place" : "") + " rank " + std::to_string(comm.rank());
  try {
    if (in_place) {
      std::copy(in.begin(), in.end(), out.begin() + static_cast<std::ptrdiff_t>(mine));
      exec::sync_wait(all_gather<Algo>(comm, std::span<T>(out).subspan(mine, count), out));
    } else {
      exec::sync_wait(all_gather<Algo>(comm, in, out));
    }
  } catch (const std::exception& e) {
    return f.add(what + " threw " + e.what());
  }
  check_equal(f, what, out, expected);
}

// In place (as ncclReduceScatter): the output is this rank's block of the input.
template <class Algo, class T, class Op>
void reduce_scatter_case(communicator& comm, failures& f, std::size_t count, std::uint64_t salt, bool in_place) {
  const int P = comm.world_size();
  const std::size_t mine = count * static_cast<std::size_t>(comm.rank());
  auto in = make_input<T>(salt, comm.rank(), count * static_cast<std::size_t>(P), std::is_same_v<Op, op::prod_t>);
  std::vector<T> separate(count);
  const std::span<T> out = in_place ? std::span<T>(in).subspan(mine, count) : std::span<T>(separate);
  std::string what = std::string("reduce_scatter ") + Algo::name + " P=" + std::to_string(P) +
                     " n=" + std::to_string(count) + (in_place ? " in-place" : "") + " rank " +
                     std::to_string(comm.rank());
  try {
    exec::sync_wait(reduce_scatter<Algo>(comm, in, out, Op{}));
  } catch (const std::exception& e) {
    return f.add(what + " threw " + e.what());
  }
  if (auto msg = check_reduced<T, Op>(out.data(), count, salt, P, mine); !msg.empty()) f.add(what + ": " + msg);
}

template <class Algo, class T>
void all_to_all_case(communicator& comm, failures& f, std::size_t count, std::uint64_t salt) {
  const int P = comm.world_size();
  const std::size_t n = count * static_cast<std::size_t>(P);
  auto in = make_input<T>(salt, comm.rank(), n, false);
  std::vector<T> out(n), expected;
  for (int r = 0; r < P; ++r) {  // block r of my output is block me of rank r's input
    auto theirs = make_input<T>(salt, r, n, false);
    auto first = theirs.begin() + static_cast<std::ptrdiff_t>(count * static_cast<std::size_t>(comm.rank()));
    expected.insert(expected.end(), first, first + static_cast<std::ptrdiff_t>(count));
  }
  std::string what = std::string("all_to_all ") + Algo::name + " P=" + std::to_string(P) + " n=" + std::to_string(count) +
                     " rank " + std::to_string(comm.rank());
  try {
    exec::sync_wait(all_to_all<Algo>(comm, in, out));
  } catch (const std::exception& e) {
    return f.add(what + " threw " + e.what());
  }
  check_equal(f, what, out, expected);
}

template <class Algo, class T>
void all_to_allv_case(communicator& comm, failures& f, std::size_t max_count, std::uint64_t salt, bool packed) {
  using namespace pdcoll::testing;
  const int P = comm.world_size(), me = comm.rank();
  const auto l = all_to_allv_layout(salt, P, me, max_count, packed);
  auto in = make_input<T>(salt, me, l.input_elems, false);
  std::vector<T> out(l.output_elems, gap_fill<T>());
  std::string what = std::string("all_to_allv ") + Algo::name + " P=" + std::to_string(P) +
                     " max=" + std::to_string(max_count) + (packed ? " packed" : " with gaps") + " rank " +
                     std::to_string(me);
  try {
    if (packed) exec::sync_wait(all_to_allv<Algo>(comm, in, l.send_counts, out, l.recv_counts));
    else exec::sync_wait(all_to_allv<Algo>(comm, in, l.send_counts, l.send_displs, out, l.recv_counts, l.recv_displs));
  } catch (const std::exception& e) {
    return f.add(what + " threw " + e.what());
  }
  check_equal(f, what, out, expected_all_to_allv<T>(salt, P, me, max_count, packed));
}

template <class Algo, class T>
void all_gatherv_case(communicator& comm, failures& f, std::size_t max_count, std::uint64_t salt, bool packed,
                      bool in_place) {
  using namespace pdcoll::testing;
  const int P = comm.world_size(), me = comm.rank();
  const auto l = all_gatherv_layout(salt, P, max_count, packed);
  const std::size_t n = l.recv_counts[static_cast<std::size_t>(me)], at = l.recv_displs[static_cast<std::size_t>(me)];
  auto in = make_input<T>(salt, me, n, false);
  std::vector<T> out(l.output_elems, gap_fill<T>());
  std::string what = std::string("all_gatherv ") + Algo::name + " P=" + std::to_string(P) +
                     " max=" + std::to_string(max_count) + (packed ? " packed" : " with gaps") +
                     (in_place ? " in place" : "") + " rank " + std::to_string(me);
  try {
    std::span<const T> mine(in);
    if (in_place) {
      std::copy(in.begin(), in.end(), out.begin() + static_cast<std::ptrdiff_t>(at));
      mine = std::span<const T>(out).subspan(at, n);
    }
    if (packed) exec::sync_wait(all_gatherv<Algo>(comm, mine, out, l.recv_counts));
    else exec::sync_wait(all_gatherv<Algo>(comm, mine, out, l.recv_counts, l.recv_displs));
  } catch (const std::exception& e) {
    return f.add(what + " threw " + e.what());
  }
  check_equal(f, what, out, expected_all_gatherv<T>(salt, P, max_count, packed));
}

void run_world(int world, const std::function<void(communicator&, failures&)>& body) {
  failures f;
  pdcoll::testing::run_inproc(world, [&](communicator& comm) { body(comm, f); });
  f.report();
}

}  // namespace

TEST_CASE("all_reduce matches the reference for every algorithm, type, op and world size 1..8") {
  for (int world = 1; world <= 8; ++world) {
    CAPTURE(world);
    run_world(world, [](communicator& comm, failures& f) {
      all_reduce_matrix<algo::ring>(comm, f);
      all_reduce_matrix<algo::ring_chunked<4096>>(comm, f);  // many chunks per segment
      all_reduce_matrix<algo::recursive_doubling>(comm, f);
      all_reduce_matrix<algo::rabenseifner>(comm, f);
      all_reduce_matrix<algo::tree>(comm, f);
      all_reduce_matrix<algo::tree_chunked<64>>(comm, f);
      all_reduce_matrix<algo::direct>(comm, f);
      all_reduce_matrix<algo::two_shot>(comm, f);
      all_reduce_matrix<algo::two_shot_chunked<4096, 2>>(comm, f);  // many chunks, slots reused
      // One-element chunks: at P + 1 elements segment 0 has two chunks and
      // the others an empty second one.
      std::uint64_t salt = 3000;
      for (std::size_t count : counts_for(comm.world_size(), false)) {
        all_reduce_all_ops<algo::two_shot_chunked<1, 2>, float>(comm, f, count, salt);
        all_reduce_all_ops<algo::two_shot_chunked<1, 1>, std::int64_t>(comm, f, count, salt);
      }
      all_reduce_matrix<algo::automatic>(comm, f);
    });
  }
}

TEST_CASE(
    "broadcast, reduce, all_gather, reduce_scatter (in and out of place), all_to_all and barrier match the reference "
    "on 1..8 ranks") {
  for (int world = 1; world <= 8; ++world) {
    CAPTURE(world);
    run_world(world, [](communicator& comm, failures& f) {
      std::uint64_t salt = 77;
      const int P = comm.world_size();
      for (std::size_t count : counts_for(P, true)) {
        for (int root : {0, P - 1, P / 2}) {
          broadcast_case<algo::tree, double>(comm, f, count, ++salt, root, true);
          broadcast_case<algo::tree, std::uint8_t>(comm, f, count, ++salt, root, false);
          broadcast_case<algo::chain_chunked<4096>, float>(comm, f, count, ++salt, root, true);
          broadcast_case<algo::chain, std::int64_t>(comm, f, count, ++salt, root, false);
          reduce_case<algo::tree, float, op::sum_t>(comm, f, count, ++salt, root);
          reduce_case<algo::tree, std::int32_t, op::min_t>(comm, f, count, ++salt, root);
          reduce_case<algo::tree, bfloat16, op::avg_t>(comm, f, count, ++salt, root);
          // doubles: the large count is past automatic's chain threshold
          broadcast_case<algo::automatic, double>(comm, f, count, ++salt, root, false);
          reduce_case<algo::automatic, double, op::sum_t>(comm, f, count, ++salt, root);
        }
        const std::size_t block = count == large_count ? count / 8 : count;  // keep P·n moderate
        for (bool in_place : {false, true}) {
          all_gather_case<algo::ring, float>(comm, f, block, ++salt, in_place);
          all_gather_case<algo::recursive_doubling, std::uint8_t>(comm, f, block, ++salt, in_place);
          reduce_scatter_case<algo::ring, float, op::sum_t>(comm, f, block, ++salt, in_place);
          reduce_scatter_case<algo::ring, std::uint32_t, op::prod_t>(comm, f, block, ++salt, in_place);
          reduce_scatter_case<algo::recursive_halving, double, op::sum_t>(comm, f, block, ++salt, in_place);
          reduce_scatter_case<algo::recursive_halving, std::int8_t, op::max_t>(comm, f, block, ++salt, in_place);
          // Chunks of 4100 bytes are not whole doubles: the ring cuts whole
          // elements, several chunks to the large block.
          reduce_scatter_case<algo::ring_chunked<4100>, double, op::sum_t>(comm, f, block, ++salt, in_place);
          all_gather_case<algo::ring_chunked<4100>, double>(comm, f, block, ++salt, in_place);
          if (block < large_count / 8)  // one element per chunk: a chunk smaller than a double
            reduce_scatter_case<algo::ring_chunked<4>, double, op::max_t>(comm, f, block, ++salt, in_place);
        }
        all_to_all_case<algo::pairwise, double>(comm, f, block, ++salt);
        all_to_all_case<algo::direct, std::uint8_t>(comm, f, block == 0 ? 0 : block + 3, ++salt);
        all_to_all_case<algo::automatic, float>(comm, f, block, ++salt);
        try {
          exec::sync_wait(barrier(comm));
        } catch (const std::exception& e) {
          f.add(std::string("barrier threw ") + e.what());
        }
      }
    });
  }
}

TEST_CASE("all_to_allv and all_gatherv (packed and with gaps, in and out of place) match the reference on 1..8 ranks") {
  for (int world = 1; world <= 8; ++world) {
    CAPTURE(world);
    run_world(world, [](communicator& comm, failures& f) {
      std::uint64_t salt = 9000;
      const auto P = static_cast<std::size_t>(comm.world_size());
      // Blocks of at most 0, 1, below and above the world size, and large.
      for (std::size_t max_count : {std::size_t{0}, std::size_t{1}, P > 1 ? P - 1 : 2, P + 1, std::size_t{70001}}) {
        for (bool packed : {true, false}) {
          all_to_allv_case<algo::pairwise, double>(comm, f, max_count, ++salt, packed);
          all_to_allv_case<algo::direct, std::uint8_t>(comm, f, max_count, ++salt, packed);
          all_to_allv_case<algo::automatic, float>(comm, f, max_count, ++salt, packed);
          for (bool in_place : {false, true}) {
            all_gatherv_case<algo::pairwise, std::int32_t>(comm, f, max_count, ++salt, packed, in_place);
            all_gatherv_case<algo::direct, bfloat16>(comm, f, max_count, ++salt, packed, in_place);
            all_gatherv_case<algo::automatic, double>(comm, f, max_count, ++salt, packed, in_place);
          }
        }
      }
    });
  }
}

TEST_CASE("every collective and algorithm stays right when one rank's completions come newest first on 2..5 ranks") {
  // A transport may complete a rank's operations in any order: rank 1's
  // wrapper hands them out newest first (endpoint_faults), the others' in
  // the inproc order.
  for (int world = 2; world <= 5; ++world) {
    CAPTURE(world);
    failures f;
    pdcoll::testing::wrapped_world w(
        world,
        [](int rank) {
          pdcoll::testing::endpoint_faults faults;
          faults.newest_completion_first = rank == 1;
          return faults;
        },
        pdcoll::testing::short_timeout(std::chrono::seconds(60)));
    w.run([&](int, communicator& comm) {
      std::uint64_t salt = 5000;
      const int P = comm.world_size();
      for (std::size_t count : {std::size_t{1}, static_cast<std::size_t>(P + 1), std::size_t{70001}}) {
        for (bool in_place : {false, true}) {
          all_reduce_case<algo::ring, float, op::sum_t>(comm, f, count, ++salt, in_place);
          all_reduce_case<algo::ring_chunked<4096>, std::int32_t, op::max_t>(comm, f, count, ++salt, in_place);
          all_reduce_case<algo::recursive_doubling, float, op::sum_t>(comm, f, count, ++salt, in_place);
          all_reduce_case<algo::rabenseifner, double, op::sum_t>(comm, f, count, ++salt, in_place);
          all_reduce_case<algo::tree_chunked<64>, std::int64_t, op::sum_t>(comm, f, count, ++salt, in_place);
          all_reduce_case<algo::direct, float, op::sum_t>(comm, f, count, ++salt, in_place);
          all_reduce_case<algo::two_shot_chunked<4096, 2>, float, op::sum_t>(comm, f, count, ++salt, in_place);
          all_reduce_case<algo::automatic, bfloat16, op::sum_t>(comm, f, count, ++salt, in_place);
          all_gather_case<algo::ring, float>(comm, f, count, ++salt, in_place);
          all_gather_case<algo::recursive_doubling, std::uint8_t>(comm, f, count, ++salt, in_place);
          reduce_scatter_case<algo::ring, float, op::sum_t>(comm, f, count, ++salt, in_place);
          reduce_scatter_case<algo::recursive_halving, std::int8_t, op::max_t>(comm, f, count, ++salt, in_place);
        }
        for (int root : {0, P - 1}) {
          broadcast_case<algo::tree, double>(comm, f, count, ++salt, root, true);
          broadcast_case<algo::chain_chunked<4096>, float>(comm, f, count, ++salt, root, false);
          reduce_case<algo::tree, float, op::sum_t>(comm, f, count, ++salt, root);
          reduce_case<algo::automatic, double, op::sum_t>(comm, f, count, ++salt, root);
        }
        all_to_all_case<algo::pairwise, double>(comm, f, count, ++salt);
        all_to_all_case<algo::direct, std::uint8_t>(comm, f, count + 3, ++salt);
        all_to_allv_case<algo::pairwise, float>(comm, f, count, ++salt, false);
        all_to_allv_case<algo::direct, std::int64_t>(comm, f, count, ++salt, true);
        all_gatherv_case<algo::pairwise, float>(comm, f, count, ++salt, false, true);
        all_gatherv_case<algo::direct, std::uint8_t>(comm, f, count, ++salt, true, false);
        try {
          exec::sync_wait(barrier(comm));
        } catch (const std::exception& e) {
          f.add(std::string("barrier threw ") + e.what());
        }
      }
    });
    f.report();
    CHECK(w.counters[1]->reordered.load() > 0);
  }
}
