// File: bench/yield_handoff.cpp — what it costs to hand a CPU from one
// process to another: two processes pinned to the same CPU take turns
// through a counter in shared memory, each yielding (sched_yield) until it
// is its turn. The time per turn is the floor under any collective whose
// ranks outnumber the CPUs. With two ranks per CPU that floor is one handoff
// per CPU per collective, not two: a rank that finishes one collective and
// publishes its part of the next before yielding lets the rank it hands
// over to finish both (the small all-reduce's crowded wait,
// detail/collective_operation.hpp's spin_small, runs that way: perf stat
// counts 1.0 context switches per CPU per all-reduce). Prints the median of
// --rounds runs of --turns turns each.
//
//     build-bench/bench/yield_handoff              # CPU 0, 5 rounds of 200000 turns
//     build-bench/bench/yield_handoff --cpu 1 --rounds 9
//
// Measured on the 2-vCPU reference VM: 1.36-1.59 us per handoff, so 4
// ranks on 2 CPUs spend at least that on each all-reduce before any work;
// pdcoll's 8-byte all-reduce takes 2.5-2.9 us (mean) there, Open MPI's
// 5.5-6.3 in the same runs.
#include "bench_report.hpp"

#include <CLI/CLI.hpp>

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

/// One round: microseconds per handoff, or a negative value when the
/// processes could not be set up.
double one_round(int cpu, long turns) {
  void* shared = ::mmap(nullptr, sizeof(std::atomic<long>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return -1;
  auto* turn = new (shared) std::atomic<long>(0);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0) return -1;
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = ::fork();
  if (child < 0) return -1;
  const long me = child == 0 ? 1 : 0;
  for (long i = 0; i < turns; ++i) {
    while (turn->load(std::memory_order_acquire) % 2 != me) ::sched_yield();
    turn->fetch_add(1, std::memory_order_acq_rel);
  }
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  ::munmap(shared, sizeof(std::atomic<long>));
  return us / (2.0 * static_cast<double>(turns));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Cost of handing one CPU between two processes with sched_yield (see the file comment)."};
  int cpu = 0, rounds = 5;
  long turns = 200000;
  app.add_option("--cpu", cpu, "CPU both processes are pinned to")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--rounds", rounds, "rounds; the median is printed")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--turns", turns, "turns per process and round")->capture_default_str()->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  std::vector<double> per_round;
  for (int r = 0; r < rounds; ++r) {
    const double us = one_round(cpu, turns);
    if (us < 0) {
      std::perror("yield_handoff");
      return 1;
    }
    per_round.push_back(us);
  }
  const double median = pdcoll::bench::median(per_round);  // sorts per_round
  std::printf("yield handoff on CPU %d: median %.3f us (%.3f-%.3f over %d rounds of %ld turns)\n", cpu, median,
              per_round.front(), per_round.back(), rounds, turns);
  return 0;
}
