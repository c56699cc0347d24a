// File: test_package/test_package.cpp — a Conan consumer of pdcoll: includes
// the whole public surface and runs a checked all-reduce on one rank over the
// in-process transport (no launcher, no network).
#include <pdcoll/pdcoll.hpp>

#include <cstdio>
#include <exception>
#include <vector>

int main() try {
  auto fabric = pdcoll::transport::inproc::fabric::create(1);
  pdcoll::communicator comm(fabric->endpoint_for(0));
  std::vector<float> grads(1000, 1.5f);
  pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, grads, pdcoll::op::sum) |
                          pdcoll::exec::with_deadline(std::chrono::seconds(10)));
  for (float g : grads)
    if (g != 1.5f) {
      std::printf("test_package: all_reduce on one rank changed 1.5 to %g\n", static_cast<double>(g));
      return 1;
    }
  std::printf("test_package: pdcoll all_reduce over %s on 1 rank: ok\n", comm.transport_name().c_str());
#if defined(PDCOLL_WITH_PMIX)
  // Taken by address so that the PMIx rendezvous is compiled here and linked against libpmix.
  auto* volatile share_root = &pdcoll::bootstrap::detail::share_root_through_pmix;
  if (share_root == nullptr) return 1;
#endif
  std::printf("test_package: PMIx rendezvous under mpirun: %s\n", pdcoll::bootstrap::have_pmix ? "yes" : "no");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "test_package: %s\n", e.what());
  return 1;
}
