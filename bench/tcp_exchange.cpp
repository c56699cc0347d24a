// File: bench/tcp_exchange.cpp — the TCP loopback ceiling for one message
// size: N processes in a ring, each sending to its right neighbour while it
// receives from its left, out of and into buffers of the collective's size.
//
//   tcp_exchange -n 2 -s 16M -t 3 [--chunk 1M] [--bind-to auto|core|none]
//
// A ring all-reduce of S bytes has every rank send and receive 2(n-1)/n·S
// bytes to and from its neighbours; this is the same traffic with nothing
// reduced and nothing waited for, so its per-stream rate bounds the
// all-reduce's bus bandwidth at that size. Unlike iperf3 (bench/tcp_ceiling.py
// measure --lengths), whose one small buffer stays in cache, the buffers here
// are S bytes each, so once they outgrow the cache the copies into and out of
// the socket run from memory as a collective's do. Below that it is no bound:
// a collective's messages fit in the socket buffers and its sender never
// waits for the receiver to drain them, as a continuous stream does.
//
// Every rank polls its two nonblocking sockets on one thread, as a rank's
// progress engine does: it sends (up to --chunk bytes, cycling through its
// S-byte send buffer) whenever its right socket takes more and receives (up
// to --chunk bytes into its S-byte receive buffer) whenever its left one has
// data. The rate is the receiver's, from its first byte to the sender's end
// of stream.
//
// Output: one CSV row per rank on stdout, "rank,buffer_bytes,chunk_bytes,
// seconds,GBps" (10^9 bytes/s received), after a header. Exit status 0, or 1
// with a message when a socket call fails or a rank does not report within
// the duration plus 30 s.
#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <algorithm>
#include <string>
#include <system_error>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

/// "16M" -> 16 << 20 (K, M, G suffixes, as the other benchmarks read sizes).
std::size_t parse_bytes(const std::string& s) {
  std::size_t used = 0;
  const unsigned long long v = std::stoull(s, &used);
  const std::string suffix = s.substr(used);
  const int shift = suffix.empty() ? 0 : suffix == "K" ? 10 : suffix == "M" ? 20 : suffix == "G" ? 30 : -1;
  if (shift < 0) throw std::invalid_argument("bad size '" + s + "' (use a number with K, M or G)");
  return static_cast<std::size_t>(v) << shift;
}

[[noreturn]] void fail(const char* what) { throw std::system_error(errno, std::generic_category(), what); }

/// A socket listening on 127.0.0.1 at a port the kernel picks.
int make_listener(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0 || ::listen(fd, 4) < 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) < 0)
    fail("bind/listen");
  port = ntohs(a.sin_port);
  return fd;
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) fail("connect");
  return fd;
}

/// Whole-buffer write to a pipe or socket.
void write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail("write");
    p += k, n -= static_cast<std::size_t>(k);
  }
}

/// One rank: connect the ring, stream for `seconds`, write its CSV row to `report`.
void run_rank(int rank, int ranks, const std::vector<int>& listeners, const std::vector<int>& ports,
              std::size_t buffer_bytes, std::size_t chunk_bytes, double seconds, int report) {
  const int right = connect_to(ports[static_cast<std::size_t>((rank + 1) % ranks)]);
  const int left = ::accept4(listeners[static_cast<std::size_t>(rank)], nullptr, nullptr, SOCK_CLOEXEC);
  if (left < 0) fail("accept");
  for (int fd : listeners) ::close(fd);
  const int one = 1;
  ::setsockopt(right, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(left, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Written before timing, so no page is faulted in while the clock runs.
  std::vector<unsigned char> out(buffer_bytes), in(buffer_bytes);
  for (std::size_t i = 0; i < buffer_bytes; ++i) out[i] = static_cast<unsigned char>(i * 131 + rank), in[i] = 0;

  // One thread, nonblocking sockets and poll(), as a rank's progress engine
  // runs them: a sender thread beside a receiving one paid a context switch
  // per blocked call and measured below what a 2-rank all-reduce reaches at
  // 1 MiB.
  for (int fd : {right, left})
    if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) fail("fcntl");
  const auto end = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  std::size_t received = 0, in_at = 0, out_at = 0;
  bool sending = true;
  clock_type::time_point first{}, last{};
  for (;;) {
    if (sending && clock_type::now() >= end) {
      ::shutdown(right, SHUT_WR);
      sending = false;
    }
    pollfd p[2] = {{left, POLLIN, 0}, {right, POLLOUT, 0}};
    if (::poll(p, sending ? 2 : 1, 100) < 0) {
      if (errno == EINTR) continue;
      fail("poll");
    }
    if (sending && (p[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t k = ::send(right, out.data() + out_at, std::min(chunk_bytes, buffer_bytes - out_at), MSG_NOSIGNAL);
      if (k > 0) out_at = (out_at + static_cast<std::size_t>(k)) % buffer_bytes;
      else if (k < 0 && errno != EAGAIN && errno != EINTR) sending = false;  // the receiver is gone; it reports
    }
    if (p[0].revents & (POLLIN | POLLERR | POLLHUP)) {
      const ssize_t k = ::recv(left, in.data() + in_at, std::min(chunk_bytes, buffer_bytes - in_at), 0);
      if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (k < 0) fail("recv");
      last = clock_type::now();
      if (k == 0) break;  // the left neighbour's end of stream
      if (received == 0) first = last;
      received += static_cast<std::size_t>(k);
      in_at = (in_at + static_cast<std::size_t>(k)) % buffer_bytes;
    }
  }
  while (sending) {  // the left neighbour stopped first: finish the own stream's duration
    if (clock_type::now() >= end) {
      ::shutdown(right, SHUT_WR);
      sending = false;
      break;
    }
    pollfd p{right, POLLOUT, 0};
    if (::poll(&p, 1, 100) > 0) {
      const ssize_t k = ::send(right, out.data() + out_at, std::min(chunk_bytes, buffer_bytes - out_at), MSG_NOSIGNAL);
      if (k > 0) out_at = (out_at + static_cast<std::size_t>(k)) % buffer_bytes;
      else if (k < 0 && errno != EAGAIN && errno != EINTR) break;
    }
  }
  // From the first byte to the left neighbour's end of stream: ranks start
  // their clocks at slightly different times.
  if (received == 0) throw std::runtime_error("nothing arrived from the left neighbour");
  const double elapsed = std::chrono::duration<double>(last - first).count();
  char row[160];
  const int len = std::snprintf(row, sizeof row, "%d,%zu,%zu,%.3f,%.4f\n", rank, buffer_bytes, chunk_bytes, elapsed,
                                elapsed > 0 ? static_cast<double>(received) / elapsed / 1e9 : 0.0);
  write_all(report, row, static_cast<std::size_t>(len));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"TCP loopback ring exchange: the per-stream ceiling for one message size"};
  int ranks = 2;
  std::string size = "16M", chunk = "1M", bind_to = "auto";
  double seconds = 3;
  app.add_option("-n,--ranks", ranks, "processes in the ring")->check(CLI::Range(2, 256));
  app.add_option("-s,--size", size, "buffer bytes per rank and direction (K, M, G suffixes)");
  app.add_option("-t,--seconds", seconds, "how long every rank sends")->check(CLI::Range(0.1, 600.0));
  app.add_option("--chunk", chunk, "bytes per send() and most bytes per recv()");
  app.add_option("--bind-to", bind_to, "core: rank r on the r-th usable CPU; auto: core when each rank gets one")
      ->check(CLI::IsMember({"auto", "core", "none"}));
  CLI11_PARSE(app, argc, argv);
  try {
    const std::size_t buffer_bytes = parse_bytes(size), chunk_bytes = std::min(parse_bytes(chunk), buffer_bytes);
    if (buffer_bytes == 0 || chunk_bytes == 0) throw std::invalid_argument("size and chunk must be positive");
    cpu_set_t usable;
    if (::sched_getaffinity(0, sizeof usable, &usable) < 0) fail("sched_getaffinity");
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &usable)) cpus.push_back(c);
    const bool bind = bind_to == "core" || (bind_to == "auto" && static_cast<std::size_t>(ranks) <= cpus.size());

    std::vector<int> listeners(static_cast<std::size_t>(ranks)), ports(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) listeners[static_cast<std::size_t>(r)] = make_listener(ports[static_cast<std::size_t>(r)]);
    int report[2];
    if (::pipe2(report, O_CLOEXEC) < 0) fail("pipe");
    std::vector<pid_t> children;
    for (int r = 0; r < ranks; ++r) {
      const pid_t pid = ::fork();
      if (pid < 0) fail("fork");
      if (pid == 0) {
        ::close(report[0]);
        int status = 0;
        try {
          if (bind) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpus[static_cast<std::size_t>(r) % cpus.size()], &one);
            ::sched_setaffinity(0, sizeof one, &one);
          }
          run_rank(r, ranks, listeners, ports, buffer_bytes, chunk_bytes, seconds, report[1]);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "tcp_exchange: rank %d: %s\n", r, e.what());
          status = 1;
        }
        ::_exit(status);
      }
      children.push_back(pid);
    }
    for (int fd : listeners) ::close(fd);
    ::close(report[1]);

    // Collect every rank's row, with a deadline: a rank that hangs is killed.
    std::string rows;
    const auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                  std::chrono::duration<double>(seconds + 30));
    for (;;) {
      const auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
      pollfd p{report[0], POLLIN, 0};
      const int ready = left_ms <= 0 ? 0 : ::poll(&p, 1, static_cast<int>(left_ms));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) fail("poll");
      if (ready == 0) {
        for (pid_t c : children) ::kill(c, SIGKILL);
        std::fprintf(stderr, "tcp_exchange: the ranks did not finish within %.0f s\n", seconds + 30);
        break;
      }
      char buf[4096];
      const ssize_t k = ::read(report[0], buf, sizeof buf);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      rows.append(buf, static_cast<std::size_t>(k));
    }
    int failed = 0;
    for (pid_t c : children) {
      int status = 0;
      ::waitpid(c, &status, 0);
      failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    std::printf("rank,buffer_bytes,chunk_bytes,seconds,GBps\n%s", rows.c_str());
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tcp_exchange: %s\n", e.what());
    return 1;
  }
}
