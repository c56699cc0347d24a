// File: bootstrap/launch_info.hpp — rank discovery: who am I, how many are we,
// where is the rendezvous root, read from whatever launched this process
// (pdcoll-run, torchrun, Open MPI's mpirun, a PMI launcher such as Hydra, or
// Slurm's srun).
//
// Precedence, first match wins: PDCOLL_* > torchrun > Open MPI > PMI > Slurm.
// The other launchers' variables are then cross-checked: one that reports
// the same world size but a different rank is an error ("RANK=1 but
// OMPI_COMM_WORLD_RANK=2", a stale RANK left in the shell), except beside
// a torchrun worker (TORCHELASTIC_RUN_ID set), whose outer launcher
// started one agent per node and numbers the nodes its own way. One that reports a smaller world is an outer
// launcher of this job (`mpirun -np 2 torchrun --nproc-per-node 4`: each of
// mpirun's 2 processes is a torchrun agent whose 4 workers inherit its
// OMPI_* variables) and is ignored; one that reports a larger world than
// the launcher chosen is an error, since an inner world is never smaller
// (`pdcoll-run -n 2 torchrun …`, or a stale PDCOLL_WORLD_SIZE left in the
// shell, would have several processes claim each rank). Slurm's are read only when no other launcher set
// any, and never cross-checked: where another launcher did, Slurm is the
// *outer* allocator of a job whose ranks torchrun, pdcoll-run or mpirun
// started (one srun task per node, or a batch script), and its numbering
// need not match theirs.
//
// A process is an srun task when SLURM_STEP_ID is set: its rank is
// SLURM_PROCID among SLURM_STEP_NUM_TASKS (SLURM_NTASKS may be the job's,
// kept by `srun --export`/`-E`). A batch script's or an salloc shell's own
// process has no step: it sees SLURM_PROCID=0 and the job's SLURM_NTASKS,
// and taken for rank 0 of N it would wait for ranks that never start, so
// with N > 1 that is an error, and otherwise a one-rank job.
//
// Under srun no variable names the rendezvous root, so pdcoll derives it the
// way torch-on-Slurm recipes set MASTER_ADDR and MASTER_PORT: the first node
// of the step (SLURM_STEP_NODELIST), where srun places task 0 under every
// distribution but `arbitrary` and in every job but a heterogeneous one
// (both refused), and the step's reserved port (SLURM_STEP_RESV_PORTS, where
// the cluster reserves ports) or one computed from the job and step IDs
// (slurm_rendezvous_port). The same holds when the task's launcher variables
// are PMI's, as `srun --mpi=pmi2` sets them with the same numbering. Rank 0
// then listens on every address (the node's name may resolve to a loopback
// address on the node itself, as Debian's /etc/hosts has it), and without
// PDCOLL_TOKEN the token is "slurm:<job>.<step>", so a step that lands on
// another step's port is refused rather than joined.
//
// Open MPI's mpirun exports no address either, but it starts every rank
// with a PMIx server (PMIX_NAMESPACE, PMIX_RANK): rank 0 then serves on an
// ephemeral port, listening on every address, and hands "host:port" to the
// others through PMIx (bootstrap/pmix.hpp; needs a build with
// PDCOLL_WITH_PMIX). Without PDCOLL_TOKEN the token is "pmix:<namespace>".
// This comes before the srun derivation: inside a Slurm allocation mpirun
// starts its daemons with srun, and the ranks inherit the daemons' step.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "pdcoll/bootstrap/pmix.hpp"
#include "pdcoll/bootstrap/wire.hpp"
#include "pdcoll/error.hpp"

extern "C" char** environ;  // POSIX environ(7); <unistd.h> declares it (C linkage) only with _GNU_SOURCE

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
  bool root_listens_everywhere = false;  ///< rank 0's store listens on every address, not only root_host's
  /// The root's address comes from rank 0 through the launcher's PMIx server
  /// when the ranks join (bootstrap/pmix.hpp): root_host is then empty and
  /// root_port 0 until store::connect fills them in.
  bool root_through_pmix = false;
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

/// The first host of a Slurm node list as srun exports it in
/// SLURM_STEP_NODELIST: "gpu[07-10,12],cpu3" → "gpu07", "rack[1-2]-n[01-08]"
/// → "rack1-n01", "vm" → "vm". Empty when the list is empty or a bracket is
/// not closed.
inline std::string first_slurm_host(std::string_view list) {
  std::string host;
  for (std::size_t i = 0; i < list.size() && list[i] != ',';) {
    if (list[i] != '[') {
      host += list[i++];
      continue;
    }
    const auto close = list.find(']', i);
    if (close == std::string_view::npos) return {};
    // A range set "07-10,12": its first number, zero padding kept.
    const auto range = list.substr(i + 1, close - i - 1);
    host += range.substr(0, range.find_first_of(",-"));
    i = close + 1;
  }
  return host;
}

/// Lowest port slurm_rendezvous_port() returns.
inline constexpr std::uint16_t slurm_port_base = 20000;
/// How many ports slurm_rendezvous_port() spreads steps over: up to 32767,
/// below Linux's default ephemeral range (32768–60999), so no outgoing
/// connection on the node holds the port.
inline constexpr std::uint16_t slurm_port_span = 12768;
/// The distance between the ports of two consecutive jobs' same step: a
/// prime that does not divide slurm_port_span.
inline constexpr std::uint64_t slurm_port_job_stride = 797;

/// The rendezvous port of Slurm job `job`, step `step` when neither
/// PDCOLL_ROOT, MASTER_PORT nor SLURM_STEP_RESV_PORTS says one:
/// slurm_port_base + (797·job + step) mod slurm_port_span. The steps of one
/// job get different ports (up to 12768 of them), as do the same step of any
/// two jobs fewer than 12768 IDs apart; two jobs whose rank 0 share a node
/// collide only when their steps differ by a multiple of 797 as well. A
/// collision makes the later root fail to listen ("Address already in use")
/// until PDCOLL_ROOT names another port.
inline std::uint16_t slurm_rendezvous_port(std::uint64_t job, std::uint64_t step) noexcept {
  return static_cast<std::uint16_t>(slurm_port_base +
                                    ((job % slurm_port_span) * slurm_port_job_stride + step) % slurm_port_span);
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
};

/// An srun task's variables (read apart from the others: see the file
/// comment). Its local size is not one variable: step_tasks_on_this_node
/// reads it from SLURM_STEP_TASKS_PER_NODE. (SLURM_NTASKS_PER_NODE is the
/// allocation's request, inherited by every step, not what a step runs.)
inline constexpr launcher_variables slurm_step{"slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
                                               "SLURM_STEP_TASKS_PER_NODE"};

[[noreturn]] inline void fail(std::string message) {
  throw std::system_error(make_error_code(errc::bootstrap), message);
}

inline const std::string* lookup(const environment_map& env, std::string_view name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

/// True when `text` is one or more decimal digits and nothing else.
inline bool all_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// Parses a decimal non-negative integer that fits `max` (at most
/// LLONG_MAX); the whole string must be digits.
inline std::optional<long long> parse_count(std::string_view text, long long max) {
  if (!all_digits(text)) return std::nullopt;
  long long value = 0;
  for (char c : text) {
    const int digit = c - '0';
    if (value > (max - digit) / 10) return std::nullopt;  // value * 10 + digit > max, without overflow
    value = value * 10 + digit;
  }
  return value;
}

inline std::string show(std::string_view name, std::string_view value) {
  return std::string(name) + "=" + std::string(value);
}

/// Reads `name` as an integer in [0, max]; nullopt when unset; throws,
/// saying which, when it is not a number or one above `max`.
inline std::optional<long long> read_count(const environment_map& env, std::string_view name, long long max) {
  const std::string* text = lookup(env, name);
  if (text == nullptr) return std::nullopt;
  auto value = parse_count(*text, max);
  if (!value && all_digits(*text)) fail(show(name, *text) + " is above " + std::to_string(max));
  if (!value) fail(show(name, "'" + *text + "'") + " is not a non-negative integer");
  return value;
}

/// Reads `name` as an int in [0, INT_MAX]; nullopt when unset; throws when malformed.
inline std::optional<int> read_int(const environment_map& env, std::string_view name) {
  const auto value = read_count(env, name, 0x7fffffff);
  if (!value) return std::nullopt;
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
    if (host.find(':') != std::string_view::npos)
      fail(std::string(what) + " looks like an IPv6 address without brackets: write [address]:port");
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
  if (static_cast<std::size_t>(*size) > limits{}.max_world_size)
    fail(show(vars.size, std::to_string(*size)) + " is above the " + std::to_string(limits{}.max_world_size) +
         " ranks a rendezvous store serves");
  if (*rank >= *size)
    fail(show(vars.rank, std::to_string(*rank)) + " is not below " + show(vars.size, std::to_string(*size)));
  return launcher_view{&vars, *rank, *size};
}

/// The number of the step's tasks on this node, from
/// SLURM_STEP_TASKS_PER_NODE ("4", "2(x3),1": counts per node in the step's
/// node order, "(xM)" repeating one M times) and, where nodes differ,
/// SLURM_NODEID (this node's index in the step); nullopt when either is
/// missing or malformed (the local size is then unknown, not an error).
inline std::optional<int> step_tasks_on_this_node(const environment_map& env) {
  const std::string* text = lookup(env, "SLURM_STEP_TASKS_PER_NODE");
  if (text == nullptr) return std::nullopt;
  struct run {
    long long count, nodes;
  };
  std::vector<run> runs;
  std::string_view rest{*text};
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    std::string_view entry = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    long long nodes = 1;
    if (const std::size_t open = entry.find("(x"); open != std::string_view::npos) {
      if (entry.back() != ')') return std::nullopt;
      auto repeat = parse_count(entry.substr(open + 2, entry.size() - open - 3), 0x7fffffff);
      if (!repeat || *repeat == 0) return std::nullopt;
      nodes = *repeat;
      entry = entry.substr(0, open);
    }
    auto count = parse_count(entry, 0x7fffffff);
    if (!count || *count == 0) return std::nullopt;
    runs.push_back({*count, nodes});
  }
  if (runs.empty()) return std::nullopt;
  if (std::all_of(runs.begin(), runs.end(), [&](const run& r) { return r.count == runs.front().count; }))
    return static_cast<int>(runs.front().count);
  const std::string* node_text = lookup(env, "SLURM_NODEID");
  auto node = node_text ? parse_count(*node_text, 0x7fffffff) : std::nullopt;
  if (!node) return std::nullopt;
  for (const run& r : runs) {
    if (*node < r.nodes) return static_cast<int>(r.count);
    *node -= r.nodes;
  }
  return std::nullopt;
}

/// The first port of SLURM_STEP_RESV_PORTS ("12000-12003", "12000"), or
/// nullopt when it is unset or names none.
inline std::optional<std::uint16_t> reserved_slurm_port(const environment_map& env) {
  const std::string* ports = lookup(env, "SLURM_STEP_RESV_PORTS");
  if (ports == nullptr) return std::nullopt;
  const std::string_view text{*ports};
  auto first = parse_count(text.substr(0, text.find_first_of(",-")), 65535);
  if (!first || *first == 0) return std::nullopt;
  return static_cast<std::uint16_t>(*first);
}

[[noreturn]] inline void need_root(const std::string& why) { fail(why + ": set PDCOLL_ROOT=host:port"); }

/// Fills info's root from an srun task's environment (file comment).
inline void derive_slurm_root(const environment_map& env, launch_info& info) {
  if (lookup(env, "SLURM_HET_SIZE") != nullptr || lookup(env, "SLURM_PACK_SIZE") != nullptr)
    need_root("a heterogeneous job's step lists its nodes sorted, not task 0's first");
  if (const std::string* how = lookup(env, "SLURM_DISTRIBUTION"); how && how->starts_with("arbitrary"))
    need_root("SLURM_DISTRIBUTION=" + *how + " may place task 0 off the step's first node");
  const std::string* nodes = lookup(env, "SLURM_STEP_NODELIST");
  if (nodes == nullptr) need_root("SLURM_STEP_NODELIST is unset");
  info.root_host = first_slurm_host(*nodes);
  if (info.root_host.empty()) need_root(show("SLURM_STEP_NODELIST", "'" + *nodes + "'") + " names no host");
  const auto id = [&](std::string_view name) {
    const std::string* text = lookup(env, name);
    auto value = text ? parse_count(*text, 0xffffffffLL) : std::nullopt;
    if (!value) need_root(show(name, text ? "'" + *text + "'" : "(unset)") + " is not an ID");
    return static_cast<std::uint64_t>(*value);
  };
  const auto job = id("SLURM_JOB_ID"), step = id("SLURM_STEP_ID");
  info.root_port = reserved_slurm_port(env).value_or(slurm_rendezvous_port(job, step));
  info.root_listens_everywhere = true;
  if (lookup(env, "PDCOLL_TOKEN") == nullptr) info.token = "slurm:" + std::to_string(job) + "." + std::to_string(step);
}

/// Marks info's root as handed over through PMIx when the launcher started
/// this process with a PMIx server that numbers it as info.rank (file
/// comment); returns false when there is no PMIx server to ask.
inline bool use_pmix_root(const environment_map& env, launch_info& info) {
  const std::string* space = lookup(env, "PMIX_NAMESPACE");
  const auto rank = read_int(env, "PMIX_RANK");
  if (space == nullptr || space->empty() || !rank) return false;
  if (*rank != info.rank) fail(show("PMIX_RANK", std::to_string(*rank)) + " but this is rank " + std::to_string(info.rank));
  if (!have_pmix)
    need_root("the launcher offers PMIx, but this build of pdcoll has none (pdcoll's CMake package defines "
              "PDCOLL_WITH_PMIX where pkg-config finds pmix)");
  info.root_through_pmix = true;
  info.root_listens_everywhere = true;
  if (lookup(env, "PDCOLL_TOKEN") == nullptr) info.token = "pmix:" + *space;
  return true;
}

}  // namespace detail

/// Reads the launch description from `env` (see the precedence rules at the
/// top of this file). Variables:
///  * rank / world size / local rank / local size from the first launcher present;
///  * rendezvous root from PDCOLL_ROOT=host:port (or [v6]:port), else
///    MASTER_ADDR + MASTER_PORT (torchrun's); a one-rank job without either
///    serves on 127.0.0.1 and an ephemeral port; srun tasks without either
///    use the step's first node and reserved or computed port; ranks a PMIx
///    launcher started (mpirun) get rank 0's address through PMIx (file comment);
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
    if (view->size < chosen->size) continue;  // an outer launcher (file comment)
    if (view->size > chosen->size)
      fail(show(chosen->vars->size, std::to_string(chosen->size)) + " but " +
           show(vars.size, std::to_string(view->size)) + ": the launcher read first reports the smaller world");
    // A torchrun worker (its agent sets TORCHELASTIC_RUN_ID) under an
    // outer launcher with one agent per node sees the same world size in
    // both, numbered its own way (c10d orders the nodes by name, not by
    // the outer launcher's order): not a conflict.
    const bool torchrun_worker = chosen->vars == &launchers[1] && lookup(env, "TORCHELASTIC_RUN_ID") != nullptr;
    if (view->rank != chosen->rank && !torchrun_worker)
      fail(show(chosen->vars->rank, std::to_string(chosen->rank)) + " but " +
           show(vars.rank, std::to_string(view->rank)));
  }
  const bool srun_task = lookup(env, "SLURM_STEP_ID") != nullptr;
  if (!chosen && srun_task) chosen = read_launcher(env, slurm_step);
  if (!chosen && !srun_task && lookup(env, "SLURM_PROCID") != nullptr) {
    // A batch script's or an salloc shell's own process (file comment).
    if (auto tasks = read_int(env, "SLURM_NTASKS"); tasks && *tasks > 1)
      fail(show("SLURM_NTASKS", std::to_string(*tasks)) +
           " but this process is no srun task (SLURM_STEP_ID is unset: a batch script or an salloc shell): "
           "start the ranks with srun");
    chosen = launcher_view{&slurm_step, 0, 1};
  }
  if (!chosen)
    fail("no launcher variables found: set PDCOLL_RANK and PDCOLL_WORLD_SIZE, or start the job with "
         "pdcoll-run, torchrun, mpirun or srun");

  launch_info info;
  info.rank = chosen->rank;
  info.world_size = chosen->size;
  info.launcher = std::string(chosen->vars->launcher);

  auto local_rank = read_int(env, chosen->vars->local_rank);
  auto local_size =
      chosen->vars == &slurm_step ? step_tasks_on_this_node(env) : read_int(env, chosen->vars->local_size);
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
  } else if (info.launcher == "openmpi" && use_pmix_root(env, info)) {
    // mpirun (file comment). Tried before the srun derivation: inside an
    // allocation mpirun starts its daemons with srun, whose step variables
    // its ranks inherit and may, by chance, match on some ranks only.
  } else if (auto step = srun_task ? read_launcher(env, slurm_step) : std::nullopt;
             step && step->rank == info.rank && step->size == info.world_size) {
    // srun alone, or srun --mpi=pmi2 (file comment).
    derive_slurm_root(env, info);
  } else if (!use_pmix_root(env, info)) {
    fail("no rendezvous root for " + std::to_string(info.world_size) +
         " ranks: set PDCOLL_ROOT=host:port (or MASTER_ADDR and MASTER_PORT)");
  }
  if (info.root_port == 0 && info.world_size > 1 && !info.root_through_pmix)
    fail("rendezvous root port 0 is only allowed for a one-rank job");

  if (const std::string* token = lookup(env, "PDCOLL_TOKEN")) info.token = *token;
  if (info.token.size() > 256) fail("PDCOLL_TOKEN is longer than 256 bytes");
  // Up to milliseconds::max(), which means no deadline (as for the
  // communicator's own reading of it).
  if (auto ms = read_count(env, "PDCOLL_TIMEOUT_MS", std::chrono::milliseconds::max().count())) {
    if (*ms == 0) fail("PDCOLL_TIMEOUT_MS=0 must be positive");
    info.timeout = std::chrono::milliseconds{*ms};
  }
  return info;
}

/// Reads the launch description from this process's environment; see the
/// overload taking an environment_map for the rules and errors.
inline launch_info from_environment() { return from_environment(current_environment()); }

}  // namespace pdcoll::bootstrap
