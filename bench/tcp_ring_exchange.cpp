// File: bench/tcp_ring_exchange.cpp — the TCP loopback ceiling of a ring
// all-reduce at each message size: the ring's data movement with the
// reduction left out.
//
// For a buffer of S bytes on n ranks it runs what algo::ring's all-reduce
// sends and receives: 2(n-1) steps, in each of which every rank sends one
// segment (S/n bytes) to rank + 1 while it receives one from rank - 1, in
// chunks of 1 MiB, a chunk of step t+1 leaving as soon as the same chunk of
// step t has arrived (the ring's pipeline). Everything lands in place in
// the S-byte buffer, so above the caches the bytes come from and go to
// DRAM, as a real all-reduce's do. One thread per rank sends and another
// receives, blocking, on plain sockets with TCP_NODELAY, the kernel's
// buffer autotuning and the congestion control pdcoll's io_uring transport
// picks on one host (CUBIC; --congestion system keeps the kernel's, e.g.
// BBR, whose pacing takes large sizes to about half): what the loopback
// does for a ring at best.
// bench/tcp_ceiling.py's iperf3 streams write one buffer of at most 1 MiB
// over and over, which stays in cache; this one shows where large buffers
// take the ceiling down, so compare.sh sets pdcoll's TCP rows against both.
//
//     tools/pdcoll-run -n 2 build-bench/bench/tcp_ring_exchange -b 4K -e 256M -f 4
//     tools/pdcoll-run -n 4 build-bench/bench/tcp_ring_exchange -b 1M -e 64M --csv ring.csv
//
// Rows are printed like pdcoll-bench's (in-place column; time = median or
// mean of -n iterations on rank 0, busbw = 2(n-1)/n · S / time, the rate at
// which each rank sends) under library "tcp-ceiling", algorithm "ring
// exchange". Ranks find each other through the job's rendezvous store
// (pdcoll::job) and listen on 127.0.0.1 only.
#include "bench_report.hpp"

#include <pdcoll/algorithm/detail/partition.hpp>
#include <pdcoll/bootstrap/detail/socket.hpp>
#include <pdcoll/pdcoll.hpp>
#include <pdcoll/transport/uring_tcp/detail/congestion.hpp>

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t chunk_bytes = std::size_t{1} << 20;  // algo::ring's chunk

[[noreturn]] void fail(const char* what) { throw std::system_error(errno, std::generic_category(), what); }

using pdcoll::bootstrap::detail::unique_fd;

/// The ring's two connections, blocking: to rank + 1 (sends) and from rank - 1 (receives).
struct ring_links {
  unique_fd right, left;
};

/// Connects every rank to rank + 1 over 127.0.0.1, the ports exchanged
/// through the job's store; each wait ends within `timeout`.
ring_links connect_ring(pdcoll::job& job, std::chrono::milliseconds timeout, const std::string& congestion) {
  namespace sock = pdcoll::bootstrap::detail;
  const int rank = job.rank(), n = job.world_size();
  const auto deadline = sock::clock::now() + timeout;
  namespace uring = pdcoll::transport::uring_tcp::detail;
  // As uring_tcp does: the congestion control before the connection exists
  // (the accepted link inherits the listener's).
  auto [listener, port] = sock::listen_on("127.0.0.1", 0, 1);
  uring::preset_congestion_control(listener.get(), congestion);
  job.store().set("tcp_ring_exchange.port." + std::to_string(rank), std::to_string(port));
  const auto right_port = static_cast<std::uint16_t>(
      std::stoi(job.store().get("tcp_ring_exchange.port." + std::to_string((rank + 1) % n), timeout)));
  ring_links links;
  links.right = sock::connect_until("127.0.0.1", right_port, deadline, timeout,  // TCP_NODELAY set
                                    [&](int fd) { uring::preset_congestion_control(fd, congestion); });
  pollfd p{listener.get(), POLLIN, 0};
  if (::poll(&p, 1, sock::poll_timeout(deadline)) != 1) fail("no connection from rank - 1 in time");
  links.left = unique_fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));  // blocking
  if (!links.left) fail("accept from rank - 1");
  const int one = 1;
  if (::setsockopt(links.left.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) fail("setsockopt(TCP_NODELAY)");
  for (const auto* fd : {&links.right, &links.left})
    uring::apply_congestion_control(fd->get(), congestion);
  const int flags = ::fcntl(links.right.get(), F_GETFL);
  if (flags < 0 || ::fcntl(links.right.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) fail("fcntl(O_NONBLOCK)");
  return links;
}

/// One chunk of the ring: bytes [offset, offset + size) of the buffer, in step `step`.
struct piece {
  std::size_t offset, size;
  int step;
  std::size_t chunk;
};

/// The ring all-reduce's pieces for `bytes` on rank r of n: what r sends and
/// what it receives, in order (algo::ring's segment order, element-aligned
/// for float32).
struct ring_plan {
  std::vector<piece> sends, receives;
  std::vector<std::size_t> first_receive;  // index in `receives` of each step's first chunk

  ring_plan(std::size_t bytes, int r, int n) {
    const std::size_t count = bytes / sizeof(float);
    const std::size_t chunk = chunk_bytes / sizeof(float);
    auto segment_sent = [&](int rank, int t) {
      return static_cast<std::size_t>(t < n - 1 ? (rank - t + n) % n : (rank - (t - (n - 1)) + 1 + n) % n);
    };
    auto add = [&](std::vector<piece>& to, std::size_t seg, int t) {
      const std::size_t first = pdcoll::algo::detail::segment_begin(count, static_cast<std::size_t>(n), seg);
      const std::size_t size = pdcoll::algo::detail::segment_size(count, static_cast<std::size_t>(n), seg);
      for (std::size_t c = 0, at = 0; at < size; ++c, at += chunk)
        to.push_back({(first + at) * sizeof(float), std::min(chunk, size - at) * sizeof(float), t, c});
    };
    for (int t = 0; t < 2 * (n - 1); ++t) {
      first_receive.push_back(receives.size());
      add(sends, segment_sent(r, t), t);
      add(receives, segment_sent((r - 1 + n) % n, t), t);
    }
  }
};

/// Runs exchanges on a sender thread while the caller receives.
class ring_exchange {
 public:
  explicit ring_exchange(ring_links& links) : links_(links) {
    sender_ = std::thread([this] { send_loop(); });
  }
  ring_exchange(const ring_exchange&) = delete;
  ring_exchange& operator=(const ring_exchange&) = delete;
  ~ring_exchange() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    start_.notify_all();
    sender_.join();
  }

  /// One ring all-reduce's traffic on `buffer`; throws std::system_error.
  void run(std::vector<std::byte>& buffer, const ring_plan& plan) {
    received_.store(0, std::memory_order_relaxed);
    {
      std::lock_guard lock(mutex_);
      buffer_ = buffer.data();
      plan_ = &plan;
      send_error_ = 0;
      sending_ = true;
      ++generation_;
    }
    start_.notify_all();
    int error = 0;
    for (std::size_t i = 0; i < plan.receives.size() && error == 0; ++i) {
      const piece& p = plan.receives[i];
      error = transfer(links_.left.get(), buffer.data() + p.offset, p.size, /*send=*/false);
      received_.store(i + 1, std::memory_order_release);
      received_.notify_one();
    }
    if (error) {  // release a sender waiting for a chunk that will not come
      received_.store(plan.receives.size(), std::memory_order_release);
      received_.notify_one();
    }
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return !sending_; });
    if (error || send_error_) {
      errno = error ? error : send_error_;
      fail(error ? "recv from rank - 1" : "send to rank + 1");
    }
  }

 private:
  // Whole transfer of [p, p + size); 0 or errno (ECONNRESET for a closed peer).
  static int transfer(int fd, std::byte* p, std::size_t size, bool send) {
    while (size > 0) {
      const ssize_t k = send ? ::send(fd, p, size, MSG_NOSIGNAL) : ::recv(fd, p, size, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) return errno;
      if (k == 0) return ECONNRESET;
      p += k;
      size -= static_cast<std::size_t>(k);
    }
    return 0;
  }

  void send_loop() {
    std::uint64_t seen = 0;
    for (;;) {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return quit_ || generation_ != seen; });
      if (quit_) return;
      seen = generation_;
      const ring_plan& plan = *plan_;
      std::byte* buffer = buffer_;
      lock.unlock();
      int error = 0;
      for (const piece& p : plan.sends) {
        if (p.step > 0) {
          // The same chunk of the previous step must have arrived.
          const std::size_t need = plan.first_receive[static_cast<std::size_t>(p.step - 1)] + p.chunk + 1;
          for (std::size_t got = received_.load(std::memory_order_acquire); got < need;
               got = received_.load(std::memory_order_acquire))
            received_.wait(got, std::memory_order_acquire);
        }
        if ((error = transfer(links_.right.get(), buffer + p.offset, p.size, /*send=*/true)) != 0) break;
      }
      lock.lock();
      send_error_ = error;
      sending_ = false;
      done_.notify_all();
    }
  }

  ring_links& links_;
  std::thread sender_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  std::atomic<std::size_t> received_{0};
  std::byte* buffer_ = nullptr;
  const ring_plan* plan_ = nullptr;
  std::uint64_t generation_ = 0;
  bool sending_ = false, quit_ = false;
  int send_error_ = 0;
};

struct options {
  std::string min_bytes = "4K", max_bytes = "256M", timing = "median", csv, json, congestion;
  double factor = 2;
  int iters = 20, warmup = 5;
};

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"TCP loopback ceiling of a ring all-reduce: the ring's traffic at each size, no reduction"};
  app.add_option("-b,--minbytes", o.min_bytes, "smallest size (K, M, G suffixes)");
  app.add_option("-e,--maxbytes", o.max_bytes, "largest size");
  app.add_option("-f,--stepfactor", o.factor, "size multiplier");
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", o.warmup, "untimed iterations per size")->check(CLI::NonNegativeNumber);
  app.add_option("--timing", o.timing, "time column: median or mean of the iterations")
      ->check(CLI::IsMember({"median", "mean"}));
  app.add_option("--csv", o.csv, "also write the rows to this CSV file (rank 0)");
  app.add_option("--json", o.json, "also write the rows to this JSON file (rank 0)");
  app.add_option("--congestion", o.congestion,
                 "TCP congestion control: empty for the io_uring transport's default (CUBIC on loopback), "
                 "'system' for the kernel's, or a name");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto sizes = pdcoll::bench::size_sweep(pdcoll::bench::parse_bytes(o.min_bytes),
                                                 pdcoll::bench::parse_bytes(o.max_bytes), o.factor);
    pdcoll::job job = pdcoll::job::from_environment();
    const int rank = job.rank(), n = job.world_size();
    if (n < 2) {
      if (rank == 0) std::printf("tcp_ring_exchange: one rank has no ring to measure\n");
      return 0;
    }
    ring_links links = connect_ring(job, std::chrono::seconds(60), o.congestion);
    std::unique_ptr<pdcoll::bench::report> report;
    if (rank == 0) {
      report = std::make_unique<pdcoll::bench::report>(
          pdcoll::bench::run_description{"tcp-ceiling", "tcp", "ring exchange", "all_reduce", "host", n, o.timing},
          o.csv, o.json);
      std::printf("# tcp_ring_exchange  ranks %d  chunk %zu  (the ring's traffic, no reduction; in-place column)\n",
                  n, chunk_bytes);
      report->print_header();
    }
    ring_exchange exchange(links);
    for (const std::size_t requested : sizes) {
      pdcoll::bench::row row;
      row.count = requested / sizeof(float);
      row.bytes = row.count * sizeof(float);
      row.type = "float";
      row.redop = "none";
      row.out_of_place.available = false;
      std::vector<std::byte> buffer(row.bytes, std::byte{1});  // touched: no page faults in the timing
      const ring_plan plan(row.bytes, rank, n);
      for (int i = 0; i < o.warmup; ++i) exchange.run(buffer, plan);
      pdcoll::exec::sync_wait(pdcoll::barrier(job.comm()));
      std::vector<double> samples;
      for (int i = 0; i < o.iters; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        exchange.run(buffer, plan);
        samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      row.in_place.time_us = pdcoll::bench::summarize(samples, o.timing);
      pdcoll::bench::set_bandwidth(row.in_place, row.bytes, "all_reduce", n);
      if (report) report->add(row);
    }
    if (report) report->finish();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tcp_ring_exchange: %s\n", e.what());
    return 1;
  }
}
