// Rank discovery from launcher environments (bootstrap/launch_info.hpp).
#include <doctest/doctest.h>

#include <string>
#include <system_error>

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

  auto slurm = from_environment({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "0"},
                                 {"PDCOLL_ROOT", "n1:9"}});
  CHECK(slurm.launcher == "slurm");
  CHECK(slurm.world_size == 16);
  CHECK(slurm.local_rank == 0);
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
}

TEST_CASE("inconsistent or missing variables are errors that name the variable") {
  CHECK(contains(error_of({{"PDCOLL_RANK", "5"}, {"PDCOLL_WORLD_SIZE", "4"}, {"PDCOLL_ROOT", "h:1"}}),
                 "PDCOLL_RANK=5 is not below PDCOLL_WORLD_SIZE=4"));
  CHECK(contains(error_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "2"},
                           {"OMPI_COMM_WORLD_SIZE", "4"}, {"PDCOLL_ROOT", "h:1"}}),
                 "RANK=1 but OMPI_COMM_WORLD_RANK=2"));
  CHECK(contains(error_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "3"},
                           {"PDCOLL_ROOT", "h:1"}}),
                 "WORLD_SIZE=4 but PMI_SIZE=3"));
  CHECK(contains(error_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"PMI_RANK", "2"}, {"PMI_SIZE", "4"},
                           {"PDCOLL_ROOT", "h:1"}}),
                 "PMI_RANK=2 but SLURM_PROCID=1"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_ROOT", "h:1"}}),
                 "PDCOLL_RANK is set but PDCOLL_WORLD_SIZE is not"));
  CHECK(contains(error_of({{"WORLD_SIZE", "2"}}), "WORLD_SIZE is set but RANK is not"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "-1"}, {"PDCOLL_WORLD_SIZE", "2"}}),
                 "PDCOLL_RANK='-1' is not a non-negative integer"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "1x"}, {"PDCOLL_WORLD_SIZE", "2"}}), "PDCOLL_RANK='1x'"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "0"}}), "PDCOLL_WORLD_SIZE=0 must be at least 1"));
  CHECK(contains(error_of({{"PDCOLL_RANK", "0"}, {"PDCOLL_WORLD_SIZE", "99999999999999"}}), "PDCOLL_WORLD_SIZE="));
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
