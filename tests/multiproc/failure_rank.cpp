// File: tests/multiproc/failure_rank.cpp — one rank of the fault-injection
// runs (failure_kill.py, tests/netns/run.sh). Joins the job pdcoll-run (or the
// netns script) launched and runs a seeded loop of all-reduces of random sizes
// and algorithms, checking every result.
//
//     failure_rank kill <seed>   one rank (picked by the seed) raises SIGKILL on
//                                itself at a seeded moment: before posting an
//                                iteration, from a thread after a random delay
//                                (mid-transfer or mid-reduction), or after the
//                                loop completed
//     failure_rank run <iterations> [<seconds>]   no fault (the netns script cuts the link)
//     failure_rank soak <iterations>   random kinds, sizes, algorithms and ops; RSS and cache checks
//
// Every survivor prints one line "RESULT ok=<0|1> status=<ok|error> ..." and
// exits 0 when its checks held: an operation that fails must fail within its
// deadline (PDCOLL_TEST_OP_TIMEOUT_MS, default 2000) plus one second, and every
// operation after it must fail at once (< 200 ms) with errc::aborted.
#include <pdcoll/pdcoll.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
// A small quarantine keeps ASan's own retention from looking like growth in the soak's RSS check.
extern "C" const char* __asan_default_options() { return "quarantine_size_mb=16"; }
#endif

namespace {

using clock_type = std::chrono::steady_clock;

double ms_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::chrono::milliseconds op_timeout() {
  const char* v = std::getenv("PDCOLL_TEST_OP_TIMEOUT_MS");
  return std::chrono::milliseconds(v && *v ? std::atol(v) : 2000);
}

template <class S>
std::error_code outcome(S&& sender) {
  try {
    pdcoll::exec::sync_wait(std::forward<S>(sender));
  } catch (const std::system_error& e) {
    return e.code();
  }
  return {};
}

// The all-reduce of iteration `it`, with an algorithm picked by `algo`.
std::error_code all_reduce_with(pdcoll::communicator& comm, std::vector<float>& data, unsigned algo) {
  namespace algo_ns = pdcoll::algo;
  switch (algo % 7) {
    case 0: return outcome(pdcoll::all_reduce<algo_ns::ring>(comm, data));
    case 1: return outcome(pdcoll::all_reduce<algo_ns::recursive_doubling>(comm, data));
    case 2: return outcome(pdcoll::all_reduce<algo_ns::rabenseifner>(comm, data));
    case 3: return outcome(pdcoll::all_reduce<algo_ns::tree>(comm, data));
    case 4: return outcome(pdcoll::all_reduce<algo_ns::shared_memory>(comm, data));
    case 5: return outcome(pdcoll::all_reduce<algo_ns::two_shot_chunked<4096, 2>>(comm, data));
    default: return outcome(pdcoll::all_reduce(comm, data));
  }
}

struct survivor_report {
  bool ok = true;
  bool failed = false;
  std::string code = "none";
  int failed_iteration = -1;
  double failed_after_ms = 0;   // from the failing operation's start
  double late_ms = -1e9;        // completion time minus its deadline
  double after_abort_ms = 0;    // slowest later operation
  std::string problem;

  void fail(const std::string& why) {
    if (ok) problem = why;
    ok = false;
  }
};

// Runs the failing operation's epilogue: records it and checks that later
// operations fail at once with aborted.
void on_failure(pdcoll::communicator& comm, survivor_report& r, int it, std::error_code ec,
                clock_type::time_point start, clock_type::time_point end) {
  r.failed = true;
  r.code = ec.message();
  r.failed_iteration = it;
  r.failed_after_ms = ms_between(start, end);
  r.late_ms = r.failed_after_ms - static_cast<double>(op_timeout().count());
  if (r.late_ms > 1000) r.fail("completed " + std::to_string(r.late_ms) + " ms after its deadline");
  if (!comm.aborted()) r.fail("communicator not aborted after a failed operation");
  std::vector<float> data(1000, 1.0f);
  for (int i = 0; i < 3; ++i) {
    const auto t = clock_type::now();
    auto later = i == 1 ? outcome(pdcoll::barrier(comm)) : all_reduce_with(comm, data, static_cast<unsigned>(i));
    const double took = ms_between(t, clock_type::now());
    r.after_abort_ms = std::max(r.after_abort_ms, took);
    if (later != pdcoll::errc::aborted) r.fail("operation after the abort gave '" + later.message() + "'");
    if (took > 200) r.fail("operation after the abort took " + std::to_string(took) + " ms");
  }
}

void print(int rank, const survivor_report& r, const char* extra = "") {
  std::printf("RESULT ok=%d status=%s rank=%d iteration=%d code='%s' failed_after_ms=%.1f late_ms=%.1f "
              "after_abort_ms=%.1f%s%s%s\n",
              r.ok ? 1 : 0, r.failed ? "error" : "ok", rank, r.failed_iteration, r.code.c_str(), r.failed_after_ms,
              r.failed ? r.late_ms : 0.0, r.after_abort_ms, extra, r.problem.empty() ? "" : " problem=",
              r.problem.c_str());
  std::fflush(stdout);
}

// Fills `data` for iteration `it` on `rank`; expected() is the sum over ranks.
void fill(std::vector<float>& data, int rank, int it) {
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(rank + 1 + static_cast<int>((i + it) % 5));
}
bool check_sum(const std::vector<float>& data, int world, int it) {
  for (std::size_t i = 0; i < data.size(); ++i) {
    const int k = static_cast<int>((i + it) % 5);
    const float want = static_cast<float>(world * (world + 1) / 2 + world * k);
    if (data[i] != want) return false;
  }
  return true;
}

pdcoll::job join() {
  pdcoll::job_options options;
  options.communicator.timeout = op_timeout();
  return pdcoll::job::from_environment(options);
}

int run_kill(unsigned seed) {
  auto job = join();
  auto& comm = job.comm();
  const int rank = comm.rank(), world = comm.world_size();
  std::mt19937 rng(seed);  // the same stream on every rank
  const int iterations = 12;
  const int victim = static_cast<int>(rng() % static_cast<unsigned>(world));
  const unsigned mode = rng() % 4;  // 0 before posting, 1/2 from a thread after a delay, 3 after the loop
  const int kill_at = static_cast<int>(rng() % iterations);
  const auto delay = std::chrono::microseconds(rng() % (mode == 1 ? 300 : 20000));
  static const char* mode_names[] = {"before-post", "mid-transfer", "mid-loop-delay", "after-completion"};
  if (rank == victim) {
    std::printf("VICTIM rank=%d mode=%s iteration=%d delay_us=%lld\n", rank, mode_names[mode], kill_at,
                static_cast<long long>(delay.count()));
    std::fflush(stdout);
  }
  static const std::size_t sizes[] = {1, 3, 1000, 4096, 65536, 262144};
  survivor_report report;
  std::thread killer;
  for (int it = 0; it < iterations; ++it) {
    std::vector<float> data(sizes[rng() % 6]);
    const unsigned algo = rng();
    if (rank == victim && it == kill_at) {
      if (mode == 0) ::raise(SIGKILL);
      if (mode == 1 || mode == 2) {
        killer = std::thread([delay] {
          std::this_thread::sleep_for(delay);
          ::raise(SIGKILL);
        });
      }
    }
    fill(data, rank, it);
    const auto start = clock_type::now();
    auto ec = all_reduce_with(comm, data, algo);
    const auto end = clock_type::now();
    if (ec) {
      on_failure(comm, report, it, ec, start, end);
      break;
    }
    if (!check_sum(data, world, it)) {
      report.fail("wrong result in iteration " + std::to_string(it));
      break;
    }
  }
  if (rank == victim) {
    ::raise(SIGKILL);  // after completion (or the thread did not fire yet)
  }
  if (!report.failed && report.ok) {
    // The victim died after the loop: the closing barrier cannot complete.
    const auto start = clock_type::now();
    auto ec = outcome(pdcoll::barrier(comm));
    if (!ec) report.fail("closing barrier succeeded without the victim");
    else on_failure(comm, report, iterations, ec, start, clock_type::now());
  }
  print(rank, report);
  if (killer.joinable()) killer.join();
  return report.ok ? 0 : 1;
}

// No fault of its own: used by the netns script, which cuts the link under it
// (errors are expected then) or just runs it (no error is expected).
int run_plain(int iterations, double seconds) {
  auto job = join();
  auto& comm = job.comm();
  const int rank = comm.rank(), world = comm.world_size();
  std::mt19937 rng(1234);
  static const std::size_t sizes[] = {1, 3, 1000, 4096, 65536, 262144};
  survivor_report report;
  const auto stop = clock_type::now() + std::chrono::duration<double>(seconds);
  int done = 0;
  for (int it = 0; it < iterations || (seconds > 0 && clock_type::now() < stop); ++it) {
    std::vector<float> data(sizes[rng() % 6]);
    const unsigned algo = rng();
    fill(data, rank, it);
    const auto start = clock_type::now();
    auto ec = all_reduce_with(comm, data, algo);
    if (ec) {
      on_failure(comm, report, it, ec, start, clock_type::now());
      break;
    }
    if (!check_sum(data, world, it)) {
      report.fail("wrong result in iteration " + std::to_string(it));
      break;
    }
    ++done;
  }
  const std::string extra = " completed=" + std::to_string(done);
  print(rank, report, extra.c_str());
  return report.ok ? 0 : 1;
}

// Rank 0 aborts with nothing in flight and then leaves the communicator
// alone (no operation, no progress) for `idle_s` seconds; every other rank's
// all-reduce must end with aborted well before its deadline: the notices
// must leave inside abort(), not whenever rank 0 next drives progress.
int run_abort_idle(double idle_s) {
  auto job = join();
  auto& comm = job.comm();
  const int rank = comm.rank();
  survivor_report report;
  // One collective first, so that the abort meets a job in full swing (with
  // libfabric tcp's connections up) rather than one still connecting.
  std::vector<float> warm(1000, 1.0f);
  if (auto ec = all_reduce_with(comm, warm, 0)) report.fail("the first all_reduce failed: " + ec.message());
  job.store().barrier();  // every rank has finished it before rank 0 aborts
  if (rank == 0) {
    comm.abort();
    std::this_thread::sleep_for(std::chrono::duration<double>(idle_s));
    report.failed = true;
    report.code = "aborted here";
  } else {
    std::vector<float> data(1000, 1.0f);
    const auto start = clock_type::now();
    const auto ec = all_reduce_with(comm, data, 0);
    const double took = ms_between(start, clock_type::now());
    report.failed = true;
    report.code = ec.message();
    report.failed_after_ms = took;
    if (ec != pdcoll::errc::aborted) report.fail("all_reduce ended with '" + ec.message() + "', not aborted");
    if (took > 1500) report.fail("the abort notice took " + std::to_string(took) + " ms");
  }
  print(rank, report);
  return report.ok ? 0 : 1;
}

long resident_pages() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return resident;
}

// Random kinds, sizes, algorithms and ops; zero wrong results; RSS flat after warm-up.
int run_soak(int iterations) {
  auto job = join();
  auto& comm = job.comm();
  const int rank = comm.rank(), P = comm.world_size();
  std::mt19937 rng(77);
  survivor_report report;
  long warm = 0, peak_after = 0;
  for (int it = 0; it < iterations && report.ok; ++it) {
    if (it == iterations / 4) warm = resident_pages();
    const std::size_t n = std::size_t{1} << (rng() % 15);
    const unsigned kind = rng() % 4, algo = rng();
    std::error_code ec;
    bool right = true;
    if (kind == 0) {
      std::vector<float> d(n);
      fill(d, rank, it);
      ec = all_reduce_with(comm, d, algo);
      right = check_sum(d, P, it);
    } else if (kind == 1) {
      std::vector<std::int32_t> d(n, rank + 1);
      ec = outcome(pdcoll::all_reduce(comm, d, pdcoll::op::max));
      for (auto v : d) right = right && v == P;
    } else if (kind == 2) {
      std::vector<std::int32_t> d(n, rank == it % P ? it : -1);
      ec = outcome(pdcoll::broadcast(comm, d, it % P));
      for (auto v : d) right = right && v == it;
    } else {
      std::vector<std::int32_t> in(n, rank), out(n * static_cast<std::size_t>(P), -1);
      ec = outcome(pdcoll::all_gather(comm, in, out));
      for (std::size_t i = 0; i < out.size(); ++i) right = right && out[i] == static_cast<int>(i / n);
    }
    if (ec) report.fail("iteration " + std::to_string(it) + ": " + ec.message());
    else if (!right) report.fail("wrong result in iteration " + std::to_string(it));
    if (it > iterations / 4) peak_after = std::max(peak_after, resident_pages());
  }
  const long page_kib = ::sysconf(_SC_PAGESIZE) / 1024;
  const long growth_kib = (peak_after - warm) * page_kib;
  const auto stats = comm.registration_statistics();
  if (stats.live_entries > 1024) report.fail("registration cache holds " + std::to_string(stats.live_entries) + " entries, over its capacity of 1024");
  if (growth_kib > 16 * 1024) report.fail("resident memory grew by " + std::to_string(growth_kib) + " KiB after warm-up");
  const std::string extra = " iterations=" + std::to_string(iterations) + " rss_growth_kib=" + std::to_string(growth_kib) +
                            " cache_entries=" + std::to_string(stats.live_entries) +
                            " cache_misses=" + std::to_string(stats.misses);
  print(rank, report, extra.c_str());
  return report.ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: failure_rank kill <seed> | run <iterations> [<seconds>] | soak <iterations> | abort-idle <seconds>\n");
    return 2;
  }
  const std::string what = argv[1];
  try {
    if (what == "kill") return run_kill(static_cast<unsigned>(std::strtoul(argv[2], nullptr, 10)));
    if (what == "run") return run_plain(std::atoi(argv[2]), argc > 3 ? std::atof(argv[3]) : 0.0);
    if (what == "soak") return run_soak(std::atoi(argv[2]));
    if (what == "abort-idle") return run_abort_idle(std::atof(argv[2]));
  } catch (const std::system_error& e) {
    std::printf("RESULT ok=0 status=setup-error code='%s'\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", what.c_str());
  return 2;
}
