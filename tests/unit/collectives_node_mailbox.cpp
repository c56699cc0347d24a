// The small all-reduce's mailboxes in node memory
// (detail/node_small_all_reduce.hpp): the reuse rule stepped by hand on one
// thread, and through communicators the mismatches it must report when
// ranks take different paths for the same collective.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>
#include <support/inproc_world.hpp>
#include <support/outcome.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <utility>
#include <vector>

namespace {

using pdcoll::testing::outcome_of;
using pdcoll::detail::node_small_all_reduce;
using state = node_small_all_reduce::state;

/// `n` ranks' node memory without communicators: the test plays every rank.
struct node_world {
  std::shared_ptr<pdcoll::transport::inproc::fabric> fabric;
  std::vector<std::unique_ptr<pdcoll::transport::endpoint>> endpoints;
  std::vector<std::byte*> regions;

  explicit node_world(int n = 2) : fabric(pdcoll::transport::inproc::fabric::create(n)) {
    fabric->enable_node_memory(pdcoll::transport::min_node_memory_bytes);
    for (int r = 0; r < n; ++r) {
      endpoints.push_back(fabric->endpoint_for(r));
      REQUIRE(node(r));
    }
    for (int r = 0; r < n; ++r) regions.push_back(node(0)->region(r));
  }
  /// Rank `rank`'s view of the node memory.
  pdcoll::transport::node_memory* node(int rank) const {
    return endpoints[static_cast<std::size_t>(rank)]->shared_node_memory();
  }
  /// Rank `rank`'s part of collective `seq`, whose previous small
  /// all-reduce was `previous` - 1 (0: none), run on `cpu` (-1: unknown).
  /// Call in each rank's start order: the mark its mailbox holds is tracked
  /// here, as communicator::follow_small_all_reduce does.
  node_small_all_reduce op(int rank, std::uint64_t seq, std::uint64_t previous, std::uint64_t signature = 7,
                           bool verify = false, int cpu = -1) {
    auto& held = held_marks[static_cast<std::size_t>(rank)][seq & 1];
    return node_small_all_reduce(*node(rank), regions.data(), rank, static_cast<int>(regions.size()), seq, previous,
                                 std::exchange(held, seq + 1), signature, verify, cpu);
  }
  std::map<std::size_t, std::array<std::uint64_t, 2>> held_marks;  // per rank and parity
};

const auto sum = pdcoll::detail::make_reduction<float, pdcoll::op::sum_t>();

const std::array<float, 2> in0{1.0f, 2.0f}, in1{10.0f, 20.0f};
const auto* bytes0 = reinterpret_cast<const std::byte*>(in0.data());
const auto* bytes1 = reinterpret_cast<const std::byte*>(in1.data());

/// `op`'s result out of place.
std::array<float, 2> reduce(node_small_all_reduce& op) {
  std::array<float, 2> out{};
  op.reduce_into(reinterpret_cast<std::byte*>(out.data()), out.size(), sum.apply3, sum.apply);
  return out;
}

}  // namespace

TEST_CASE("a mailbox is reused only once every peer has read what it last held") {
  node_world w;
  auto a0 = w.op(0, 0, 0), a1 = w.op(1, 0, 0);
  REQUIRE(a0.try_publish(bytes0, 8));
  CHECK(a0.peers() == state::waiting);
  REQUIRE(a1.try_publish(bytes1, 8));
  REQUIRE(a0.peers() == state::ready);
  CHECK(reduce(a0) == std::array<float, 2>{11.0f, 22.0f});

  // Rank 0 runs collective 1 on another path and reaches 2, whose mailbox
  // still holds collective 0's contribution, which rank 1 has not read.
  auto c0 = w.op(0, 2, 1);
  CHECK_FALSE(c0.can_advance());
  CHECK_FALSE(c0.try_publish(bytes1, 8));
  REQUIRE(a1.peers() == state::ready);
  CHECK(reduce(a1) == std::array<float, 2>{11.0f, 22.0f});  // what rank 0 wrote for 0, untouched
  CHECK(c0.can_advance());
  REQUIRE(c0.try_publish(bytes1, 8));

  auto c1 = w.op(1, 2, 1);
  REQUIRE(c1.try_publish(bytes0, 8));
  REQUIRE(c1.peers() == state::ready);
  CHECK(reduce(c1) == std::array<float, 2>{11.0f, 22.0f});
  REQUIRE(c0.peers() == state::ready);
  CHECK(reduce(c0) == std::array<float, 2>{11.0f, 22.0f});
}

TEST_CASE("in place, ranks 0 and 1 combine their own contribution from the buffer and later ranks from their mailbox") {
  // Ranks 1 and 2 reduce in place: rank 1's buffer is read in the first
  // combine before it is written; rank 2's is overwritten by it, so its own
  // contribution must come from the copy in its mailbox.
  node_world w(3);
  auto a0 = w.op(0, 0, 0), a1 = w.op(1, 0, 0), a2 = w.op(2, 0, 0);
  std::array<float, 2> buf1{10.0f, 20.0f}, buf2{100.0f, 200.0f};
  REQUIRE(a0.try_publish(bytes0, 8));
  REQUIRE(a1.try_publish(reinterpret_cast<const std::byte*>(buf1.data()), 8));
  REQUIRE(a2.try_publish(reinterpret_cast<const std::byte*>(buf2.data()), 8));
  REQUIRE(a1.peers() == state::ready);
  REQUIRE(a2.peers() == state::ready);
  auto* p1 = reinterpret_cast<std::byte*>(buf1.data());
  auto* p2 = reinterpret_cast<std::byte*>(buf2.data());
  a1.reduce_into(p1, 2, sum.apply3, sum.apply);
  a2.reduce_into(p2, 2, sum.apply3, sum.apply);
  CHECK(buf1 == std::array<float, 2>{111.0f, 222.0f});
  CHECK(buf2 == std::array<float, 2>{111.0f, 222.0f});
}

TEST_CASE("a rank publishes a mailbox only after it has read the mailboxes of its previous small all-reduce") {
  node_world w;
  auto a0 = w.op(0, 0, 0), b0 = w.op(0, 1, 1);
  REQUIRE(a0.try_publish(bytes0, 8));
  CHECK_FALSE(b0.try_publish(bytes0, 8));  // its `done` would claim collective 0 read
  auto a1 = w.op(1, 0, 0);
  REQUIRE(a1.try_publish(bytes1, 8));
  REQUIRE(a0.peers() == state::ready);
  reduce(a0);
  CHECK(b0.try_publish(bytes0, 8));
}

TEST_CASE("small all-reduces publish in sequence order, also when a later one finds its mailbox free first") {
  // Rank 0 finishes collective 1 before rank 1 has read it; collective 3
  // (same mailbox) must wait for that, and collective 5 (same mailbox again,
  // free once rank 1 has read 1) must wait for 3: were 5 published first, 3
  // could never be (its mailbox would hold 5) and 5 would wait for 3's check.
  node_world w;
  auto z0 = w.op(0, 1, 0), z1 = w.op(1, 1, 0);
  REQUIRE(z0.try_publish(bytes0, 8));
  REQUIRE(z1.try_publish(bytes1, 8));
  REQUIRE(z0.peers() == state::ready);
  reduce(z0);
  auto a0 = w.op(0, 3, 2), b0 = w.op(0, 5, 4);
  CHECK_FALSE(a0.try_publish(bytes0, 8));
  REQUIRE(z1.peers() == state::ready);
  reduce(z1);
  CHECK_FALSE(b0.can_advance());
  CHECK_FALSE(b0.try_publish(bytes0, 8));
  CHECK(a0.try_publish(bytes0, 8));
}

TEST_CASE("a small all-reduce spins on the mailboxes at most 5 us or PDCOLL_POLL_US, and yields among them where ranks outnumber CPUs") {
  using namespace std::chrono_literals;
  using plan = node_small_all_reduce::spin_plan;
  CHECK(node_small_all_reduce::spin_for(2, 2, 20us) == plan{5us, false});
  CHECK(node_small_all_reduce::spin_for(2, 2, 3us) == plan{3us, false});
  CHECK(node_small_all_reduce::spin_for(2, 2, 0us) == plan{0us, false});
  CHECK(node_small_all_reduce::spin_for(3, 2, 20us) == plan{20us, true});
  CHECK(node_small_all_reduce::spin_for(4, 2, 0us) == plan{0us, true});
  CHECK(node_small_all_reduce::spin_for(4, 2, 1000us) == plan{50us, true});
  CHECK(node_small_all_reduce::spin_for(8, 64, 20us) == plan{5us, false});
}

TEST_CASE("with more ranks than CPUs, a small all-reduce spins only while the peers it waits for last ran on another CPU") {
  node_world w;
  // Rank 1 has published nothing yet: its CPU is unknown, so rank 0 yields.
  auto a0 = w.op(0, 0, 0, 7, false, 3), a1 = w.op(1, 0, 0, 7, false, 5);
  CHECK_FALSE(a0.peers_elsewhere());  // not published yet
  REQUIRE(a0.try_publish(bytes0, 8));
  CHECK_FALSE(a0.peers_elsewhere());
  REQUIRE(a1.try_publish(bytes1, 8));
  reduce(a0);
  reduce(a1);
  // Collective 1: rank 1's latest publication (collective 0) came from CPU 5.
  auto b0 = w.op(0, 1, 1, 7, false, 3);
  REQUIRE(b0.try_publish(bytes0, 8));
  CHECK(b0.peers_elsewhere());
  // Rank 1 publishes collective 1 from rank 0's CPU; collective 2 waits for it.
  auto b1 = w.op(1, 1, 1, 7, false, 3);
  REQUIRE(b1.try_publish(bytes1, 8));
  CHECK(b0.peers_elsewhere());  // nobody missing any more: look again
  reduce(b0);
  reduce(b1);
  auto c0 = w.op(0, 2, 2, 7, false, 3);
  REQUIRE(c0.try_publish(bytes0, 8));
  CHECK_FALSE(c0.peers_elsewhere());
}

TEST_CASE("with more ranks than CPUs, every missing peer must have run elsewhere for a small all-reduce to spin") {
  // Rank 0 last ran on CPU 1, ranks 1 and 2 on CPU 0; then collective 1.
  node_world w(3);
  const std::array<int, 3> cpu{1, 0, 0};
  std::vector<node_small_all_reduce> first;
  for (int r = 0; r < 3; ++r) first.push_back(w.op(r, 0, 0, 7, false, cpu[static_cast<std::size_t>(r)]));
  for (auto& op : first) REQUIRE(op.try_publish(bytes0, 8));
  for (auto& op : first) REQUIRE(op.peers() == state::ready);
  for (auto& op : first) reduce(op);
  auto a1 = w.op(1, 1, 1, 7, false, 0);
  REQUIRE(a1.try_publish(bytes0, 8));
  CHECK_FALSE(a1.peers_elsewhere());  // rank 0 ran elsewhere, but rank 2 on this CPU
  auto a0 = w.op(0, 1, 1, 7, false, 1);
  REQUIRE(a0.try_publish(bytes0, 8));
  CHECK(a0.peers_elsewhere());  // the one missing peer, rank 2, ran on CPU 0
  auto a2 = w.op(2, 1, 1, 7, false, 0);
  REQUIRE(a2.try_publish(bytes0, 8));
  CHECK(a2.peers() == state::ready);
  CHECK(a2.peers_elsewhere());  // nothing missing any more: look again
}

TEST_CASE("a rank that does not know its own CPU never spins because its peers run elsewhere") {
  for (const int own_cpu : {3, -1}) {
    CAPTURE(own_cpu);
    node_world w;
    auto a0 = w.op(0, 0, 0, 7, false, 3), a1 = w.op(1, 0, 0, 7, false, 5);
    REQUIRE(a0.try_publish(bytes0, 8));
    REQUIRE(a1.try_publish(bytes1, 8));
    reduce(a0);
    reduce(a1);
    auto b0 = w.op(0, 1, 1, 7, false, own_cpu);
    REQUIRE(b0.try_publish(bytes0, 8));
    CHECK(b0.peers_elsewhere() == (own_cpu >= 0));
  }
}

TEST_CASE("small all-reduces report collective_mismatch for another signature, or a left neighbour on another path") {
  SUBCASE("signatures differ") {
    node_world w;
    auto a0 = w.op(0, 0, 0, 7), a1 = w.op(1, 0, 0, 8);
    REQUIRE(a0.try_publish(bytes0, 8));
    REQUIRE(a1.try_publish(bytes1, 8));
    CHECK(a0.peers() == state::mismatch);
    CHECK(a1.peers() == state::mismatch);
  }
  SUBCASE("the left neighbour posted a check entry for the same collective") {
    node_world w;
    auto a0 = w.op(0, 0, 0, 7, true);
    REQUIRE(a0.try_publish(bytes0, 8));
    CHECK(a0.peers() == state::waiting);
    const pdcoll::detail::node_check general{w.node(1), 1, 2, 0};  // rank 1 runs collective 0 on a coroutine path
    REQUIRE(pdcoll::detail::node_check::room(&general));
    general.post(7);
    CHECK(a0.peers() == state::mismatch);
    // ... and that rank's check sees this one's mailbox instead of an entry.
    CHECK(pdcoll::detail::node_check::arrived(&general));
    CHECK_FALSE(general.left_matches(7));
  }
}

TEST_CASE("ranks that run the same all-reduce with algorithms of different paths fail with collective_mismatch") {
  // Equal signatures: shared_memory takes the mailboxes for 8 floats, the
  // ring sends messages. Without the cross-path checks every rank would
  // wait for its deadline.
  for (int P : {2, 3}) {
    CAPTURE(P);
    std::mutex m;
    std::vector<std::error_code> codes;
    pdcoll::communicator_options options;
    options.timeout = std::chrono::seconds(10);
    const auto start = std::chrono::steady_clock::now();
    pdcoll::testing::run_inproc(P, [&](pdcoll::communicator& comm) {
      std::vector<float> data(8, 1.0f);
      auto ec = comm.rank() == 1 ? outcome_of(pdcoll::all_reduce<pdcoll::algo::ring>(comm, data))
                                 : outcome_of(pdcoll::all_reduce<pdcoll::algo::shared_memory>(comm, data));
      std::lock_guard lock(m);
      codes.push_back(ec);
    }, options, pdcoll::transport::min_node_memory_bytes);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    REQUIRE(codes.size() == static_cast<std::size_t>(P));
    for (auto ec : codes) CHECK(ec == pdcoll::errc::collective_mismatch);
  }
}
