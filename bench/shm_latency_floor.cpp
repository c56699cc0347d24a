// File: bench/shm_latency_floor.cpp — the floor under a small all-reduce
// over shared memory: P processes, one cache-line mailbox each, no library.
//
// Each rank writes its float values and a sequence number into its mailbox
// (two slots, by the sequence's parity), spins until every peer's sequence
// has reached its own, and sums the peers' values in rank order: one cache
// line out and P-1 in per operation, the least any shared-memory all-reduce
// moves between cores. A slot is written again two operations later, when
// every peer has published the operation in between and so has read it.
// The gap between this and pdcoll-bench (--transport shm, 8 bytes) or Open
// MPI's vader is what a library's own work per operation costs.
//
//     build-bench/bench/shm_latency_floor                # 2 ranks, 8 bytes, 5 rounds of 200,000
//     build-bench/bench/shm_latency_floor --ranks 4 --rounds 3
//
// Ranks are forked from one process and, as pdcoll-run does by default,
// pinned to a CPU each where there are enough CPUs (--bind-to none: not);
// where they outnumber the CPUs a waiting rank yields instead of spinning.
// Prints each round's mean time per operation on rank 0, then the median;
// exits 1 where a rank's sum is wrong or a round outlasts 30 s (a peer died).
//
// Measured in session 38 (2-vCPU AMD EPYC VM, Linux 6.18), 2 ranks, 8 bytes:
// 0.058 us, where pdcoll-bench's 2-rank shm row and Open MPI's vader both
// took 0.22 us in the same session's table (design-notes item 38).
#include <CLI/CLI.hpp>

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

#include <pdcoll/detail/cpu_relax.hpp>

namespace {

constexpr int max_values = 12;
/// How long a round may take before a rank gives up on its peers (one died).
constexpr std::chrono::seconds peer_deadline{30};  // floats per slot: a slot is one 64-byte line with its sequence

/// One rank's mailbox: two slots, operation k in slot k % 2.
struct mailbox {
  struct alignas(64) slot {
    std::atomic<unsigned long> seq{0};
    float values[max_values];
  } slots[2];
};

/// Runs `iterations` all-reduces of `count` floats as rank `rank`; returns
/// the mean time per operation in microseconds, and the last result's first
/// element through `first`.
double run_rank(mailbox* boxes, int rank, int ranks, int count, long iterations, bool crowded, unsigned long& seq,
                float& first) {
  std::vector<float> in(static_cast<std::size_t>(count), 1.0f + static_cast<float>(rank)), out(in.size());
  const auto begin = std::chrono::steady_clock::now();
  for (long i = 0; i < iterations; ++i) {
    const unsigned long s = ++seq;
    auto& mine = boxes[rank].slots[s & 1];
    std::copy(in.begin(), in.end(), mine.values);
    mine.seq.store(s, std::memory_order_release);
    std::fill(out.begin(), out.end(), 0.0f);
    for (int q = 0; q < ranks; ++q) {
      const auto& theirs = boxes[q].slots[s & 1];
      for (unsigned spins = 1; theirs.seq.load(std::memory_order_acquire) < s; ++spins) {
        if (crowded)
          sched_yield();  // more ranks than CPUs: the peer may be waiting for this CPU
        else
          pdcoll::detail::cpu_relax();
        if (spins % 65536 == 0 && std::chrono::steady_clock::now() - begin > peer_deadline) {
          std::fprintf(stderr, "shm_latency_floor: rank %d waited %lld s for rank %d; giving up\n", rank,
                       static_cast<long long>(peer_deadline.count()), q);
          std::_Exit(1);
        }
      }
      for (int e = 0; e < count; ++e) out[static_cast<std::size_t>(e)] += theirs.values[e];
    }
  }
  const auto end = std::chrono::steady_clock::now();
  first = out[0];
  return std::chrono::duration<double, std::micro>(end - begin).count() / static_cast<double>(iterations);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The floor under a small shared-memory all-reduce: cache-line mailboxes, no library."};
  int ranks = 2, bytes = 8, rounds = 5;
  long iterations = 200000;
  std::string bind_to = "auto";
  app.add_option("--ranks", ranks, "processes (2)")->check(CLI::Range(2, 64));
  app.add_option("-b,--bytes", bytes, "bytes per rank, a multiple of 4 up to 48 (8)")
      ->check(CLI::Range(4, 4 * max_values));
  app.add_option("-n,--iters", iterations, "operations per round (200000)")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "rounds (5)")->check(CLI::Range(1, 1000));
  app.add_option("--bind-to", bind_to, "core, none, or auto: core when every rank gets a CPU (auto)")
      ->check(CLI::IsMember({"auto", "core", "none"}));
  CLI11_PARSE(app, argc, argv);
  if (bytes % 4 != 0) {
    std::fprintf(stderr, "shm_latency_floor: --bytes must be a multiple of 4\n");
    return 2;
  }
  const int count = bytes / 4;

  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 1;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  const bool bind = bind_to == "core" || (bind_to == "auto" && ranks <= static_cast<int>(cpus.size()));

  const std::size_t length = sizeof(mailbox) * static_cast<std::size_t>(ranks);
  void* memory = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    std::perror("shm_latency_floor: mmap");
    return 1;
  }
  auto* boxes = static_cast<mailbox*>(memory);
  for (int q = 0; q < ranks; ++q) new (&boxes[q]) mailbox{};

  int rank = 0;
  std::vector<pid_t> children;
  for (int q = 1; q < ranks; ++q) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("shm_latency_floor: fork");
      return 1;
    }
    if (pid == 0) {
      rank = q;
      break;
    }
    children.push_back(pid);
  }
  if (bind) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[static_cast<std::size_t>(rank) % cpus.size()], &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) std::perror("shm_latency_floor: sched_setaffinity");
  }

  unsigned long seq = 0;
  float first = 0.0f;
  std::vector<double> means;
  const bool crowded = ranks > static_cast<int>(cpus.size());
  run_rank(boxes, rank, ranks, count, iterations / 10 + 1, crowded, seq, first);  // warm-up
  for (int r = 0; r < rounds; ++r)
    means.push_back(run_rank(boxes, rank, ranks, count, iterations, crowded, seq, first));
  const float expected = static_cast<float>(ranks) * (static_cast<float>(ranks) + 1.0f) / 2.0f;
  if (first != expected) {
    std::fprintf(stderr, "shm_latency_floor: rank %d summed %g, expected %g\n", rank, first, expected);
    return 1;
  }
  if (rank != 0) return 0;

  int failed = 0;
  for (const pid_t pid : children) {
    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  std::printf("# shm_latency_floor: %d ranks (%s), %d bytes, %ld operations per round\n", ranks,
              bind ? "one CPU each" : "unbound", bytes, iterations);
  for (int r = 0; r < rounds; ++r) std::printf("round %d: %.3f us\n", r + 1, means[static_cast<std::size_t>(r)]);
  std::sort(means.begin(), means.end());
  std::printf("median: %.3f us\n", means[means.size() / 2]);
  return failed;
}
