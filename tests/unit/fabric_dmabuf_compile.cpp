// Compile check for the FI_MR_DMABUF registration path (libfabric >= 1.20).
// Debian 12's libfabric 1.17 lacks struct fi_mr_dmabuf, so this file defines
// the 1.20 structures locally (in a namespace of their own) and compiles the
// function fabric_endpoint::register_region calls under `#if defined(FI_MR_DMABUF)`
// (detail::fill_dmabuf_attr) against them, so that guarded code cannot rot unseen.
#include <doctest/doctest.h>

#include <rdma/fi_domain.h>

#include <cstddef>
#include <cstdint>

#include "pdcoll/transport/libfabric/endpoint.hpp"

namespace v1_20 {
// fi_domain.h of libfabric 1.20: the dmabuf descriptor and the attr union.
#if defined(FI_MR_DMABUF)
using ::fi_mr_attr;
using ::fi_mr_dmabuf;
inline constexpr std::uint64_t mr_dmabuf = FI_MR_DMABUF;
#else
struct fi_mr_dmabuf {
  int fd;
  std::uint64_t offset;
  std::size_t len;
  void* base_addr;
};
struct fi_mr_attr {
  union {
    const struct iovec* mr_iov;
    const fi_mr_dmabuf* dmabuf;
  };
  std::size_t iov_count;
  std::uint64_t access;
  std::uint64_t offset;
  std::uint64_t requested_key;
  void* context;
  std::size_t auth_key_size;
  std::uint8_t* auth_key;
  enum fi_hmem_iface iface;
  union {
    std::uint64_t reserved;
    int cuda;
    int ze;
    int neuron;
    int synapseai;
  } device;
  void* hmem_data;
};
inline constexpr std::uint64_t mr_dmabuf = std::uint64_t{1} << 40;
#endif

}  // namespace v1_20

TEST_CASE("the FI_MR_DMABUF registration path compiles against libfabric 1.20 structures") {
  char bytes[64];
  pdcoll::transport::memory_region region;
  region.address = bytes;
  region.length = sizeof bytes;
  region.kind = pdcoll::transport::memory_kind::gaudi;
  region.dmabuf_fd = 7;
  region.dmabuf_offset = 4096;
  region.hmem_iface = FI_HMEM_SYNAPSEAI;
  v1_20::fi_mr_dmabuf dmabuf{};
  v1_20::fi_mr_attr attr{};
  pdcoll::transport::libfabric::detail::fill_dmabuf_attr(region, dmabuf, attr);
  CHECK(v1_20::mr_dmabuf == (std::uint64_t{1} << 40));
  CHECK(attr.dmabuf->fd == 7);
  CHECK(attr.dmabuf->offset == 4096);
  CHECK(attr.dmabuf->len == sizeof bytes);
  CHECK(attr.iface == FI_HMEM_SYNAPSEAI);
  // Providers register base_addr + offset (efa's iova, cxi's buffer): that
  // must be the region's own address, not the offset counted twice.
  CHECK(reinterpret_cast<std::uintptr_t>(attr.dmabuf->base_addr) + attr.dmabuf->offset ==
        reinterpret_cast<std::uintptr_t>(region.address));
  region.address = nullptr;  // the fd and offset alone name the bytes
  pdcoll::transport::libfabric::detail::fill_dmabuf_attr(region, dmabuf, attr);
  CHECK(attr.dmabuf->base_addr == nullptr);
}

TEST_CASE("FI_MR_DMABUF is used only with the flag in the headers, a fabric opened at 1.20 and FI_HMEM") {
  using pdcoll::transport::libfabric::detail::dmabuf_registration_usable;
  CHECK(dmabuf_registration_usable(true, FI_VERSION(1, 20), true));
  CHECK(dmabuf_registration_usable(true, FI_VERSION(2, 0), true));
  CHECK_FALSE(dmabuf_registration_usable(true, FI_VERSION(1, 17), true));  // efa: -FI_EBADFLAGS below 1.20
  CHECK_FALSE(dmabuf_registration_usable(true, FI_VERSION(1, 20), false));
  CHECK_FALSE(dmabuf_registration_usable(false, FI_VERSION(1, 20), true));
#if defined(FI_MR_DMABUF)
  CHECK(pdcoll::transport::libfabric::detail::requested_api_version == FI_VERSION(1, 20));
#else
  CHECK(pdcoll::transport::libfabric::detail::requested_api_version == FI_VERSION(1, 17));
#endif
}
