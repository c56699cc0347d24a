// File: bootstrap/launch_info.hpp — rank discovery: who am I, how many are we,
// where is the rendezvous root, read from whatever launched this process
// (pdcoll-run, torchrun, Open MPI's mpirun, a PMI launcher such as Hydra, or
// Slurm's srun).
//
// Precedence, first match wins: PDCOLL_* > torchrun > Open MPI > PMI > Slurm.
// The other launchers' variables are then cross-checked: one that reports
// the same world size but a different rank is an error ("RANK=1 but
// OMPI_COMM_WORLD_RANK=2"). Slurm alone may report a different world size
// without error, because srun is routinely the *outer* allocator of a job
// whose ranks are started by torchrun or pdcoll-run (one srun task per node).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "pdcoll/error.hpp"

extern char** environ;  // POSIX environ(7); declared by <unistd.h> only with _GNU_SOURCE

namespace pdcoll::bootstrap {

/// Default deadline of every rendezvous operation when PDCOLL_TIMEOUT_MS is unset.
inline constexpr std::chrono::milliseconds default_timeout{60'000};

/// What the launcher told this process about the job.
struct launch_info {
  int rank = 0;                ///< this process, in [0, world_size)
  int world_size = 1;          ///< number of ranks in the job
  std::string root_host;       ///< rendezvous root (rank 0's store server) host or address
  std::uint16_t root_port = 0; ///< its TCP port; 0 only for a one-rank job (ephemeral port)
  std::string token;           ///< shared secret every store client presents (PDCOLL_TOKEN); empty: none
  std::string launcher;        ///< "pdcoll", "torchrun", "openmpi", "pmi" or "slurm"
  int local_rank = -1;         ///< rank among the ranks on this host; -1 when the launcher does not say
  int local_size = -1;         ///< ranks on this host; -1 when the launcher does not say
  std::chrono::milliseconds timeout = default_timeout;  ///< PDCOLL_TIMEOUT_MS, or default_timeout
};

/// A snapshot of environment variables, name → value.
using environment_map = std::map<std::string, std::string, std::less<>>;

/// Copies the process environment (environ(7)) into a map. Cost: one string
/// pair per variable.
inline environment_map current_environment() {
  environment_map env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string_view item{*entry};
    auto eq = item.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
  }
  return env;
}

namespace detail {

/// The variables one launcher sets.
struct launcher_variables {
  std::string_view launcher;
  std::string_view rank;
  std::string_view size;
  std::string_view local_rank;
  std::string_view local_size;
};

inline constexpr launcher_variables launchers[] = {
    {"pdcoll", "PDCOLL_RANK", "PDCOLL_WORLD_SIZE", "PDCOLL_LOCAL_RANK", "PDCOLL_LOCAL_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    // Hydra (MPICH, Intel MPI) sets MPI_LOCALRANKID / MPI_LOCALNRANKS beside PMI_RANK / PMI_SIZE.
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    // SLURM_NTASKS_PER_NODE is only set when the user asked for it, and then
    // as a plain count; srun(1).
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

[[noreturn]] inline void fail(std::string message) {
  throw std::system_error(make_error_code(errc::bootstrap), message);
}

inline const std::string* lookup(const environment_map& env, std::string_view name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

/// Parses a decimal non-negative integer that fits `max`; the whole string must be digits.
inline std::optional<long long> parse_count(std::string_view text, long long max) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  long long value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  if (value > max) return std::nullopt;
  return value;
}

inline std::string show(std::string_view name, std::string_view value) {
  return std::string(name) + "=" + std::string(value);
}

/// Reads `name` as an int in [0, INT_MAX]; nullopt when unset; throws when malformed.
inline std::optional<int> read_int(const environment_map& env, std::string_view name) {
  const std::string* text = lookup(env, name);
  if (text == nullptr) return std::nullopt;
  auto value = parse_count(*text, 0x7fffffff);
  if (!value) fail(show(name, "'" + *text + "'") + " is not a non-negative integer");
  return static_cast<int>(*value);
}

/// Splits "host:port" or "[v6addr]:port"; throws naming `what` when malformed.
inline std::pair<std::string, std::uint16_t> split_host_port(std::string_view text, std::string_view what) {
  std::string_view host, port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      fail(std::string(what) + " is not [address]:port");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) fail(std::string(what) + " is not host:port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty()) fail(std::string(what) + " has an empty host");
  auto number = parse_count(port, 65535);
  if (!number) fail(std::string(what) + " has a port that is not a number in [0, 65535]");
  return {std::string(host), static_cast<std::uint16_t>(*number)};
}

/// One launcher's view of (rank, size, local rank, local size), or nullopt
/// when it set none of its rank/size variables.
struct launcher_view {
  const launcher_variables* vars;
  int rank;
  int size;
};

inline std::optional<launcher_view> read_launcher(const environment_map& env, const launcher_variables& vars) {
  auto rank = read_int(env, vars.rank);
  auto size = read_int(env, vars.size);
  if (!rank && !size) return std::nullopt;
  if (!size) fail(std::string(vars.rank) + " is set but " + std::string(vars.size) + " is not");
  if (!rank) fail(std::string(vars.size) + " is set but " + std::string(vars.rank) + " is not");
  if (*size < 1) fail(show(vars.size, std::to_string(*size)) + " must be at least 1");
  if (*rank >= *size)
    fail(show(vars.rank, std::to_string(*rank)) + " is not below " + show(vars.size, std::to_string(*size)));
  return launcher_view{&vars, *rank, *size};
}

}  // namespace detail

/// Reads the launch description from `env` (see the precedence rules at the
/// top of this file). Variables:
///  * rank / world size / local rank / local size from the first launcher present;
///  * rendezvous root from PDCOLL_ROOT=host:port (or [v6]:port), else
///    MASTER_ADDR + MASTER_PORT (torchrun's); a one-rank job without either
///    serves on 127.0.0.1 and an ephemeral port;
///  * PDCOLL_TOKEN (optional; without it the store admits any client that
///    knows the world size, so set it on shared networks);
///  * PDCOLL_TIMEOUT_MS (default 60000).
/// Cost: a few map look-ups.
/// Errors: throws std::system_error with errc::bootstrap whose what() names
/// the offending variable, e.g. "PDCOLL_RANK=5 is not below PDCOLL_WORLD_SIZE=4"
/// or "RANK=1 but OMPI_COMM_WORLD_RANK=2".
inline launch_info from_environment(const environment_map& env) {
  using namespace detail;
  std::optional<launcher_view> chosen;
  for (const auto& vars : launchers) {
    auto view = read_launcher(env, vars);
    if (!view) continue;
    if (!chosen) {
      chosen = view;
      continue;
    }
    const bool outer_allocator = vars.launcher == "slurm";
    if (view->size != chosen->size) {
      if (outer_allocator) continue;
      fail(show(chosen->vars->size, std::to_string(chosen->size)) + " but " +
           show(vars.size, std::to_string(view->size)));
    }
    if (view->rank != chosen->rank)
      fail(show(chosen->vars->rank, std::to_string(chosen->rank)) + " but " +
           show(vars.rank, std::to_string(view->rank)));
  }
  if (!chosen)
    fail("no launcher variables found: set PDCOLL_RANK and PDCOLL_WORLD_SIZE, or start the job with "
         "pdcoll-run, torchrun, mpirun or srun");

  launch_info info;
  info.rank = chosen->rank;
  info.world_size = chosen->size;
  info.launcher = std::string(chosen->vars->launcher);

  auto local_rank = read_int(env, chosen->vars->local_rank);
  auto local_size = read_int(env, chosen->vars->local_size);
  if (local_size && *local_size < 1)
    fail(show(chosen->vars->local_size, std::to_string(*local_size)) + " must be at least 1");
  if (local_rank && local_size && *local_rank >= *local_size)
    fail(show(chosen->vars->local_rank, std::to_string(*local_rank)) + " is not below " +
         show(chosen->vars->local_size, std::to_string(*local_size)));
  if (local_size && *local_size > info.world_size)
    fail(show(chosen->vars->local_size, std::to_string(*local_size)) + " exceeds " +
         show(chosen->vars->size, std::to_string(info.world_size)));
  info.local_rank = local_rank.value_or(-1);
  info.local_size = local_size.value_or(-1);

  const std::string* root = lookup(env, "PDCOLL_ROOT");
  const std::string* master_addr = lookup(env, "MASTER_ADDR");
  const std::string* master_port = lookup(env, "MASTER_PORT");
  if (root != nullptr) {
    auto [host, port] = split_host_port(*root, show("PDCOLL_ROOT", *root));
    info.root_host = std::move(host);
    info.root_port = port;
  } else if (master_addr != nullptr || master_port != nullptr) {
    if (master_addr == nullptr) fail("MASTER_PORT is set but MASTER_ADDR is not");
    if (master_port == nullptr) fail("MASTER_ADDR is set but MASTER_PORT is not");
    if (master_addr->empty()) fail("MASTER_ADDR is empty");
    auto port = parse_count(*master_port, 65535);
    if (!port) fail(show("MASTER_PORT", "'" + *master_port + "'") + " is not a port number");
    info.root_host = *master_addr;
    info.root_port = static_cast<std::uint16_t>(*port);
  } else if (info.world_size == 1) {
    info.root_host = "127.0.0.1";
    info.root_port = 0;
  } else {
    fail("no rendezvous root for " + std::to_string(info.world_size) +
         " ranks: set PDCOLL_ROOT=host:port (or MASTER_ADDR and MASTER_PORT)");
  }
  if (info.root_port == 0 && info.world_size > 1)
    fail("rendezvous root port 0 is only allowed for a one-rank job");

  if (const std::string* token = lookup(env, "PDCOLL_TOKEN")) info.token = *token;
  if (info.token.size() > 256) fail("PDCOLL_TOKEN is longer than 256 bytes");
  if (auto ms = read_int(env, "PDCOLL_TIMEOUT_MS")) {
    if (*ms == 0) fail("PDCOLL_TIMEOUT_MS=0 must be positive");
    info.timeout = std::chrono::milliseconds{*ms};
  }
  return info;
}

/// Reads the launch description from this process's environment; see the
/// overload taking an environment_map for the rules and errors.
inline launch_info from_environment() { return from_environment(current_environment()); }

}  // namespace pdcoll::bootstrap
