// File: bootstrap/pmix.hpp — the rendezvous root's address carried by the
// launcher's PMIx server, for launchers that export ranks but no address
// (Open MPI's mpirun).
//
// Rank 0 starts its store server on an ephemeral port, listening on every
// address, and puts "host:port" (its host name) under a key in the job's
// PMIx namespace; every rank then joins one PMIx fence that collects the
// data, bounded by the store's timeout, and the other ranks read the key
// back. Being handed the port, no rank guesses one, so two jobs on one node
// never collide. The keys carry a per-process generation ("pdcoll.root.0",
// "pdcoll.root.1", ...): a program that joins several jobs one after the
// other does so in the same order on every rank.
//
// Compiled in where PDCOLL_WITH_PMIX is defined: pdcoll's CMake package
// defines it and links libpmix when pkg-config finds `pmix` (Debian:
// libpmix-dev, which Open MPI's packages pull in). Without it,
// bootstrap::from_environment refuses such a job and asks for PDCOLL_ROOT.
//
// The PMIx client is initialised once per process, on first use (bounded by
// the store's deadline), and finalised at exit; PMIx counts
// initialisations, so an MPI library in the same process keeps its own,
// whether it starts before or after pdcoll.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "pdcoll/error.hpp"

#if defined(PDCOLL_WITH_PMIX)
#include <pmix.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#endif

namespace pdcoll::bootstrap {

/// Whether this build finds the rendezvous root through PMIx (see the file comment).
#if defined(PDCOLL_WITH_PMIX)
inline constexpr bool have_pmix = true;
#else
inline constexpr bool have_pmix = false;
#endif

#if defined(PDCOLL_WITH_PMIX)
namespace detail {

/// This process's PMIx client: initialised on first use, finalised at exit.
class pmix_client {
 public:
  using clock = std::chrono::steady_clock;

  /// This process as PMIx names it, initialising the client on the first
  /// call. PMIx_Init runs on a thread of its own and is waited for until
  /// `deadline` only: a PMIx server that accepts but never answers (a stale
  /// PMIX_SERVER_URI from an enclosing job) would otherwise hold the caller
  /// for ever. Throws errc::timeout then, errc::bootstrap when PMIx_Init
  /// fails (no PMIx server: not started by mpirun).
  static pmix_proc_t self(clock::time_point deadline) {
    auto& s = state();
    std::unique_lock lock(s.mutex);
    if (!s.started) {
      s.started = true;
      std::thread([&s] {
        pmix_proc_t me{};
        const pmix_status_t status = PMIx_Init(&me, nullptr, 0);
        std::lock_guard done(s.mutex);
        s.self = me;
        s.status = status;
        s.done = true;
        s.changed.notify_all();
      }).detach();
    }
    if (!s.changed.wait_until(lock, deadline, [&] { return s.done; }))
      throw std::system_error(make_error_code(errc::timeout),
                              "PMIx_Init did not return in time: is PMIX_SERVER_URI* left over from another job?");
    check(s.status, "PMIx_Init (is this process started by mpirun?)");
    static const finalizer at_exit;
    return s.self;
  }

  /// The next key generation of this process (0, 1, ...).
  static unsigned next_generation() {
    auto& s = state();
    std::lock_guard lock(s.mutex);
    return s.generation++;
  }

  /// Throws errc::bootstrap (errc::timeout for PMIx's timeout) naming `what`
  /// and PMIx's reason when `status` is not success.
  static void check(pmix_status_t status, const std::string& what) {
    if (status == PMIX_SUCCESS) return;
    throw std::system_error(make_error_code(status == PMIX_ERR_TIMEOUT ? errc::timeout : errc::bootstrap),
                            what + ": PMIx says " + PMIx_Error_string(status));
  }

 private:
  struct shared_state {
    std::mutex mutex;
    std::condition_variable changed;
    bool started = false;
    bool done = false;
    pmix_status_t status = PMIX_SUCCESS;
    pmix_proc_t self{};
    unsigned generation = 0;
  };
  /// Never destroyed: a PMIx_Init that never returns keeps using it after main.
  static shared_state& state() {
    static auto* s = new shared_state;
    return *s;
  }
  /// Finalises a client that initialised, at exit.
  struct finalizer {
    ~finalizer() { PMIx_Finalize(nullptr, 0); }
  };
};

/// A pmix_info_t directive with an int or bool value.
inline pmix_info_t pmix_directive(const char* key, int value, bool as_flag) {
  pmix_info_t info;
  std::memset(&info, 0, sizeof info);
  std::strncpy(info.key, key, PMIX_MAX_KEYLEN);
  if (as_flag) {
    info.value.type = PMIX_BOOL;
    info.value.data.flag = value != 0;
  } else {
    info.value.type = PMIX_INT;
    info.value.data.integer = value;
  }
  return info;
}

/// Whole seconds (at least 1) left until `deadline`, as PMIX_TIMEOUT counts.
inline int pmix_seconds_left(pmix_client::clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::seconds>(deadline - pmix_client::clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 1, 86'400));
}

/// Rank 0 (root_address non-empty) publishes its store's "host:port"; every
/// rank joins the fence; returns the address as rank 0 published it. Every
/// step ends by `deadline` (PMIx counts whole seconds: rounded up, at least 1).
/// Errors: errc::timeout when PMIx_Init hangs or some rank did not reach the
/// fence in time, errc::bootstrap when PMIx fails or PMIx's rank is not `rank`.
inline std::string share_root_through_pmix(int rank, std::string_view root_address,
                                           pmix_client::clock::time_point deadline) {
  const pmix_proc_t self = pmix_client::self(deadline);
  if (self.rank != static_cast<pmix_rank_t>(rank))
    throw std::system_error(make_error_code(errc::bootstrap),
                            "PMIx says this process is rank " + std::to_string(self.rank) +
                                " but the launcher's variables say " + std::to_string(rank));
  const std::string key = "pdcoll.root." + std::to_string(pmix_client::next_generation());
  if (rank == 0) {
    const std::string address{root_address};
    pmix_value_t value;
    std::memset(&value, 0, sizeof value);
    value.type = PMIX_STRING;
    value.data.string = const_cast<char*>(address.c_str());
    pmix_client::check(PMIx_Put(PMIX_GLOBAL, key.c_str(), &value), "PMIx_Put of " + key);
    pmix_client::check(PMIx_Commit(), "PMIx_Commit");
  }
  const int seconds = pmix_seconds_left(deadline);
  pmix_info_t fence[2] = {pmix_directive(PMIX_COLLECT_DATA, 1, true), pmix_directive(PMIX_TIMEOUT, seconds, false)};
  pmix_client::check(PMIx_Fence(nullptr, 0, fence, 2),
                     "PMIx fence of the " + key + " rendezvous (did every rank start within " +
                         std::to_string(seconds) + " s?)");
  if (rank == 0) return std::string{root_address};
  pmix_proc_t root = self;
  root.rank = 0;
  pmix_info_t patience = pmix_directive(PMIX_TIMEOUT, pmix_seconds_left(deadline), false);
  pmix_value_t* value = nullptr;
  pmix_client::check(PMIx_Get(&root, key.c_str(), &patience, 1, &value), "PMIx_Get of rank 0's " + key);
  std::string address;
  const bool text = value != nullptr && value->type == PMIX_STRING && value->data.string != nullptr;
  if (text) address = value->data.string;
  if (value != nullptr) PMIX_VALUE_RELEASE(value);
  if (!text) throw std::system_error(make_error_code(errc::bootstrap), "rank 0's " + key + " is not a string");
  return address;
}

}  // namespace detail
#endif

}  // namespace pdcoll::bootstrap
