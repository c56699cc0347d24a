// Multi-process tests of the libfabric transport: N forked ranks on one host
// over the provider named by PDCOLL_PROVIDER (shm or tcp), run by ctest as
// multiproc.fabric.<what>.<provider>. Each rank checks its own side; the
// parent checks every rank's exit status.
#include <doctest/doctest.h>

#include <linux/capability.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <initializer_list>
#include <numeric>
#include <thread>

#include "multiproc/fork_harness.hpp"
#include "pdcoll/transport/libfabric/endpoint.hpp"

namespace fabric = pdcoll::transport::libfabric;
using pdcoll::test::drive_until;
using pdcoll::test::rank_checks;
using pdcoll::test::recorded_op;
using pdcoll::transport::address_exchange;
using pdcoll::transport::any_peer;
using clock_type = std::chrono::steady_clock;

namespace {

std::string provider_name() {
  const char* p = std::getenv("PDCOLL_PROVIDER");
  return p ? p : "default";
}

auto in_seconds(int s) { return clock_type::now() + std::chrono::seconds(s); }

unsigned char byte_at(std::size_t i, unsigned seed) {
  return static_cast<unsigned char>((i * 2654435761u + seed) >> 7);
}

void require_all_ok(const std::vector<pdcoll::test::rank_outcome>& outcomes) {
  for (std::size_t r = 0; r < outcomes.size(); ++r) {
    CAPTURE(r);
    CHECK(outcomes[r].exit_code == 0);
    CHECK(outcomes[r].signal == 0);
    CHECK_FALSE(outcomes[r].timed_out);
  }
}

/// Drops capabilities from this process. Without CAP_SYS_PTRACE it may read
/// (CMA) only dumpable processes whose capabilities are a subset of its own.
bool drop_capabilities(std::initializer_list<int> dropped) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &header, caps) != 0) return false;
  for (const int cap : dropped) {
    caps[cap / 32].effective &= ~(1u << (cap % 32));
    caps[cap / 32].permitted &= ~(1u << (cap % 32));
  }
  return ::syscall(SYS_capset, &header, caps) == 0;
}

/// Which rank may read which (CMA), as each rank finds by reading a word of
/// every peer's: element p of the result is rank p's row, whose character q
/// is '1' when p may read rank q.
std::vector<std::string> readability(int size, const address_exchange& ex) {
  static const std::uint64_t word = 0x5eedf00dcafe1234u;
  const auto places = ex(std::to_string(::getpid()) + " " + std::to_string(reinterpret_cast<std::uintptr_t>(&word)));
  std::string row(static_cast<std::size_t>(size), '0');
  for (int q = 0; q < size; ++q) {
    unsigned long long pid = 0, address = 0;
    if (std::sscanf(places[static_cast<std::size_t>(q)].c_str(), "%llu %llu", &pid, &address) != 2) continue;
    std::uint64_t seen = 0;
    iovec local{&seen, sizeof seen};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), sizeof seen};
    if (::process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) == sizeof seen && seen == word)
      row[static_cast<std::size_t>(q)] = '1';
  }
  return ex(row);
}

}  // namespace

TEST_CASE("ping-pong from 0 bytes to 64 MiB arrives intact in both directions") {
  auto outcomes = pdcoll::test::run_ranks(2, [](int rank, int size, const address_exchange& ex) {
    rank_checks check{rank};
    auto ep = fabric::make_endpoint(rank, size, ex);
    const int peer = 1 - rank;
    std::vector<std::size_t> sizes = {0};
    for (std::size_t s = 1; s <= (std::size_t{64} << 20); s *= 4) sizes.push_back(s);
    std::vector<unsigned char> buffer(sizes.back());
    for (std::size_t size : sizes) {
      const auto seed = static_cast<unsigned>(size);
      recorded_op op;
      if (rank == 0) {
        for (std::size_t i = 0; i < size; ++i) buffer[i] = byte_at(i, seed);
        check(!ep->post_send(peer, buffer.data(), size, size, nullptr, &op), "post ping");
        check(drive_until(*ep, [&] { return op.done(); }, in_seconds(30)), "ping sent");
        std::fill(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(size), 0);
        recorded_op back;
        check(!ep->post_recv(peer, buffer.data(), size, size, 0, nullptr, &back), "post pong recv");
        check(drive_until(*ep, [&] { return back.done(); }, in_seconds(30)), "pong received");
        check(!back.result.error && back.result.bytes == size, "pong size " + std::to_string(size));
        bool intact = true;
        for (std::size_t i = 0; i < size && intact; ++i) intact = buffer[i] == byte_at(i, seed + 1);
        check(intact, "pong data " + std::to_string(size));
      } else {
        check(!ep->post_recv(peer, buffer.data(), size, size, 0, nullptr, &op), "post ping recv");
        check(drive_until(*ep, [&] { return op.done(); }, in_seconds(30)), "ping received");
        check(!op.result.error && op.result.bytes == size && op.result.peer == 0,
              "ping size " + std::to_string(size));
        bool intact = true;
        for (std::size_t i = 0; i < size && intact; ++i) intact = buffer[i] == byte_at(i, seed);
        check(intact, "ping data " + std::to_string(size));
        for (std::size_t i = 0; i < size; ++i) buffer[i] = byte_at(i, seed + 1);
        recorded_op back;
        check(!ep->post_send(peer, buffer.data(), size, size, nullptr, &back), "post pong");
        check(drive_until(*ep, [&] { return back.done(); }, in_seconds(30)), "pong sent");
      }
      if (check.failures) break;
    }
    return check.failures ? 1 : 0;
  });
  require_all_ok(outcomes);
}

TEST_CASE("512 sends and 512 receives in flight per rank all complete with their own data") {
  auto outcomes = pdcoll::test::run_ranks(2, [](int rank, int size, const address_exchange& ex) {
    rank_checks check{rank};
    auto ep = fabric::make_endpoint(rank, size, ex);
    constexpr int n = 512;
    const int peer = 1 - rank;
    std::vector<recorded_op> sends(n), recvs(n);
    std::vector<std::uint64_t> out(n), in(n, 0);
    for (int i = 0; i < n; ++i) {
      out[static_cast<std::size_t>(i)] = static_cast<std::uint64_t>(rank) << 32 | static_cast<unsigned>(i);
      check(!ep->post_recv(peer, &in[static_cast<std::size_t>(i)], 8, static_cast<std::uint64_t>(i), 0,
                           nullptr, &recvs[static_cast<std::size_t>(i)]), "post recv");
    }
    for (int i = 0; i < n; ++i) {
      check(!ep->post_send(peer, &out[static_cast<std::size_t>(i)], 8, static_cast<std::uint64_t>(i),
                           nullptr, &sends[static_cast<std::size_t>(i)]), "post send");
    }
    auto all_done = [&] {
      return std::all_of(sends.begin(), sends.end(), [](auto& o) { return o.done(); }) &&
             std::all_of(recvs.begin(), recvs.end(), [](auto& o) { return o.done(); });
    };
    check(drive_until(*ep, all_done, in_seconds(30)), "all 1024 operations completed");
    for (int i = 0; i < n; ++i) {
      const auto& r = recvs[static_cast<std::size_t>(i)];
      check(r.completions == 1 && !r.result.error, "recv " + std::to_string(i) + " completed once");
      check(in[static_cast<std::size_t>(i)] == (static_cast<std::uint64_t>(peer) << 32 | static_cast<unsigned>(i)),
            "recv " + std::to_string(i) + " data");
      check(sends[static_cast<std::size_t>(i)].completions == 1, "send completed once");
    }
    return check.failures ? 1 : 0;
  });
  require_all_ok(outcomes);
}

TEST_CASE("receives posted in reverse tag order match by tag, same tags in send order") {
  auto outcomes = pdcoll::test::run_ranks(2, [](int rank, int size, const address_exchange& ex) {
    rank_checks check{rank};
    auto ep = fabric::make_endpoint(rank, size, ex);
    constexpr int n = 64;
    std::vector<recorded_op> ops(n + 2);
    std::vector<int> values(n + 2, -1);
    if (rank == 1) {
      for (int t = n - 1; t >= 0; --t) {
        check(!ep->post_recv(0, &values[static_cast<std::size_t>(t)], sizeof(int), static_cast<std::uint64_t>(t), 0,
                             nullptr, &ops[static_cast<std::size_t>(t)]), "post recv");
      }
      // Two messages with one tag: the first receive gets the first message.
      check(!ep->post_recv(0, &values[n], sizeof(int), 1000, 0, nullptr, &ops[n]), "post recv a");
      check(!ep->post_recv(0, &values[n + 1], sizeof(int), 1000, 0, nullptr, &ops[n + 1]), "post recv b");
    } else {
      for (int t = 0; t < n; ++t) values[static_cast<std::size_t>(t)] = t * 10;
      values[n] = 111;
      values[n + 1] = 222;
      for (int t = 0; t < n; ++t) {
        check(!ep->post_send(1, &values[static_cast<std::size_t>(t)], sizeof(int), static_cast<std::uint64_t>(t),
                             nullptr, &ops[static_cast<std::size_t>(t)]), "post send");
      }
      check(!ep->post_send(1, &values[n], sizeof(int), 1000, nullptr, &ops[n]), "post send a");
      check(!ep->post_send(1, &values[n + 1], sizeof(int), 1000, nullptr, &ops[n + 1]), "post send b");
    }
    auto all_done = [&] { return std::all_of(ops.begin(), ops.end(), [](auto& o) { return o.done(); }); };
    check(drive_until(*ep, all_done, in_seconds(30)), "all completed");
    if (rank == 1) {
      for (int t = 0; t < n; ++t) {
        check(values[static_cast<std::size_t>(t)] == t * 10, "tag " + std::to_string(t) + " got its value");
        check(ops[static_cast<std::size_t>(t)].result.tag == static_cast<std::uint64_t>(t), "tag reported");
      }
      check(values[n] == 111 && values[n + 1] == 222, "same-tag messages matched in send order");
    }
    return check.failures ? 1 : 0;
  });
  require_all_ok(outcomes);
}

TEST_CASE("any_peer receives with an ignore mask take one message from every other rank") {
  auto outcomes = pdcoll::test::run_ranks(4, [](int rank, int size, const address_exchange& ex) {
    rank_checks check{rank};
    auto ep = fabric::make_endpoint(rank, size, ex);
    if (rank == 0) {
      std::vector<recorded_op> ops(static_cast<std::size_t>(size - 1));
      std::vector<int> values(static_cast<std::size_t>(size - 1), -1);
      // Tag layout in this test: sender rank in bits 8..15, kind 0x5 in bits 0..7.
      for (std::size_t i = 0; i < ops.size(); ++i) {
        check(!ep->post_recv(any_peer, &values[i], sizeof(int), 0x05, 0xff00, nullptr, &ops[i]), "post any");
      }
      auto all_done = [&] { return std::all_of(ops.begin(), ops.end(), [](auto& o) { return o.done(); }); };
      check(drive_until(*ep, all_done, in_seconds(30)), "all any_peer receives completed");
      std::vector<int> peers;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const auto& r = ops[i].result;
        check(!r.error, "no error");
        check(r.peer >= 1 && r.peer < size, "peer reported");
        check(values[i] == r.peer * 7, "value matches its sender");
        check(r.tag == (static_cast<std::uint64_t>(r.peer) << 8 | 0x05), "full tag reported");
        peers.push_back(r.peer);
      }
      std::sort(peers.begin(), peers.end());
      check(peers == std::vector<int>({1, 2, 3}), "one message from each rank");
    } else {
      int value = rank * 7;
      recorded_op op;
      check(!ep->post_send(0, &value, sizeof value, static_cast<std::uint64_t>(rank) << 8 | 0x05, nullptr, &op),
            "post send");
      check(drive_until(*ep, [&] { return op.done(); }, in_seconds(30)), "send completed");
    }
    // Keep every endpoint open until rank 0 has its messages (a closing
    // endpoint may drop what it has not flushed yet).
    ex("done");
    return check.failures ? 1 : 0;
  });
  require_all_ok(outcomes);
}

TEST_CASE("truncation is collective_mismatch and a cancelled receive completes once") {
  auto outcomes = pdcoll::test::run_ranks(2, [](int rank, int size, const address_exchange& ex) {
    rank_checks check{rank};
    auto ep = fabric::make_endpoint(rank, size, ex);
    // libfabric 1.17's shm never completes a truncated receive of a message
    // it moves itself above its 4 KiB inline size, so on shm this message
    // takes pdcoll's single-copy rendezvous (see the endpoint's file
    // comment), which reports the truncation on both sides.
    const std::size_t message = 100000;
    std::vector<unsigned char> big(message, 3), small(1000);
    recorded_op op, cancelled;
    if (rank == 0) {
      check(!ep->post_send(1, big.data(), big.size(), 77, nullptr, &op), "post send");
      check(drive_until(*ep, [&] { return op.done(); }, in_seconds(10)), "truncated send completed");
    } else {
      check(!ep->post_recv(1 - rank, small.data(), small.size(), 77, 0, nullptr, &op), "post recv");
      check(drive_until(*ep, [&] { return op.done(); }, in_seconds(30)), "truncated receive completed");
      check(op.result.error == pdcoll::errc::collective_mismatch,
            "truncation reported as collective_mismatch, got " + op.result.error.message());
      check(!ep->post_recv(0, small.data(), small.size(), 78, 0, nullptr, &cancelled), "post recv");
      ep->cancel(&cancelled);
      check(drive_until(*ep, [&] { return cancelled.done(); }, in_seconds(10)), "cancel completed");
      check(cancelled.result.error == std::errc::operation_canceled, "operation_canceled");
      drive_until(*ep, [] { return false; }, clock_type::now() + std::chrono::milliseconds(100));
      check(cancelled.completions == 1, "exactly one completion");
    }
    // shm: a receive shorter than a rendezvous notice is posted into its
    // context, so a 12-byte message into 4 bytes is truncated there; only
    // the 4 bytes that fit are written. (tcp;ofi_rxm 1.17 never completed
    // this receive in 10 s, so it is not asked of tcp.)
    ex("short");
    unsigned char twelve[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    recorded_op shorter;
    const bool shm = static_cast<fabric::fabric_endpoint&>(*ep).provider() == "shm";
    if (shm && rank == 0) {
      check(!ep->post_send(1, twelve, sizeof twelve, 79, nullptr, &shorter), "post 12-byte send");
      check(drive_until(*ep, [&] { return shorter.done(); }, in_seconds(10)), "12-byte send completed");
    } else if (shm) {
      unsigned char into[8] = {0, 0, 0, 0, 0xee, 0xee, 0xee, 0xee};
      check(!ep->post_recv(0, into, 4, 79, 0, nullptr, &shorter), "post 4-byte recv");
      check(drive_until(*ep, [&] { return shorter.done(); }, in_seconds(10)), "4-byte receive completed");
      check(shorter.result.error == pdcoll::errc::collective_mismatch,
            "12 bytes into 4 reported as collective_mismatch, got " + shorter.result.error.message());
      check(into[4] == 0xee && into[5] == 0xee && into[6] == 0xee && into[7] == 0xee, "nothing written past 4 bytes");
      check(shorter.result.bytes == 4 && into[0] == 1 && into[3] == 4, "the 4 bytes that fit delivered");
    }
    ex("done");
    return check.failures ? 1 : 0;
  });
  require_all_ok(outcomes);
}

TEST_CASE("large messages take the single-copy rendezvous on shm, intact from any peer") {
  // With doorbells the receiver answers in the sender's finish words; without
  // them (use_wait_fd off) with finish messages; mixed (rank 1 without), by
  // pair: rank 1's sends get messages (it has no doorbell to answer in),
  // rank 2's words.
  enum class bells { all, none, mixed };
  for (const bells mode : {bells::all, bells::none, bells::mixed}) {
    CAPTURE(static_cast<int>(mode));
    auto outcomes = pdcoll::test::run_ranks(3, [mode](int rank, int size, const address_exchange& ex) {
      const bool doorbells = mode == bells::all || (mode == bells::mixed && rank != 1);
      rank_checks check{rank};
      fabric::options opts;
      opts.use_wait_fd = doorbells;
      auto ep = fabric::make_endpoint(rank, size, ex, opts);
      auto& fep = static_cast<fabric::fabric_endpoint&>(*ep);
      const bool shm = fep.provider() == "shm";
      // Every peer maps a rank's doorbell, whatever the peer's own options.
      check(fep.has_doorbell() == (shm && doorbells), "a doorbell on shm when asked for");
      const std::size_t threshold = fep.rendezvous_threshold();
      if (shm) {
        check(threshold == fep.info()->tx_attr->inject_size + 1, "rendezvous above the inject size on shm");
        for (int p = 0; p < size; ++p) check(fep.rendezvous_with(p), "rendezvous with every peer");
      } else {
        check(threshold == SIZE_MAX && !fep.rendezvous_with(1 - rank % 2), "no rendezvous off shm");
      }
      // Ranks 1 and 2 send rank 0 messages around the threshold and 1 MiB (tag
      // 10 + size index); rank 0 takes them with any_peer receives and checks
      // source, size and bytes.
      const std::vector<std::size_t> sizes = {4096, 4097, std::size_t{16} << 10, std::size_t{1} << 20};
      if (rank == 0) {
        for (std::size_t k = 0; k < 2 * sizes.size(); ++k) {
          const std::size_t s = sizes[k / 2];
          {
            std::vector<unsigned char> in(s + 64, 0);
            recorded_op op;
            check(!ep->post_recv(any_peer, in.data(), in.size(), 10 + k / 2, 0, nullptr, &op), "post any_peer recv");
            check(drive_until(*ep, [&] { return op.done(); }, in_seconds(30)), "any_peer receive completed");
            const int from = op.result.peer;
            check(!op.result.error && op.result.bytes == s && (from == 1 || from == 2),
                  "size " + std::to_string(s) + " from rank " + std::to_string(from));
            bool intact = true;
            for (std::size_t i = 0; i < s && intact && from > 0; ++i)
              intact = in[i] == byte_at(i, static_cast<unsigned>(s) + static_cast<unsigned>(from));
            check(intact, "bytes of " + std::to_string(s) + " from rank " + std::to_string(from));
          }
        }
        // A message that does not fit: the receive and the send both fail.
        unsigned char tiny[8];
        recorded_op op;
        check(!ep->post_recv(1, tiny, sizeof tiny, 6, 0, nullptr, &op), "post tiny recv");
        check(drive_until(*ep, [&] { return op.done(); }, in_seconds(30)), "tiny receive completed");
        check(op.result.error == pdcoll::errc::collective_mismatch, "tiny receive truncated");
      } else {
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          const std::size_t s = sizes[k];
          std::vector<unsigned char> out(s);
          for (std::size_t i = 0; i < s; ++i) out[i] = byte_at(i, static_cast<unsigned>(s) + static_cast<unsigned>(rank));
          recorded_op op;
          check(!ep->post_send(0, out.data(), s, 10 + k, nullptr, &op), "post send");
          check(drive_until(*ep, [&] { return op.done(); }, in_seconds(30)), "send completed");
          check(!op.result.error && op.result.bytes == s, "send of " + std::to_string(s) + " ok");
        }
        if (rank == 1) {
          std::vector<unsigned char> big(std::size_t{64} << 10, 9);
          recorded_op op;
          check(!ep->post_send(0, big.data(), big.size(), 6, nullptr, &op), "post big send");
          check(drive_until(*ep, [&] { return op.done(); }, in_seconds(30)), "big send completed");
          // shm: the receiver's answer completes the send (the receiver took
          // what fit); tcp: the provider's own send completion.
          if (shm) check(!op.result.error, "truncated rendezvous send completed");
        }
        // Every send from 4097 bytes on took the rendezvous; on shm with
        // doorbells each was answered in its finish word.
        const std::uint64_t rendezvous_sends = 3 + (rank == 1 ? 1 : 0);
        check(fep.finish_words_collected() == (shm && doorbells ? rendezvous_sends : 0),
              "finish words collected: " + std::to_string(fep.finish_words_collected()));
      }
      ex("done");
      return check.failures ? 1 : 0;
    });
    require_all_ok(outcomes);
  }
}

TEST_CASE("with one-way CMA the readable direction takes the rendezvous and the other the provider's copy") {
  // Rank 0 makes itself non-dumpable and rank 1 drops CAP_SYS_PTRACE, so
  // rank 1 may not read rank 0 (ptrace(2): "access mode ... dumpable") while
  // rank 0 (root) may read rank 1: as between a parent and a child under
  // Yama's ptrace_scope=1. Sends 1 -> 0 take the rendezvous, sends 0 -> 1
  // the provider, split at its inject size (libfabric 1.17's shm would
  // otherwise move them by CMA, which rank 1 may not: see setup_shm_peers);
  // short receives on both sides take the bounce.
  auto outcomes = pdcoll::test::run_ranks(2, [](int rank, int size, const address_exchange& ex) {
    rank_checks check{rank};
    if (rank == 0) {
      check(::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0, "PR_SET_DUMPABLE 0");
    } else {
      check(drop_capabilities({CAP_SYS_PTRACE}), "capset without CAP_SYS_PTRACE");
    }
    auto ep = fabric::make_endpoint(rank, size, ex);
    auto& fep = static_cast<fabric::fabric_endpoint&>(*ep);
    const bool shm = fep.provider() == "shm";
    const int peer = 1 - rank;
    // rendezvous_with(p): p can read this rank. Rank 1 tells rank 0 whether
    // rank 0 reads it (as the rendezvous case, this assumes sibling ranks
    // may read each other unless they forbid it, as here).
    check(fep.rendezvous_with(rank) == shm, "a rank reads itself on shm");
    if (rank == 0) check(!fep.rendezvous_with(1), "rank 1 cannot read rank 0");
    const auto read_by_0 = ex(rank == 1 && fep.rendezvous_with(0) ? "1" : "0");
    const bool one_way = shm && read_by_0.size() == 2 && read_by_0[1] == "1";
    check(one_way == shm, "rank 0 reads rank 1 on shm");
    // Readability differs between the ranks: both split what the provider moves.
    if (one_way) {
      check(fep.chunk_bytes() == fep.info()->tx_attr->inject_size,
            "chunk size " + std::to_string(fep.chunk_bytes()));
    }
    // 1 MiB, 64 KiB, 4 KiB + 1, and 4 bytes into a 4-byte receive.
    const std::vector<std::size_t> sizes = {std::size_t{1} << 20, std::size_t{64} << 10, 4097, 4};
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const std::size_t s_out = sizes[k], s_in = sizes[k];
      std::vector<unsigned char> out(s_out), in(s_in, 0);
      for (std::size_t i = 0; i < s_out; ++i) out[i] = byte_at(i, static_cast<unsigned>(s_out + 31 * rank));
      recorded_op send, recv;
      check(!ep->post_recv(peer, in.data(), in.size(), 20 + k, 0, nullptr, &recv), "post recv");
      check(!ep->post_send(peer, out.data(), s_out, 20 + k, nullptr, &send), "post send");
      check(drive_until(*ep, [&] { return send.done() && recv.done(); }, in_seconds(30)),
            "send of " + std::to_string(s_out) + " and receive of " + std::to_string(s_in) + " completed");
      check(!send.result.error && !recv.result.error && recv.result.bytes == s_in, "both ok");
      bool intact = true;
      for (std::size_t i = 0; i < s_in && intact; ++i)
        intact = in[i] == byte_at(i, static_cast<unsigned>(s_in + 31 * peer));
      check(intact, "bytes of " + std::to_string(s_in) + " from rank " + std::to_string(peer));
    }
    // Rank 1's three sends above the inject size went by rendezvous, each
    // answered by rank 0 in its finish word; rank 0's went by the provider.
    if (one_way) {
      check(fep.finish_words_collected() == (rank == 1 ? 3u : 0u),
            "finish words collected: " + std::to_string(fep.finish_words_collected()));
    }
    // A rendezvous message too long for its receive: both sides complete.
    // (The other direction is the provider's, which 1.17 never completes:
    // see the truncation case.)
    ex("truncate");
    if (one_way) {
      std::vector<unsigned char> big(std::size_t{64} << 10, 5);
      unsigned char tiny[8] = {};
      recorded_op op;
      if (rank == 1) {
        check(!ep->post_send(0, big.data(), big.size(), 40, nullptr, &op), "post big send");
        check(drive_until(*ep, [&] { return op.done(); }, in_seconds(30)), "big send completed");
        check(!op.result.error, "the receiver took what fit");
      } else {
        check(!ep->post_recv(1, tiny, sizeof tiny, 40, 0, nullptr, &op), "post tiny recv");
        check(drive_until(*ep, [&] { return op.done(); }, in_seconds(30)), "tiny receive completed");
        check(op.result.error == pdcoll::errc::collective_mismatch, "truncated");
      }
    }
    ex("done");
    return check.failures ? 1 : 0;
  });
  require_all_ok(outcomes);
}

TEST_CASE("with mixed readability every large message arrives, with and without the rendezvous") {
  // No rank has CAP_SYS_PTRACE. Rank 2 is non-dumpable, so nobody may read
  // it, and has one capability less than the others, so it may read
  // nobody; ranks 0 and 1 read each other. libfabric 1.17's shm shares one
  // CMA verdict between all three, so unless every rank splits what the
  // provider moves (setup_shm_peers), its copies between rank 2 and the
  // others fail with EIO (6 of 10 runs here; with rank 0 hidden, none).
  // Where the environment gives another matrix (no CAP_SYS_ADMIN to drop,
  // Yama's ptrace_scope), the checks follow the matrix the ranks find.
  for (const char* rendezvous : {"", "0"}) {
    CAPTURE(rendezvous);
    auto outcomes = pdcoll::test::run_ranks(3, [&](int rank, int size, const address_exchange& ex) {
      rank_checks check{rank};
      if (*rendezvous) {
        ::setenv("PDCOLL_SHM_RENDEZVOUS", rendezvous, 1);
      } else {
        ::unsetenv("PDCOLL_SHM_RENDEZVOUS");
      }
      if (rank == 2) {
        check(::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0, "PR_SET_DUMPABLE 0");
        check(drop_capabilities({CAP_SYS_PTRACE, CAP_SYS_ADMIN}), "capset without CAP_SYS_PTRACE, CAP_SYS_ADMIN");
      } else {
        check(drop_capabilities({CAP_SYS_PTRACE}), "capset without CAP_SYS_PTRACE");
      }
      const auto reads = readability(size, ex);
      bool some = false, all = true;
      for (int p = 0; p < size; ++p)
        for (int q = 0; q < size; ++q)
          if (p != q) {
            const bool r = reads[static_cast<std::size_t>(p)][static_cast<std::size_t>(q)] == '1';
            some = some || r;
            all = all && r;
          }
      const bool mixed = some && !all;
      if (rank == 0 && reads != std::vector<std::string>{"110", "110", "001"})
        std::fprintf(stderr, "note: readability rows %s %s %s, not the intended 110 110 001\n", reads[0].c_str(),
                     reads[1].c_str(), reads[2].c_str());
      auto ep = fabric::make_endpoint(rank, size, ex);
      auto& fep = static_cast<fabric::fabric_endpoint&>(*ep);
      if (fep.provider() == "shm") {
        const std::size_t whole = fep.chunk_bytes();
        check((whole == fep.info()->tx_attr->inject_size) == mixed, "chunk size " + std::to_string(whole));
        for (int p = 0; p < size; ++p) {
          const bool reads_this = reads[static_cast<std::size_t>(p)][static_cast<std::size_t>(rank)] == '1';
          check(fep.rendezvous_with(p) == (reads_this && !*rendezvous),
                "rendezvous to rank " + std::to_string(p) + " follows the readability");
        }
      }
      // Every rank sends to the next `shift` ranks at once and receives from
      // the previous ones, for each size.
      for (const std::size_t bytes : {std::size_t{4097}, std::size_t{64} << 10, std::size_t{1} << 20,
                                      std::size_t{16} << 20}) {
        for (int shift = 1; shift < size; ++shift) {
          const int to = (rank + shift) % size, from = (rank - shift + size) % size;
          std::vector<unsigned char> out(bytes), in(bytes, 0);
          for (std::size_t i = 0; i < bytes; ++i) out[i] = byte_at(i, static_cast<unsigned>(bytes + 7 * rank));
          recorded_op send, recv;
          const std::uint64_t tag = 60 + static_cast<std::uint64_t>(shift);
          check(!ep->post_recv(from, in.data(), bytes, tag, 0, nullptr, &recv), "post recv");
          check(!ep->post_send(to, out.data(), bytes, tag, nullptr, &send), "post send");
          check(drive_until(*ep, [&] { return send.done() && recv.done(); }, in_seconds(30)), "completed");
          check(!send.result.error && !recv.result.error && recv.result.bytes == bytes,
                std::to_string(bytes) + " bytes from rank " + std::to_string(from) + ": " +
                    recv.result.error.message() + " / to rank " + std::to_string(to) + ": " +
                    send.result.error.message());
          bool intact = true;
          for (std::size_t i = 0; i < bytes && intact; ++i)
            intact = in[i] == byte_at(i, static_cast<unsigned>(bytes + 7 * from));
          check(intact, "bytes of " + std::to_string(bytes) + " from rank " + std::to_string(from));
          ex("step");
        }
      }
      return check.failures ? 1 : 0;
    });
    require_all_ok(outcomes);
  }
}

TEST_CASE("sends beyond the provider's queue are queued, not blocked on, and arrive in order") {
  auto outcomes = pdcoll::test::run_ranks(2, [](int rank, int size, const address_exchange& ex) {
    rank_checks check{rank};
    auto ep = fabric::make_endpoint(rank, size, ex);
    auto& fep = static_cast<fabric::fabric_endpoint&>(*ep);
    constexpr int n = 6000;  // more than shm's 1024-entry queue and rxm's credits
    std::vector<recorded_op> ops(n);
    std::vector<std::uint64_t> values(n);
    if (rank == 0) {
      for (int i = 0; i < n; ++i) {
        values[static_cast<std::size_t>(i)] = static_cast<std::uint64_t>(i);
        check(!ep->post_send(1, &values[static_cast<std::size_t>(i)], 8, 44, nullptr, &ops[static_cast<std::size_t>(i)]),
              "post send " + std::to_string(i));
      }
      // Without the queue a post past the provider's room would wait for a
      // receiver that has not started yet, and fail with peer_lost.
      check(fep.deferred_posts() > 0, "some posts were queued");
      ex("posted");
    } else {
      ex("posted");
      for (int i = 0; i < n; ++i) {
        const auto ec = ep->post_recv(0, &values[static_cast<std::size_t>(i)], 8, 44, 0, nullptr,
                                      &ops[static_cast<std::size_t>(i)]);
        if (!check(!ec, "post recv " + std::to_string(i) + ": " + ec.message())) break;
      }
    }
    auto all_done = [&] { return std::all_of(ops.begin(), ops.end(), [](auto& o) { return o.done(); }); };
    check(drive_until(*ep, all_done, in_seconds(60)), "all completed");
    for (int i = 0; i < n && rank == 1; ++i) {
      const auto& o = ops[static_cast<std::size_t>(i)];
      if (o.result.error || values[static_cast<std::size_t>(i)] != static_cast<std::uint64_t>(i)) {
        check(false, "message " + std::to_string(i) + " out of order or failed");
        break;
      }
    }
    check(fep.deferred_now() == 0, "queue drained");
    ex("done");
    return check.failures ? 1 : 0;
  });
  require_all_ok(outcomes);
}

TEST_CASE("an idle shm rank sleeps on its doorbell and a peer's send rings it") {
  auto outcomes = pdcoll::test::run_ranks(2, [](int rank, int size, const address_exchange& ex) {
    rank_checks check{rank};
    auto ep = fabric::make_endpoint(rank, size, ex);
    auto& fep = static_cast<fabric::fabric_endpoint&>(*ep);
    const bool shm = fep.provider() == "shm";
    check(fep.has_doorbell() == shm, "a doorbell on shm only");
    std::uint64_t value = 0;
    recorded_op op;
    // At least 8 rounds, and more (up to 64) until rank 1 was woken by a
    // ring: under load a send may land between two of the receiver's
    // sleeps, where polling finds it (loaded CI runs counted 2 of 5, 1 of 8
    // and once 0 of 8).
    const int least_rounds = 8, most_rounds = 64;
    for (int round = 0; round < most_rounds; ++round) {
      const bool rung = !shm || fep.doorbell_wakeups() >= 1;
      if (ex(rank == 1 && rung && round >= least_rounds ? "stop" : "go")[1] == "stop") break;
      if (rank == 0) {
        ex("ready");
        std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the receiver is asleep by now
        value = 1000 + static_cast<std::uint64_t>(round);
        check(!ep->post_send(1, &value, sizeof value, 3, nullptr, &op), "post send");
        check(drive_until(*ep, [&] { return op.done(); }, in_seconds(10)), "send completed");
      } else {
        check(!ep->post_recv(0, &value, sizeof value, 3, 0, nullptr, &op), "post recv");
        ex("ready");
        check(drive_until(*ep, [&] { return op.done(); }, in_seconds(10)), "receive completed");
        check(value == 1000 + static_cast<std::uint64_t>(round), "value");
      }
      op = recorded_op{};
    }
    // The receiver sleeps on its doorbell (1 ms at a time) while the sender
    // waits, so the sends end such sleeps with a ring; one is asked for:
    // without rings none would count.
    if (shm && rank == 1)
      check(fep.doorbell_wakeups() >= 1, "woken by rings: " + std::to_string(fep.doorbell_wakeups()));
    ex("done");
    return check.failures ? 1 : 0;
  });
  require_all_ok(outcomes);
}

TEST_CASE("a receive from a peer killed mid-transfer can be cancelled and nothing hangs") {
  auto outcomes = pdcoll::test::run_ranks(2, [](int rank, int size, const address_exchange& ex) {
    rank_checks check{rank};
    auto ep = fabric::make_endpoint(rank, size, ex);
    const std::size_t bytes = std::size_t{64} << 20;
    std::vector<unsigned char> buffer(bytes, 1);
    recorded_op op;
    if (rank == 1) {
      ex("ready");
      check(!ep->post_send(0, buffer.data(), bytes, 9, nullptr, &op), "post send");
      ep->progress();
      ::raise(SIGKILL);
    }
    check(!ep->post_recv(1, buffer.data(), bytes, 9, 0, nullptr, &op), "post recv");
    ex("ready");
    // What the provider does on its own when the sender dies: watched for 3 s.
    const bool ended_alone = drive_until(*ep, [&] { return op.done(); }, in_seconds(3));
    std::string seen = ended_alone ? (op.result.error ? "error completion: " + op.result.error.message()
                                                      : "successful completion (transfer finished first)")
                                   : "silence for 3 s";
    std::string cancel_seen = "not needed";
    if (!ended_alone) {
      ep->cancel(&op);
      if (drive_until(*ep, [&] { return op.done(); }, in_seconds(5))) {
        cancel_seen = "cancel completed it";
        check(op.result.error == std::errc::operation_canceled, "cancelled receive reports operation_canceled");
      } else {
        // The provider had matched the receive to the dead peer's transfer
        // and cannot cancel it; closing the endpoint must still end it.
        cancel_seen = "cancel had no effect; endpoint close ended it";
      }
    }
    // A new send to the dead peer must complete (with an error) or be cancellable.
    int x = 1;
    recorded_op late;
    const auto post_error = ep->post_send(1, &x, sizeof x, 10, nullptr, &late);
    std::string late_seen;
    if (post_error) {
      late_seen = "post failed: " + post_error.message();
    } else if (drive_until(*ep, [&] { return late.done(); }, in_seconds(3))) {
      late_seen = late.result.error ? "error completion: " + late.result.error.message() : "completed";
    } else {
      late_seen = "silence for 3 s";
    }
    std::printf("[%s] receive from killed peer: %s; cancel: %s; later send to it: %s\n",
                static_cast<fabric::fabric_endpoint&>(*ep).provider().c_str(), seen.c_str(),
                cancel_seen.c_str(), late_seen.c_str());
    std::fflush(stdout);
    const auto close_start = clock_type::now();
    ep.reset();  // the destructor must not hang on the dead peer either
    check(clock_type::now() - close_start < std::chrono::seconds(10), "endpoint closed promptly");
    check(op.completions == 1, "exactly one completion for the receive");
    if (!ended_alone) check(op.result.error == std::errc::operation_canceled, "it ended as operation_canceled");
    check(late.completions == (post_error ? 0 : 1), "exactly one completion for the late send");
    return check.failures ? 1 : 0;
  }, std::chrono::seconds(60));
  CHECK(outcomes[0].ok());
  CHECK(outcomes[1].signal == SIGKILL);
}

TEST_CASE("8-byte ping-pong latency with 4 pairs of ranks") {
  const bool spin = std::getenv("PDCOLL_TEST_SPIN") != nullptr;
  const int pairs = 4, round_trips = 2000;
  auto outcomes = pdcoll::test::run_ranks(2 * pairs, [&](int rank, int size, const address_exchange& ex) {
    rank_checks check{rank};
    auto ep = fabric::make_endpoint(rank, size, ex);
    const int peer = rank ^ 1;
    std::uint64_t word = 0;
    auto finish = [&](recorded_op& op) {
      const auto deadline = in_seconds(30);
      if (!spin) return drive_until(*ep, [&] { return op.done(); }, deadline);
      while (!op.done() && clock_type::now() < deadline) ep->progress();
      return op.done();
    };
    ex("start");
    const auto start = clock_type::now();
    for (int i = 0; i < round_trips && !check.failures; ++i) {
      recorded_op s, r;
      if (rank % 2 == 0) {
        check(!ep->post_send(peer, &word, 8, 1, nullptr, &s) && finish(s), "ping");
        check(!ep->post_recv(peer, &word, 8, 1, 0, nullptr, &r) && finish(r), "pong");
      } else {
        check(!ep->post_recv(peer, &word, 8, 1, 0, nullptr, &r) && finish(r), "ping");
        check(!ep->post_send(peer, &word, 8, 1, nullptr, &s) && finish(s), "pong");
      }
    }
    const double us = std::chrono::duration<double, std::micro>(clock_type::now() - start).count();
    if (rank % 2 == 0) {
      std::printf("[%s, %s] pair %d: one-way 8-byte latency %.1f us\n",
                  static_cast<fabric::fabric_endpoint&>(*ep).provider().c_str(),
                  spin ? "busy-poll" : "wait()", rank / 2, us / round_trips / 2);
      std::fflush(stdout);
    }
    ex("done");
    return check.failures ? 1 : 0;
  }, std::chrono::seconds(120));
  require_all_ok(outcomes);
}
