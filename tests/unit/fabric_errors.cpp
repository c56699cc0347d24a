// Unit tests: libfabric error category and provider selection rules.
#include <doctest/doctest.h>

#include "pdcoll/transport/libfabric/endpoint.hpp"

namespace fabric = pdcoll::transport::libfabric;

TEST_CASE("FI_ECANCELED and FI_ETRUNC become the codes the transport contract names") {
  CHECK(fabric::make_fabric_error(-FI_ECANCELED) == std::errc::operation_canceled);
  CHECK(fabric::make_fabric_error(FI_ETRUNC) == pdcoll::errc::collective_mismatch);
  CHECK_FALSE(fabric::make_fabric_error(0));
}

TEST_CASE("other libfabric errors keep their fi_errno and fi_strerror text") {
  const auto ec = fabric::make_fabric_error(-FI_EOTHER);
  CHECK(&ec.category() == &fabric::fabric_category());
  CHECK(ec.value() == FI_EOTHER);
  CHECK(ec.message().find(fi_strerror(FI_EOTHER)) != std::string::npos);
  fabric::fabric_category().record_provider_text(FI_EOTHER, "peer vanished");
  CHECK(ec.message().find("peer vanished") != std::string::npos);
}

TEST_CASE("libfabric errno-range errors compare equal to std::errc") {
  CHECK(fabric::make_fabric_error(-FI_ECONNREFUSED) == std::errc::connection_refused);
  CHECK(fabric::make_fabric_error(-FI_EIO) == std::errc::io_error);
}

TEST_CASE("provider choice prefers options, then PDCOLL_PROVIDER, then FI_PROVIDER") {
  const std::vector<std::string> hosts = {"a", "a"};
  fabric::options opts;
  opts.provider = "sockets";
  CHECK(fabric::detail::choose_provider(opts, "tcp", "shm", hosts).name == "sockets");
  opts.provider.clear();
  CHECK(fabric::detail::choose_provider(opts, "tcp", "shm", hosts).name == "tcp");
  CHECK(fabric::detail::choose_provider(opts, nullptr, "verbs", hosts).reason == "from FI_PROVIDER");
}

TEST_CASE("provider choice picks shm on one host and tcp;ofi_rxm across hosts") {
  fabric::options opts;
  auto local = fabric::detail::choose_provider(opts, nullptr, nullptr, {"n1", "n1", "n1"});
  CHECK(local.name == "shm");
  CHECK(local.reason.find("3 ranks on host n1") != std::string::npos);
  CHECK(fabric::detail::choose_provider(opts, "", "", {"n1", "n2"}).name == "tcp;ofi_rxm");
  opts.all_local = true;
  CHECK(fabric::detail::choose_provider(opts, nullptr, nullptr, {"n1", "n2"}).name == "shm");
}

TEST_CASE("make_endpoint names the failing fi_getinfo call for an unknown provider") {
  fabric::options opts;
  opts.provider = "no-such-provider";
  auto self = [](std::string_view s) { return std::vector<std::string>{std::string(s)}; };
  try {
    (void)fabric::make_endpoint(0, 1, self, opts);
    FAIL("make_endpoint accepted an unknown provider");
  } catch (const std::system_error& e) {
    CHECK(std::string(e.what()).find("fi_getinfo failed") != std::string::npos);
    CHECK(std::string(e.what()).find("no-such-provider") != std::string::npos);
  }
}
