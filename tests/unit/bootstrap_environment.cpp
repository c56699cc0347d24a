// Rank discovery from launcher environments (bootstrap/launch_info.hpp).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <system_error>
#include <utility>

#include "pdcoll/bootstrap/launch_info.hpp"

using pdcoll::bootstrap::environment_map;
using pdcoll::bootstrap::from_environment;

namespace {

/// The what() of the error from_environment(env) throws; fails the test when it does not throw.
std::string error_of(const environment_map& env) {
  try {
    from_environment(env);
  } catch (const std::system_error& e) {
    CHECK(e.code() == pdcoll::errc::bootstrap);
    return e.what();
  }
  FAIL("from_environment accepted an inconsistent environment");
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("pdcoll-run's variables give rank, world size, local rank, root and token") {
  auto info = from_environment({{"PDCOLL_RANK", "2"}, {"PDCOLL_WORLD_SIZE", "4"}, {"PDCOLL_LOCAL_RANK", "2"},
                                {"PDCOLL_LOCAL_SIZE", "4"}, {"PDCOLL_ROOT", "127.0.0.1:29500"},
                                {"PDCOLL_TOKEN", "abc123"}, {"PDCOLL_TIMEOUT_MS", "2500"}});
  CHECK(info.rank == 2);
  CHECK(info.world_size == 4);
  CHECK(info.local_rank == 2);
  CHECK(info.local_size == 4);
  CHECK(info.root_host == "127.0.0.1");
  CHECK(info.root_port == 29500);
  CHECK(info.token == "abc123");
  CHECK(info.launcher == "pdcoll");
  CHECK(info.timeout == std::chrono::milliseconds{2500});
}

TEST_CASE("torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are understood") {
  auto info = from_environment({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                                {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "23456"}});
  CHECK(info.launcher == "torchrun");
  CHECK(info.rank == 3);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_size == 2);
  CHECK(info.root_host == "node7");
  CHECK(info.root_port == 23456);
  CHECK(info.token.empty());
  CHECK(info.timeout == pdcoll::bootstrap::default_timeout);
}

TEST_CASE("Open MPI, PMI and Slurm variables are each understood") {
  auto ompi = from_environment({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                                {"PDCOLL_ROOT", "[::1]:7000"}});
  CHECK(ompi.launcher == "openmpi");
  CHECK(ompi.rank == 1);
  CHECK(ompi.local_rank == 0);
  CHECK(ompi.root_host == "::1");
  CHECK(ompi.root_port == 7000);

  auto pmi = from_environment({{"PMI_RANK", "4"}, {"PMI_SIZE", "5"}, {"PDCOLL_ROOT", "h:1"}});
  CHECK(pmi.launcher == "pmi");
  CHECK(pmi.rank == 4);
  CHECK(pmi.world_size == 5);
  CHECK(pmi.local_rank == -1);
  CHECK(pmi.local_size == -1);

  auto slurm = from_environment({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "16"}, {"SLURM_NTASKS", "16"},
                                 {"SLURM_LOCALID", "0"}, {"SLURM_STEP_ID", "0"}, {"PDCOLL_ROOT", "n1:9"}});
  CHECK(slurm.launcher == "slurm");
  CHECK(slurm.world_size == 16);
  CHECK(slurm.local_rank == 0);
  CHECK(slurm.root_host == "n1");  // PDCOLL_ROOT wins over the step's first node
  CHECK_FALSE(slurm.root_listens_everywhere);
}

TEST_CASE("a Slurm node list's first host is the one srun starts task 0 on") {
  using pdcoll::bootstrap::first_slurm_host;
  CHECK(first_slurm_host("vm") == "vm");
  CHECK(first_slurm_host("n1,n2") == "n1");
  CHECK(first_slurm_host("gpu[07-10,12],cpu3") == "gpu07");
  CHECK(first_slurm_host("gpu[12,07-10]") == "gpu12");  // srun's order, not sorted again
  CHECK(first_slurm_host("rack[1-2]-n[01-08]") == "rack1-n01");
  CHECK(first_slurm_host("node[003]-ib") == "node003-ib");
  CHECK(first_slurm_host("").empty());
  CHECK(first_slurm_host("gpu[07-10").empty());
}

TEST_CASE("srun alone: the root is the step's first node on a port from the job and step IDs") {
  using pdcoll::bootstrap::slurm_rendezvous_port;
  const environment_map task{{"SLURM_PROCID", "3"},        {"SLURM_STEP_NUM_TASKS", "8"},
                             {"SLURM_NTASKS", "8"},        {"SLURM_LOCALID", "1"},
                             {"SLURM_JOB_ID", "123456"},   {"SLURM_STEP_ID", "2"},
                             {"SLURM_STEP_NODELIST", "a100-[03-04],b7"}};
  auto info = from_environment(task);
  CHECK(info.launcher == "slurm");
  CHECK(info.rank == 3);
  CHECK(info.world_size == 8);
  CHECK(info.root_host == "a100-03");
  CHECK(info.root_port == slurm_rendezvous_port(123456, 2));
  CHECK(info.root_port == 20000 + (123456 % 12768 * 797 + 2) % 12768);
  CHECK(info.root_listens_everywhere);  // the node name may resolve to 127.0.1.1 on the node itself
  CHECK(info.token == "slurm:123456.2");  // another step that lands on this port is refused, not joined

  // Ports stay in [20000, 32768); a job's steps, and the same step of nearby jobs, get different ones.
  for (std::uint64_t job : {0ull, 1ull, 797ull, 4294967295ull})
    for (std::uint64_t step : {0ull, 1ull, 15ull, 4294967294ull}) {
      const auto port = slurm_rendezvous_port(job, step);
      CHECK(port >= 20000);
      CHECK(port < 32768);
    }
  CHECK(slurm_rendezvous_port(7, 0) != slurm_rendezvous_port(7, 1));
  CHECK(slurm_rendezvous_port(7, 16) != slurm_rendezvous_port(8, 0));
  for (std::uint64_t job = 1000; job < 1100; ++job) CHECK(slurm_rendezvous_port(job, 0) != slurm_rendezvous_port(job + 1, 0));

  auto with = [&](std::initializer_list<std::pair<const std::string, std::string>> changes) {
    environment_map env = task;
    for (const auto& [name, value] : changes) env.insert_or_assign(name, value);
    return env;
  };
  auto torch = from_environment(with({{"MASTER_ADDR", "m"}, {"MASTER_PORT", "29500"}}));
  CHECK(torch.root_host == "m");  // MASTER_* wins over the derived root
  CHECK(torch.root_port == 29500);
  CHECK_FALSE(torch.root_listens_everywhere);
  CHECK(torch.token.empty());

  auto reserved = from_environment(with({{"SLURM_STEP_RESV_PORTS", "12000-12003"}, {"PDCOLL_TOKEN", "t"}}));
  CHECK(reserved.root_port == 12000);  // the port Slurm reserved for the step
  CHECK(reserved.token == "t");

  // srun -E (--preserve-env) inside an 8-task allocation keeps the job's SLURM_NTASKS.
  auto two = from_environment(with({{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}}));
  CHECK(two.world_size == 2);

  // The local size is the step's count on this node, not the allocation's
  // request: sbatch --ntasks-per-node=8, then srun -n 4 on one node
  // (refused before: "SLURM_NTASKS_PER_NODE=8 exceeds SLURM_STEP_NUM_TASKS=4").
  CHECK(info.local_size == -1);  // neither variable: unknown
  auto small_step = from_environment(with({{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "4"},
                                           {"SLURM_NTASKS_PER_NODE", "8"}, {"SLURM_STEP_TASKS_PER_NODE", "4"}}));
  CHECK(small_step.world_size == 4);
  CHECK(small_step.local_size == 4);
  // 7 tasks on 4 nodes, "2(x3),1": the node's index picks its count.
  for (auto [node, expected] : {std::pair{"0", 2}, {"2", 2}, {"3", 1}, {"4", -1}}) {
    CAPTURE(node);
    auto uneven = from_environment(with({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_STEP_NUM_TASKS", "7"},
                                         {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}, {"SLURM_NODEID", node}}));
    CHECK(uneven.local_size == expected);
  }
  CHECK(from_environment(with({{"SLURM_STEP_TASKS_PER_NODE", "2(x4)"}})).local_size == 2);  // even: no node needed
  for (const char* malformed : {"2(x", "(x2)", "2,,1", "x", "0", ""})
    CHECK(from_environment(with({{"SLURM_STEP_TASKS_PER_NODE", malformed}, {"SLURM_NODEID", "0"}})).local_size == -1);
  CHECK(contains(error_of(with({{"SLURM_LOCALID", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "2"}})),
                 "SLURM_LOCALID=2 is not below SLURM_STEP_TASKS_PER_NODE=2"));

  // srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE with the step's numbering: the root is still derived.
  auto pmi2 = from_environment(with({{"PMI_RANK", "3"}, {"PMI_SIZE", "8"}}));
  CHECK(pmi2.launcher == "pmi");
  CHECK(pmi2.root_host == "a100-03");
  // An mpiexec inside the task numbers its own ranks: no root from Slurm.
  CHECK(contains(error_of(with({{"PMI_RANK", "0"}, {"PMI_SIZE", "4"}})), "no rendezvous root"));

  CHECK(contains(error_of(with({{"SLURM_DISTRIBUTION", "arbitrary"}})),
                 "SLURM_DISTRIBUTION=arbitrary may place task 0 off the step's first node: set PDCOLL_ROOT"));
  CHECK(contains(error_of(with({{"SLURM_HET_SIZE", "2"}})), "heterogeneous job"));
  CHECK(contains(error_of(with({{"SLURM_STEP_NODELIST", "gpu[1-2"}})), "names no host"));
  CHECK(contains(error_of(with({{"SLURM_JOB_ID", "12x"}})), "SLURM_JOB_ID='12x' is not an ID"));
  environment_map no_list = task;
  no_list.erase("SLURM_STEP_NODELIST");
  CHECK(contains(error_of(no_list), "SLURM_STEP_NODELIST is unset"));
}

TEST_CASE("mpirun alone: rank 0's address comes through the launcher's PMIx server") {
  const environment_map mpirun{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                               {"PMIX_NAMESPACE", "742195201"}, {"PMIX_RANK", "2"}};
  if constexpr (pdcoll::bootstrap::have_pmix) {
    auto info = from_environment(mpirun);
    CHECK(info.launcher == "openmpi");
    CHECK(info.rank == 2);
    CHECK(info.root_through_pmix);
    CHECK(info.root_listens_everywhere);
    CHECK(info.root_host.empty());
    CHECK(info.root_port == 0);
    CHECK(info.token == "pmix:742195201");  // another job's ranks are refused, not joined

    auto with_token = mpirun;
    with_token.emplace("PDCOLL_TOKEN", "secret");
    CHECK(from_environment(with_token).token == "secret");

    // Inside an allocation the ranks inherit the step of mpirun's daemons
    // (started by srun); where its numbers happen to match this rank's, PMIx
    // must still be the one asked, as it is on the ranks where they do not.
    auto in_allocation = mpirun;
    for (auto [name, value] : {std::pair{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "2"}, {"SLURM_STEP_NUM_TASKS", "4"},
                               {"SLURM_STEP_NODELIST", "n[1-4]"}, {"SLURM_JOB_ID", "77"}})
      in_allocation.emplace(name, value);
    auto inside = from_environment(in_allocation);
    CHECK(inside.root_through_pmix);
    CHECK(inside.root_host.empty());

    auto mismatch = mpirun;
    mismatch["PMIX_RANK"] = "3";
    CHECK(contains(error_of(mismatch), "PMIX_RANK=3 but this is rank 2"));
  } else {
    CHECK(contains(error_of(mpirun), "this build of pdcoll has none"));
    CHECK(contains(error_of(mpirun), "set PDCOLL_ROOT=host:port"));
  }

  // An address the user gives wins, and then PMIx is not asked.
  auto named = mpirun;
  named.emplace("PDCOLL_ROOT", "n1:9");
  auto info = from_environment(named);
  CHECK_FALSE(info.root_through_pmix);
  CHECK(info.root_host == "n1");
  CHECK(info.token.empty());

  // Without a PMIx server (an old mpirun) there is still nobody to ask.
  auto bare = mpirun;
  bare.erase("PMIX_NAMESPACE");
  CHECK(contains(error_of(bare), "no rendezvous root for 4 ranks"));

  // A one-rank job needs no rendezvous at all.
  auto alone = environment_map{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"},
                               {"PMIX_NAMESPACE", "1"}, {"PMIX_RANK", "0"}};
  CHECK_FALSE(from_environment(alone).root_through_pmix);
}

TEST_CASE("a batch script's own process is no srun task: refused for more than one task, not left waiting") {
  // sbatch -n 2 exports SLURM_PROCID=0 and SLURM_NTASKS=2 to the script, but no step.
  CHECK(contains(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                           {"SLURM_JOB_ID", "9"}, {"SLURM_JOB_NODELIST", "vm"}}),
                 "SLURM_NTASKS=2 but this process is no srun task"));
  auto one = from_environment({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_JOB_ID", "9"}});
  CHECK(one.world_size == 1);
  CHECK(one.root_port == 0);
  // sbatch -N 1 without -n exports SLURM_PROCID but no SLURM_NTASKS: one process.
  auto unsized = from_environment({{"SLURM_PROCID", "0"}, {"SLURM_JOB_ID", "9"}});
  CHECK(unsized.world_size == 1);
  // torchrun started in such a script numbers its own ranks: Slurm's variables are not read.
  auto torch = from_environment({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"},
                                 {"MASTER_ADDR", "vm"}, {"MASTER_PORT", "29500"}});
  CHECK(torch.launcher == "torchrun");
  CHECK(torch.rank == 1);
  auto torch_unsized = from_environment({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"},
                                         {"MASTER_ADDR", "vm"}, {"MASTER_PORT", "29500"}});
  CHECK(torch_unsized.rank == 1);
}

TEST_CASE("a one-rank job needs no root and serves on an ephemeral loopback port") {
  auto info = from_environment({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "1"}});
  CHECK(info.root_host == "127.0.0.1");
  CHECK(info.root_port == 0);
}

TEST_CASE("PDCOLL_* wins over torchrun and agrees with it when both are set") {
  auto info = from_environment({{"PDCOLL_RANK", "1"}, {"PDCOLL_WORLD_SIZE", "2"}, {"RANK", "1"}, {"WORLD_SIZE", "2"},
                                {"PDCOLL_ROOT", "a:1"}, {"MASTER_ADDR", "b"}, {"MASTER_PORT", "2"}});
  CHECK(info.launcher == "pdcoll");
  CHECK(info.root_host == "a");  // PDCOLL_ROOT wins over MASTER_*
}

TEST_CASE("Slurm as the outer allocator of a torchrun job is not an inconsistency") {
  auto info = from_environment({{"RANK", "5"}, {"WORLD_SIZE", "16"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"},
                                {"MASTER_ADDR", "n"}, {"MASTER_PORT", "1"}});
  CHECK(info.rank == 5);
  CHECK(info.launcher == "torchrun");
  // One srun task per node running torchrun, whose rendezvous numbers the
  // nodes in its own order: same world size, another rank, still no error.
  auto same_size = from_environment({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"},
                                     {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_ID", "0"}, {"MASTER_ADDR", "n"},
                                     {"MASTER_PORT", "1"}});
  CHECK(same_size.rank == 1);
  // Inside an srun task, mpiexec (Hydra) starts its own ranks.
  auto hydra = from_environment({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"},
                                 {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_STEP_ID", "0"}, {"PDCOLL_ROOT", "h:1"}});
  CHECK(hydra.launcher == "pmi");
  CHECK(hydra.rank == 2);
}

TEST_CASE("a launcher reporting another world size is an outer one: mpirun or Hydra starting torchrun agents") {
  // mpirun -np 2 torchrun --nproc-per-node 4: the workers inherit their
  // agent's OMPI_* (rank 1 of 2) beside torchrun's RANK 5 of 8.
  const auto nested = pdcoll::bootstrap::from_environment(
      {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "m"},
       {"MASTER_PORT", "1"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  CHECK(nested.launcher == "torchrun");
  CHECK(nested.rank == 5);
  CHECK(nested.world_size == 8);
  const auto hydra = pdcoll::bootstrap::from_environment(
      {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"PDCOLL_ROOT", "h:1"}});
  CHECK(hydra.rank == 1);
  CHECK(hydra.world_size == 4);
  // The launcher read first reporting the smaller world is not inner to the
  // other: pdcoll-run -n 2 torchrun --nproc-per-node 4, or a stale PDCOLL_*.
  CHECK(contains(error_of({{"PDCOLL_RANK", "1"}, {"PDCOLL_WORLD_SIZE", "2"}, {"RANK", "5"}, {"WORLD_SIZE", "8"},
                           {"PDCOLL_ROOT", "h:1"}}),
                 "PDCOLL_WORLD_SIZE=2 but WORLD_SIZE=8"));
}

// mpirun -np 4 --npernode 1 torchrun --nproc-per-node 1 (or Hydra, or srun
// --mpi=pmi2): the same world size in both, but torchrun's c10d rendezvous
// numbers the nodes by name, not in the outer launcher's order.
TEST_CASE("a torchrun worker under an outer launcher of the same world size keeps torchrun's rank") {
  for (const char* outer_rank : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    CAPTURE(outer_rank);
    const std::string outer_size = std::string(outer_rank) == "PMI_RANK" ? "PMI_SIZE" : "OMPI_COMM_WORLD_SIZE";
    const auto info = pdcoll::bootstrap::from_environment(
        {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}, {"MASTER_ADDR", "m"},
         {"MASTER_PORT", "1"}, {"TORCHELASTIC_RUN_ID", "job7"}, {outer_rank, "2"}, {outer_size, "4"}});
    CHECK(info.launcher == "torchrun");
    CHECK(info.rank == 1);
    CHECK(info.world_size == 4);
  }
}

TEST_CASE("numbers out of range say so; PDCOLL_TIMEOUT_MS reaches milliseconds::max(); bare IPv6 roots are refused") {
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "99999999999999999999999"}}),
                 "PDCOLL_WORLD_SIZE=99999999999999999999999 is above 2147483647"));
  const environment_map base{{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "2"}, {"PDCOLL_ROOT", "h:1"}};
  auto with = [&](std::string name, std::string value) {
    auto env = base;
    env[name] = value;
    return env;
  };
  // "No deadline", as the communicator reads it too (design-notes item 52).
  CHECK(from_environment(with("PDCOLL_TIMEOUT_MS", "9223372036854775807")).timeout ==
        std::chrono::milliseconds::max());
  CHECK(from_environment(with("PDCOLL_TIMEOUT_MS", "3000000000")).timeout == std::chrono::milliseconds(3000000000));
  CHECK(contains(error_of(with("PDCOLL_TIMEOUT_MS", "9223372036854775808")), "is above 9223372036854775807"));
  CHECK(contains(error_of(with("PDCOLL_TIMEOUT_MS", "5s")), "PDCOLL_TIMEOUT_MS='5s' is not a non-negative integer"));
  CHECK(contains(error_of(with("PDCOLL_ROOT", "fe80::1")), "IPv6 address without brackets: write [address]:port"));
  CHECK(from_environment(with("PDCOLL_ROOT", "[fe80::1]:7")).root_port == 7);
}

TEST_CASE("inconsistent or missing variables are errors that name the variable") {
  CHECK(contains(error_of({{"PDCOLL_RANK", "5"}, {"PDCOLL_WORLD_SIZE", "4"}, {"PDCOLL_ROOT", "h:1"}}),
                 "PDCOLL_RANK=5 is not below PDCOLL_WORLD_SIZE=4"));
  CHECK(contains(error_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "2"},
                           {"OMPI_COMM_WORLD_SIZE", "4"}, {"PDCOLL_ROOT", "h:1"}}),
                 "RANK=1 but OMPI_COMM_WORLD_RANK=2"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_ROOT", "h:1"}}),
                 "PDCOLL_RANK is set but PDCOLL_WORLD_SIZE is not"));
  CHECK(contains(error_of({{"WORLD_SIZE", "2"}}), "WORLD_SIZE is set but RANK is not"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "-1"}, {"PDCOLL_WORLD_SIZE", "2"}}),
                 "PDCOLL_RANK='-1' is not a non-negative integer"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "1x"}, {"PDCOLL_WORLD_SIZE", "2"}}), "PDCOLL_RANK='1x'"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "0"}}), "PDCOLL_WORLD_SIZE=0 must be at least 1"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "99999999999999"}}), "PDCOLL_WORLD_SIZE="));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "2000000000"}, {"PDCOLL_ROOT", "h:1"}}),
                 "PDCOLL_WORLD_SIZE=2000000000 is above the 65536 ranks a rendezvous store serves"));
  CHECK(contains(error_of({}), "no launcher variables found"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "2"}}), "no rendezvous root"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "2"}, {"PDCOLL_ROOT", "nohost"}}),
                 "PDCOLL_ROOT=nohost is not host:port"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "2"}, {"PDCOLL_ROOT", "h:70000"}}),
                 "PDCOLL_ROOT=h:70000 has a port"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "2"}, {"PDCOLL_ROOT", ":5"}}), "empty host"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "2"}, {"PDCOLL_ROOT", "h:0"}}),
                 "port 0 is only allowed for a one-rank job"));
  CHECK(contains(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
                 "MASTER_ADDR is set but MASTER_PORT is not"));
  CHECK(contains(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}),
                 "MASTER_PORT is set but MASTER_ADDR is not"));
  CHECK(contains(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "http"}}),
                 "MASTER_PORT='http' is not a port number"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "2"}, {"PDCOLL_LOCAL_RANK", "2"},
                           {"PDCOLL_LOCAL_SIZE", "2"}, {"PDCOLL_ROOT", "h:1"}}),
                 "PDCOLL_LOCAL_RANK=2 is not below PDCOLL_LOCAL_SIZE=2"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "2"}, {"PDCOLL_LOCAL_SIZE", "3"},
                           {"PDCOLL_ROOT", "h:1"}}),
                 "PDCOLL_LOCAL_SIZE=3 exceeds PDCOLL_WORLD_SIZE=2"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "1"}, {"PDCOLL_TIMEOUT_MS", "0"}}),
                 "PDCOLL_TIMEOUT_MS=0"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "1"}, {"PDCOLL_TIMEOUT_MS", "soon"}}),
                 "PDCOLL_TIMEOUT_MS='soon'"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "1"}, {"PDCOLL_TOKEN", std::string(300, 'x')}}),
                 "PDCOLL_TOKEN is longer than 256 bytes"));
}

TEST_CASE("the process environment is read through environ") {
  auto env = pdcoll::bootstrap::current_environment();
  // PATH is set in every environment the tests run in (ctest, a shell).
  CHECK(env.count("PATH") == 1);
}
