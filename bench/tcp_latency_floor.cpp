// File: bench/tcp_latency_floor.cpp — the floor under a small all-reduce
// over TCP loopback: recursive doubling on plain sockets, no library.
//
// Every rank connects to every other over 127.0.0.1 (TCP_NODELAY, the
// congestion control pdcoll's io_uring transport picks on one host) and
// runs algo::recursive_doubling's all-reduce of float sums: log2 P
// exchanges of the whole buffer with the partners rank ^ 1, rank ^ 2, …,
// and for a world that is not a power of two the same fold (the extra ranks
// hand their data to a partner first and get the result back last). Each
// message carries a 16-byte header, as uring_tcp's wire format does, and is
// written with one send(2) and read with recv(2). How a rank waits for its
// partner is the choice that matters once ranks outnumber cores:
//   --wait poll   recv(MSG_DONTWAIT) and sched_yield for --poll-us, then a
//                 blocking recv (uring_tcp's wait, default 20 us, PDCOLL_POLL_US)
//   --wait block  a blocking recv at once
//   --wait spin   recv(MSG_DONTWAIT) and sched_yield, never sleeping
// --step-work-ns N spins N ns before each send and after each receive: what
// a library's own work per step costs once ranks outnumber cores (session
// 26, 4 ranks on 2 cores, 8 bytes, medians of 5 alternated runs: 57 us
// without, 63 us with 500 ns, 67 us with 1,000 ns; design-notes item 25).
// Nothing here can be faster than the kernel's TCP path and the scheduler,
// so the gap between this and pdcoll-bench (--transport uring, same sizes)
// is what the library's own work and waiting cost.
//
//     tools/pdcoll-run -n 4 build-bench/bench/tcp_latency_floor                 # 8 bytes, 2000 iterations
//     tools/pdcoll-run -n 2 build-bench/bench/tcp_latency_floor -b 8 -e 64K -f 4 --wait spin
//
// Rows are printed like pdcoll-bench's (in-place column, time = mean or
// median of -n iterations on rank 0, #wrong counted on every rank) under
// library "tcp-floor", algorithm "recursive doubling". Ranks find each
// other through the job's rendezvous store (pdcoll::job).
//
// Measured in session 25 on a 2-vCPU VM of another kind than the reference
// one (Linux 6.18, a system call 272 ns; design-notes item 25), 4 ranks,
// 8 bytes, mean of 5,000 iterations, 12 rounds alternated with pdcoll-bench
// (--transport uring) and Open MPI's TCP BTL: median 53.5 us (45.6-70.4)
// against pdcoll's 80.4 (65.9-106.1) and Open MPI's 85.6 (72.5-98.6).
#include "bench_report.hpp"

#include <pdcoll/algorithm/detail/partition.hpp>
#include <pdcoll/bootstrap/detail/socket.hpp>
#include <pdcoll/pdcoll.hpp>
#include <pdcoll/transport/poll_policy.hpp>
#include <pdcoll/transport/uring_tcp/detail/congestion.hpp>

#include <CLI/CLI.hpp>

#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

namespace {

[[noreturn]] void fail(const char* what) { throw std::system_error(errno, std::generic_category(), what); }

using pdcoll::bootstrap::detail::unique_fd;
using clock_type = std::chrono::steady_clock;

/// Largest size measured: both partners of an exchange send before they
/// receive, which the sockets' buffers (autotuned from 128 KiB) always hold.
constexpr std::size_t max_bytes = std::size_t{64} << 10;

/// How a rank waits for its partner's message (see the file comment).
enum class wait_mode { poll, block, spin };

/// uring_tcp's header: tag and payload length.
struct header {
  std::uint64_t tag = 0, length = 0;
};

/// One connection per peer (invalid at this rank's own index).
std::vector<unique_fd> connect_mesh(pdcoll::job& job, std::chrono::milliseconds timeout, const std::string& congestion) {
  namespace sock = pdcoll::bootstrap::detail;
  namespace uring = pdcoll::transport::uring_tcp::detail;
  const int rank = job.rank(), n = job.world_size();
  const auto deadline = sock::clock::now() + timeout;
  auto [listener, port] = sock::listen_on("127.0.0.1", 0, n);
  uring::preset_congestion_control(listener.get(), congestion);
  job.store().set("tcp_latency_floor.port." + std::to_string(rank), std::to_string(port));
  std::vector<unique_fd> links(static_cast<std::size_t>(n));
  // The lower rank of a pair connects and introduces itself.
  for (int peer = rank + 1; peer < n; ++peer) {
    const auto peer_port = static_cast<std::uint16_t>(
        std::stoi(job.store().get("tcp_latency_floor.port." + std::to_string(peer), timeout)));
    auto fd = sock::connect_until("127.0.0.1", peer_port, deadline, timeout,  // TCP_NODELAY set
                                  [&](int s) { uring::preset_congestion_control(s, congestion); });
    if (!sock::set_nonblocking(fd.get())) fail("fcntl(O_NONBLOCK)");
    const std::int32_t me = rank;
    pollfd p{fd.get(), POLLOUT, 0};
    if (::poll(&p, 1, sock::poll_timeout(deadline)) != 1 || ::send(fd.get(), &me, sizeof me, MSG_NOSIGNAL) != sizeof me)
      fail("introduce to a higher rank");
    links[static_cast<std::size_t>(peer)] = std::move(fd);
  }
  for (int accepted = 0; accepted < rank; ++accepted) {
    pollfd p{listener.get(), POLLIN, 0};
    if (::poll(&p, 1, sock::poll_timeout(deadline)) != 1) fail("no connection from a lower rank in time");
    unique_fd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd) fail("accept");
    std::int32_t who = -1;
    pollfd q{fd.get(), POLLIN, 0};
    if (::poll(&q, 1, sock::poll_timeout(deadline)) != 1 || ::recv(fd.get(), &who, sizeof who, MSG_WAITALL) != sizeof who ||
        who < 0 || who >= rank || links[static_cast<std::size_t>(who)])
      fail("introduction from a lower rank");
    const int one = 1;
    if (::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) fail("setsockopt(TCP_NODELAY)");
    uring::apply_congestion_control(fd.get(), congestion);
    links[static_cast<std::size_t>(who)] = std::move(fd);
  }
  return links;
}

/// Recursive doubling over the mesh, waiting as `mode` says.
class recursive_doubling {
 public:
  recursive_doubling(std::vector<unique_fd>& links, int rank, wait_mode mode, std::chrono::microseconds poll,
                     std::chrono::nanoseconds step_work)
      : links_(links), rank_(rank), fold_(static_cast<int>(links.size())), mode_(mode), poll_(poll),
        step_work_(step_work) {}

  /// All-reduces `data` (float sum) in place; throws std::system_error.
  void run(std::vector<float>& data) {
    incoming_.resize(data.size());
    const bool folded = rank_ < 2 * fold_.extra;
    const bool sits_out = fold_.sits_out(rank_);
    if (folded) {
      if (sits_out) send(rank_ + 1, data);
      else receive_and_add(rank_ - 1, data);
    }
    if (const int active = fold_.active_rank(rank_); active >= 0) {
      for (int mask = 1; mask < fold_.pow2; mask <<= 1) {
        const int partner = fold_.real_rank(active ^ mask);
        work();
        send(partner, data);
        receive_and_add(partner, data);
        work();
      }
    }
    if (folded) {
      if (sits_out) receive(rank_ + 1, data.data(), data.size());
      else send(rank_ - 1, data);
    }
  }

 private:
  void send(int peer, const std::vector<float>& data) {
    header h{0, data.size() * sizeof(float)};
    iovec parts[2] = {{&h, sizeof h}, {const_cast<float*>(data.data()), h.length}};
    msghdr m{};
    m.msg_iov = parts;
    m.msg_iovlen = 2;
    std::size_t left = sizeof h + h.length;
    while (left > 0) {  // a short write moves the iovecs on
      const ssize_t k = ::sendmsg(fd(peer), &m, MSG_NOSIGNAL);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{fd(peer), POLLOUT, 0};
        ::poll(&p, 1, 60'000);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) fail("sendmsg");
      left -= static_cast<std::size_t>(k);
      for (std::size_t done = static_cast<std::size_t>(k); done > 0 && m.msg_iovlen > 0;) {
        const std::size_t take = std::min(done, m.msg_iov->iov_len);
        m.msg_iov->iov_base = static_cast<std::byte*>(m.msg_iov->iov_base) + take;
        m.msg_iov->iov_len -= take;
        done -= take;
        if (m.msg_iov->iov_len == 0) {
          ++m.msg_iov;
          --m.msg_iovlen;
        }
      }
    }
  }

  /// --step-work-ns: CPU time spent as a library's own work would be (a spin
  /// on the clock), before each send and after each receive.
  void work() const noexcept {
    if (step_work_.count() == 0) return;
    const auto until = clock_type::now() + step_work_;
    while (clock_type::now() < until) {
    }
  }

  void receive_and_add(int peer, std::vector<float>& data) {
    receive(peer, incoming_.data(), incoming_.size());
    for (std::size_t i = 0; i < data.size(); ++i) data[i] += incoming_[i];
  }

  /// Header and payload in one read where the socket has both, as
  /// uring_tcp's staging buffer takes them.
  void receive(int peer, float* into, std::size_t count) {
    const std::size_t payload = count * sizeof(float);
    message_.resize(sizeof(header) + payload);
    read_exactly(peer, message_.data(), message_.size());
    header h;
    std::memcpy(&h, message_.data(), sizeof h);
    if (h.length != payload) {
      errno = EPROTO;
      fail("message of the wrong length");
    }
    std::memcpy(into, message_.data() + sizeof h, payload);
  }

  void read_exactly(int peer, std::byte* p, std::size_t size) {
    auto polling_since = clock_type::time_point{};
    while (size > 0) {
      const bool blocking = mode_ == wait_mode::block ||
                            (mode_ == wait_mode::poll && polling_since != clock_type::time_point{} &&
                             clock_type::now() - polling_since >= poll_);
      if (blocking) {
        pollfd q{fd(peer), POLLIN, 0};
        if (::poll(&q, 1, 60'000) != 1) {
          errno = ETIMEDOUT;
          fail("no data from a partner within 60 s");
        }
      }
      const ssize_t k = ::recv(fd(peer), p, size, MSG_DONTWAIT);
      if (k > 0) {
        p += k;
        size -= static_cast<std::size_t>(k);
        continue;
      }
      if (k == 0) {
        errno = ECONNRESET;
        fail("a partner closed its connection");
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) fail("recv");
      if (polling_since == clock_type::time_point{}) polling_since = clock_type::now();
      if (mode_ != wait_mode::block) ::sched_yield();
    }
  }

  int fd(int peer) const { return links_[static_cast<std::size_t>(peer)].get(); }

  std::vector<unique_fd>& links_;
  int rank_;
  pdcoll::algo::detail::fold fold_;
  wait_mode mode_;
  std::chrono::microseconds poll_;
  std::chrono::nanoseconds step_work_;
  std::vector<float> incoming_;
  std::vector<std::byte> message_;
};

struct options {
  std::string min_bytes = "8", max_bytes = "8", timing = "mean", wait = "poll", csv, json, congestion;
  double factor = 2;
  int iters = 2000, warmup = 200;
  double settle = 0;  // seconds of untimed all-reduces before the first size
  long poll_us = -1;
  long step_work_ns = 0;
};

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"Floor under a small all-reduce over TCP loopback: recursive doubling on plain sockets"};
  app.add_option("-b,--minbytes", o.min_bytes, "smallest size (K, M suffixes; whole floats)");
  app.add_option("-e,--maxbytes", o.max_bytes, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", o.factor, "size multiplier")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", o.warmup, "untimed iterations per size")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--settle", o.settle,
                 "seconds of untimed all-reduces at the first size before measuring, as pdcoll-bench's")
      ->capture_default_str()->check(CLI::Range(0.0, 3600.0));
  app.add_option("--timing", o.timing, "time column: median or mean of the iterations")
      ->capture_default_str()
      ->check(CLI::IsMember({"median", "mean"}));
  app.add_option("--wait", o.wait, "poll (then block), block or spin; see the file comment")
      ->capture_default_str()
      ->check(CLI::IsMember({"poll", "block", "spin"}));
  app.add_option("--poll-us", o.poll_us, "how long --wait poll polls (default: uring_tcp's, PDCOLL_POLL_US or 20)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--step-work-ns", o.step_work_ns,
                 "CPU work (a spin) before each send and after each receive, as a library's would be")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--csv", o.csv, "also write the rows to this CSV file (rank 0)");
  app.add_option("--json", o.json, "also write the rows to this JSON file (rank 0)");
  app.add_option("--congestion", o.congestion,
                 "TCP congestion control: empty for the io_uring transport's default (CUBIC on loopback), "
                 "'system' for the kernel's, or a name");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto sizes = pdcoll::bench::size_sweep(pdcoll::bench::parse_bytes(o.min_bytes),
                                                 pdcoll::bench::parse_bytes(o.max_bytes), o.factor);
    if (sizes.empty() || sizes.back() > max_bytes) {
      // Both partners send before they receive: above the sockets' buffers
      // they would wait for each other.
      std::fprintf(stderr, "tcp_latency_floor: sizes from 4 bytes to %zu bytes (a floor for small messages)\n",
                   max_bytes);
      return 2;
    }
    const wait_mode mode = o.wait == "block" ? wait_mode::block : o.wait == "spin" ? wait_mode::spin : wait_mode::poll;
    const auto poll = o.poll_us >= 0 ? std::chrono::microseconds(o.poll_us) : pdcoll::transport::default_poll_before_sleep();
    pdcoll::job job = pdcoll::job::from_environment();
    const int rank = job.rank(), n = job.world_size();
    auto links = connect_mesh(job, std::chrono::seconds(60), o.congestion);
    std::unique_ptr<pdcoll::bench::report> report;
    if (rank == 0) {
      report = std::make_unique<pdcoll::bench::report>(
          pdcoll::bench::run_description{"tcp-floor", "tcp", "recursive doubling", "all_reduce", "host", n, o.timing},
          o.csv, o.json);
      std::printf("# tcp_latency_floor  ranks %d  wait %s", n, o.wait.c_str());
      if (mode == wait_mode::poll) std::printf(" %lld us", static_cast<long long>(poll.count()));
      if (o.step_work_ns > 0) std::printf("  step work %ld ns", o.step_work_ns);
      std::printf("  (recursive doubling on plain sockets; in-place column)\n");
      report->print_header();
    }
    recursive_doubling algorithm(links, rank, mode, poll, std::chrono::nanoseconds(o.step_work_ns));
    for (const std::size_t requested : sizes) {
      pdcoll::bench::row row;
      row.count = std::max<std::size_t>(requested / sizeof(float), 1);
      row.bytes = row.count * sizeof(float);
      row.type = "float";
      row.redop = "sum";
      row.out_of_place.available = false;
      // Rank r contributes r + 1 + i % 7 at element i: sums are small
      // integers, exact in float.
      auto fill = [&](std::vector<float>& data) {
        for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 7));
      };
      std::vector<float> data(row.count);
      if (requested == sizes.front()) {
        pdcoll::bench::settle(o.settle, [&] { fill(data); algorithm.run(data); }, [&](bool still) {
          std::vector<std::uint32_t> flag{still ? 1u : 0u};
          pdcoll::exec::sync_wait(pdcoll::all_reduce(job.comm(), flag, pdcoll::op::max));
          return flag[0] != 0;
        });
      }
      for (int i = 0; i < o.warmup; ++i) {
        fill(data);
        algorithm.run(data);
      }
      pdcoll::exec::sync_wait(pdcoll::barrier(job.comm()));
      std::vector<double> samples;
      samples.reserve(static_cast<std::size_t>(o.iters));
      for (int i = 0; i < o.iters; ++i) {
        fill(data);
        const auto t0 = clock_type::now();
        algorithm.run(data);
        samples.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
      }
      long long wrong = 0;  // the last iteration's result
      for (std::size_t i = 0; i < data.size(); ++i) {
        const double expected = static_cast<double>(n) * (n + 1) / 2 + static_cast<double>(n) * static_cast<double>(i % 7);
        wrong += static_cast<double>(data[i]) != expected;
      }
      std::vector<long long> all(1, wrong);
      pdcoll::exec::sync_wait(pdcoll::all_reduce(job.comm(), all, pdcoll::op::sum));
      row.in_place.wrong = all[0];
      row.in_place.time_us = pdcoll::bench::summarize(samples, o.timing);
      pdcoll::bench::set_bandwidth(row.in_place, row.bytes, "all_reduce", n);
      if (report) report->add(row);
    }
    if (report) report->finish();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tcp_latency_floor: %s\n", e.what());
    return 1;
  }
}
