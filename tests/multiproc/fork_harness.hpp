// File: tests/multiproc/fork_harness.hpp — runs N ranks as forked children of
// a doctest process, with an address exchange through files in a mkdtemp
// directory. Every wait has a deadline; children that outlive theirs are
// killed and reported, so a broken transport fails a test instead of hanging it.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "pdcoll/error.hpp"
#include "pdcoll/transport/endpoint.hpp"

namespace pdcoll::test {

/// All-gather through files: round k of rank r writes `<dir>/<k>.<r>`
/// (written to a temporary name, then renamed, so readers never see half a
/// file) and reads every rank's file of round k. Throws std::system_error
/// (errc::timeout) when a rank's file does not appear before the deadline.
class file_exchange {
 public:
  file_exchange(std::string dir, int rank, int world_size, std::chrono::milliseconds timeout)
      : dir_(std::move(dir)), rank_(rank), world_size_(world_size), timeout_(timeout) {}

  std::vector<std::string> operator()(std::string_view mine) {
    const int round = round_++;
    const std::string final_name = path(round, rank_);
    const std::string temp_name = final_name + ".tmp";
    {
      std::ofstream out(temp_name, std::ios::binary);
      out.write(mine.data(), static_cast<std::streamsize>(mine.size()));
    }
    if (std::rename(temp_name.c_str(), final_name.c_str()) != 0) {
      throw std::system_error(errno, std::generic_category(), "rename " + temp_name);
    }
    std::vector<std::string> all(static_cast<std::size_t>(world_size_));
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (int r = 0; r < world_size_; ++r) {
      for (;;) {
        std::ifstream in(path(round, r), std::ios::binary);
        if (in) {
          std::ostringstream text;
          text << in.rdbuf();
          all[static_cast<std::size_t>(r)] = text.str();
          break;
        }
        if (std::chrono::steady_clock::now() > deadline) {
          throw std::system_error(make_error_code(errc::timeout),
                                  "file exchange: rank " + std::to_string(r) + " never wrote round " +
                                      std::to_string(round));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    return all;
  }

 private:
  std::string path(int round, int rank) const {
    return dir_ + "/" + std::to_string(round) + "." + std::to_string(rank);
  }
  std::string dir_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  int round_ = 0;
};

/// What one child rank did: exited (code), was killed (signal), or overran
/// the deadline (timed_out; it was then killed).
struct rank_outcome {
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  bool ok() const { return exit_code == 0 && signal == 0 && !timed_out; }
};

/// A check inside a child: prints the failure with the rank and counts it.
struct rank_checks {
  int rank = 0;
  int failures = 0;
  bool operator()(bool condition, const std::string& what) {
    if (!condition) {
      ++failures;
      std::fprintf(stderr, "[rank %d] check failed: %s\n", rank, what.c_str());
      std::fflush(stderr);
    }
    return condition;
  }
};

/// The body of one rank: returns the child's exit status (0 = passed).
using rank_body = std::function<int(int rank, int world_size, const transport::address_exchange& exchange)>;

namespace detail {
inline void remove_tree(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") ::unlink((dir + "/" + name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}
}  // namespace detail

/// Forks `world_size` children running `body`, waits for all of them until
/// `timeout` (then SIGKILLs the rest) and returns each rank's outcome.
inline std::vector<rank_outcome> run_ranks(int world_size, const rank_body& body,
                                           std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  char pattern[] = "/tmp/pdcoll-fabric-XXXXXX";
  if (!::mkdtemp(pattern)) throw std::system_error(errno, std::generic_category(), "mkdtemp");
  const std::string dir = pattern;
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world_size; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
    if (pid == 0) {
      int status = 3;
      try {
        file_exchange exchange(dir, r, world_size, timeout);
        status = body(r, world_size, std::ref(exchange));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] exception: %s\n", r, e.what());
        status = 2;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      // An exit status keeps 8 bits: 256 failures must not read as 0.
      ::_exit(status < 0 || status > 125 ? 125 : status);  // skip the parent's atexit handlers (doctest's report)
    }
    pids.push_back(pid);
  }
  std::vector<rank_outcome> outcomes(static_cast<std::size_t>(world_size));
  std::vector<bool> done(static_cast<std::size_t>(world_size), false);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::size_t left = pids.size(); left > 0;) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        done[i] = true;
        --left;
        if (WIFEXITED(status)) outcomes[i].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) outcomes[i].signal = WTERMSIG(status);
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        ::kill(pids[i], SIGKILL);
        ::waitpid(pids[i], nullptr, 0);
        outcomes[i].timed_out = true;
        done[i] = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  detail::remove_tree(dir);
  return outcomes;
}

/// A completion_context that records its completions (count and the last).
struct recorded_op : transport::completion_context {
  int completions = 0;
  transport::completion result;
  recorded_op() {
    on_complete = [](transport::completion_context* self, const transport::completion& c) noexcept {
      auto* op = static_cast<recorded_op*>(self);
      ++op->completions;
      op->result = c;
    };
  }
  bool done() const { return completions > 0; }
};

/// Drives `ep` until `finished()` or `deadline`; returns finished().
template <class Finished>
bool drive_until(transport::endpoint& ep, Finished&& finished,
                 std::chrono::steady_clock::time_point deadline) {
  while (!finished()) {
    if (std::chrono::steady_clock::now() >= deadline) return finished();
    if (ep.progress() == 0 && !finished()) {
      ep.wait(std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(50)));
    }
  }
  return true;
}

}  // namespace pdcoll::test
