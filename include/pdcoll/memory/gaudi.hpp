// File: memory/gaudi.hpp — the `gaudi` memory domain: Habana Gaudi HBM
// through the habanalabs kernel uAPI, exported as DMA-BUF for the NIC.
//
// One allocation is, on Gaudi2 and later (device memory behind the device
// MMU): HL_MEM_OP_ALLOC (a handle for whole device pages), HL_MEM_OP_MAP
// (a device virtual address), HL_MEM_OP_EXPORT_DMABUF_FD (the DMA-BUF fd the
// NIC imports). Freeing undoes them in reverse: close, UNMAP, FREE.
//
// Gaudi1 has no MMU in front of its DRAM, and its driver does not allocate
// DRAM at all (HL_MEM_OP_ALLOC only does accounting and returns handle 0; the
// runtime owns the physical range). There this domain carves page-aligned
// chunks of [dram_base_address, + dram_size) itself (HL_INFO_HW_IP_INFO) and
// exports them by physical address, which the uAPI passes in the export's
// `handle` (older headers) or `addr` (newer) field. Do not run another DRAM
// allocator on the same Gaudi1 in the same process.
//
// Copies (the host-staged path): the uAPI has no plain copy without the
// command-submission machinery, so copy_to_host/copy_from_host mmap(2) the
// exported DMA-BUF. habanalabs' DMA-BUF exporter does not implement mmap on
// the kernels we know of: there the copies fail with the mmap errno
// (ENODEV/EINVAL) in std::system_category() and the message says so. The
// direct DMA-BUF path, the point of this domain, does not need them.
//
// Errors: a failing driver call throws std::system_error whose code is its
// errno in std::system_category() (so EINVAL, ENOMEM, EPERM stay
// distinguishable) and whose what() names the call and its arguments.
// Inconsistent answers from the driver are errc::device; bad arguments from
// the caller are pdcoll errc values, as in the other domains.
#pragma once

#include <pdcoll/memory/device_buffer.hpp>
#include <pdcoll/memory/domain.hpp>
#include <pdcoll/memory/scratch_cache.hpp>
#include <pdcoll/memory/gaudi_driver.hpp>
#include <pdcoll/memory/view.hpp>

#if __has_include(<drm/habanalabs_accel.h>)
#include <drm/habanalabs_accel.h>
#elif __has_include(<misc/habanalabs.h>)
#include <misc/habanalabs.h>
#else
#error "pdcoll/memory/gaudi.hpp needs the habanalabs uAPI header (<drm/habanalabs_accel.h> or <misc/habanalabs.h>, from linux-libc-dev)"
#endif

#include <rdma/fi_domain.h>

#include <algorithm>
#include <cctype>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

namespace pdcoll::memory {

namespace detail {

// The driver's INFO and MEMORY requests. Under <drm/habanalabs_accel.h>
// (Linux 6.2 on) HL_IOCTL_INFO and HL_IOCTL_MEMORY are command indices and
// the requests are DRM_IOCTL_HL_*; under <misc/habanalabs.h> they are the
// requests themselves. Both are read-write requests of the struct they carry.
#if defined(DRM_IOCTL_HL_INFO)
/// The request number of the habanalabs INFO ioctl.
inline constexpr unsigned long hl_info_request = DRM_IOCTL_HL_INFO;
/// The request number of the habanalabs MEMORY ioctl.
inline constexpr unsigned long hl_memory_request = DRM_IOCTL_HL_MEMORY;
#else
/// The request number of the habanalabs INFO ioctl.
inline constexpr unsigned long hl_info_request = HL_IOCTL_INFO;
/// The request number of the habanalabs MEMORY ioctl.
inline constexpr unsigned long hl_memory_request = HL_IOCTL_MEMORY;
#endif
static_assert(_IOC_DIR(hl_info_request) == (_IOC_READ | _IOC_WRITE) &&
                  _IOC_SIZE(hl_info_request) == sizeof(hl_info_args),
              "the habanalabs INFO request is not a read-write request of hl_info_args");
static_assert(_IOC_DIR(hl_memory_request) == (_IOC_READ | _IOC_WRITE) &&
                  _IOC_SIZE(hl_memory_request) == sizeof(hl_mem_args),
              "the habanalabs MEMORY request is not a read-write request of hl_mem_args");

// Habana PCI device ids (drivers/accel/habanalabs/common/habanalabs_drv.c);
// HL_INFO_HW_IP_INFO reports the ASIC's in hl_info_hw_ip_info::device_id.
inline constexpr std::uint32_t pci_id_goya = 0x0001;
inline constexpr std::uint32_t pci_id_greco = 0x0020;
inline constexpr std::uint32_t pci_id_greco_addin = 0x0030;
inline constexpr std::uint32_t pci_ids_gaudi1[] = {0x1000, 0x1010, 0x1001, 0x1011};

[[noreturn]] inline void fail_errno(int negative_errno, const std::string& what) {
  fail(std::error_code(-negative_errno, std::system_category()), "gaudi: " + what);
}

/// Fills the export request. The uAPI renamed the fields when Gaudi2's
/// offset-based export arrived: older headers have {handle, mem_size},
/// newer ones {addr, mem_size, offset}. Both take the physical address on
/// Gaudi1. On Gaudi2+ the old layout takes the allocation handle, the new one
/// the mapped device address plus an offset (0: we export whole allocations
/// and report the view's offset ourselves).
template <class ExportRequest>
void fill_export_request(ExportRequest& request, bool gaudi1, std::uint64_t handle, std::uint64_t address,
                         std::uint64_t size) noexcept {
  if constexpr (requires(ExportRequest r) { r.offset; }) {
    request.addr = address;
    request.mem_size = size;
    request.offset = 0;
  } else {
    request.handle = gaudi1 ? address : handle;
    request.mem_size = size;
  }
}

/// The trailing number of a device node's name ("/dev/accel/accel3" → 3).
inline int device_ordinal(const std::string& path) noexcept {
  std::size_t end = path.size();
  std::size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(path[begin - 1]))) --begin;
  if (begin == end || end - begin > 6) return 0;
  return std::stoi(path.substr(begin));
}

}  // namespace detail

/// Habana Gaudi device memory (HBM) through the habanalabs uAPI.
///
/// Thread-safe like emulated_device; not movable (views point at it); it
/// must outlive every buffer allocated from it.
///
///     auto paths = pdcoll::memory::gaudi::device_paths();
///     if (!paths.empty()) {
///       pdcoll::memory::gaudi dev(paths.front());
///       auto buf = dev.allocate<pdcoll::bfloat16>(n);   // ALLOC + MAP + EXPORT
///       auto [fd, offset, length] = dev.export_dmabuf(buf.view());
///     }
class gaudi {
 public:
  /// The memory kind transports dispatch on.
  static constexpr transport::memory_kind kind = transport::memory_kind::gaudi;
  /// libfabric's FI_HMEM_SYNAPSEAI (5 in libfabric 1.17's <rdma/fi_domain.h>).
  static constexpr int hmem_iface = FI_HMEM_SYNAPSEAI;
  static_assert(FI_HMEM_SYNAPSEAI == 5, "libfabric's fi_hmem_iface numbering changed");

  /// Which memory model the device has.
  enum class generation : std::uint8_t {
    gaudi1,           ///< no DRAM MMU: physical chunks, export by physical address
    gaudi2_or_later,  ///< ALLOC/MAP through the device MMU, export by handle or mapped address
  };

  /// The device nodes present, sorted: /dev/accel/accel<N> (kernels ≥ 6.3)
  /// and /dev/hl<N> (older); control nodes (…_controlD<N>) are not listed.
  static std::vector<std::string> device_paths() {
    std::vector<std::string> paths;
    auto scan = [&paths](const char* directory, std::string_view prefix) {
      std::error_code ignored;  // a missing directory just means no such devices
      for (const auto& entry : std::filesystem::directory_iterator(directory, ignored)) {
        const std::string name = entry.path().filename().string();
        if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
            std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                        [](unsigned char c) { return std::isdigit(c) != 0; }))
          paths.push_back(entry.path().string());
      }
    };
    scan("/dev/accel", "accel");
    scan("/dev", "hl");
    std::sort(paths.begin(), paths.end());
    return paths;
  }

  /// Opens `device_path` (O_RDWR | O_CLOEXEC) and reads HL_INFO_HW_IP_INFO.
  /// Errors: throws std::system_error: the errno of open or the INFO ioctl,
  /// or errc::device for an ASIC this domain does not drive (Goya, Greco).
  explicit gaudi(std::string device_path, gaudi_driver& driver = detail::default_gaudi_driver())
      : driver_(&driver), path_(std::move(device_path)), ordinal_(detail::device_ordinal(path_)) {
    fd_ = driver_->open(path_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) detail::fail_errno(fd_, "open(" + path_ + ")");
    hl_info_args info{};
    info.op = HL_INFO_HW_IP_INFO;
    info.return_pointer = reinterpret_cast<std::uintptr_t>(&hw_ip_);
    info.return_size = sizeof hw_ip_;
    if (const int rc = driver_->ioctl(fd_, detail::hl_info_request, &info); rc < 0) {
      driver_->close(fd_);
      detail::fail_errno(rc, "HL_IOCTL_INFO(HL_INFO_HW_IP_INFO) on " + path_);
    }
    const std::uint32_t id = hw_ip_.device_id;
    if (id == detail::pci_id_goya || id == detail::pci_id_greco || id == detail::pci_id_greco_addin) {
      driver_->close(fd_);
      detail::fail(errc::device, "gaudi: " + path_ + " is not a Gaudi (PCI id " + std::to_string(id) + ")");
    }
    generation_ = std::find(std::begin(detail::pci_ids_gaudi1), std::end(detail::pci_ids_gaudi1), id) !=
                          std::end(detail::pci_ids_gaudi1)
                      ? generation::gaudi1
                      : generation::gaudi2_or_later;
    // The allocation granule: the driver's default allocation page size when
    // it reports one, else the DRAM page size; never below a host page (the
    // DMA-BUF is mmap'ed by whole host pages).
    std::size_t granule = static_cast<std::size_t>(hw_ip_.device_mem_alloc_default_page_size);
    if (granule == 0) granule = static_cast<std::size_t>(hw_ip_.dram_page_size);
    allocation_granule_ = std::max(granule, detail::page_size());
    if (generation_ == generation::gaudi1) {
      std::uint64_t base = 0;
      std::size_t aligned_base = 0;
      if (!detail::round_up(static_cast<std::size_t>(hw_ip_.dram_base_address), allocation_granule_, aligned_base)) {
        driver_->close(fd_);
        detail::fail(errc::device, "gaudi: DRAM base address out of range");
      }
      base = aligned_base;
      const std::uint64_t end = hw_ip_.dram_base_address + hw_ip_.dram_size;
      const std::size_t usable = end > base ? static_cast<std::size_t>((end - base) / allocation_granule_ * allocation_granule_) : 0;
      try {
        dram_ = detail::first_fit_arena(base, usable);
      } catch (...) {  // bad_alloc: the destructor will not run to close the device
        driver_->close(fd_);
        throw;
      }
    }
  }
  gaudi(const gaudi&) = delete;
  gaudi& operator=(const gaudi&) = delete;
  /// Closes the device. Precondition: every buffer allocated from it is gone.
  ~gaudi() {
    scratch_.clear();
    driver_->close(fd_);
  }
  /// Collectives' device scratch, kept between collectives (scratch_cache.hpp).
  scratch_cache<gaudi>& scratch() noexcept { return scratch_; }

  /// The device node this domain opened.
  const std::string& path() const noexcept { return path_; }
  /// The device's ordinal (the node's number), used as the hmem device id.
  int ordinal() const noexcept { return ordinal_; }
  /// Gaudi1 or later.
  generation device_generation() const noexcept { return generation_; }
  /// PCI device id reported by HL_INFO_HW_IP_INFO.
  std::uint32_t pci_device_id() const noexcept { return hw_ip_.device_id; }
  /// DRAM bytes available to user space.
  std::uint64_t dram_size() const noexcept { return hw_ip_.dram_size; }
  /// Allocations are rounded up to this many bytes.
  std::size_t allocation_granule() const noexcept { return allocation_granule_; }
  /// Live allocations.
  std::size_t allocation_count() const {
    std::lock_guard lock(mutex_);
    return live_.size();
  }
  /// The first error met while freeing (destructors cannot throw); empty if none.
  std::error_code last_release_error() const {
    std::lock_guard lock(mutex_);
    return release_error_;
  }

  /// Allocates `count` elements of device memory, maps it and exports it as
  /// a DMA-BUF (Gaudi2+: three ioctls; Gaudi1: one, see the file comment).
  /// count == 0 gives an empty buffer without a driver call. Where the
  /// device is full, the collectives' idle scratch is freed and the
  /// allocation tried once more.
  /// Errors: throws std::system_error: errc::count_overflow; the failing
  /// ioctl's errno (ENOMEM when the device is full, EPERM when DMA-BUF export
  /// is not permitted, …), after undoing the steps that succeeded;
  /// std::errc::not_enough_memory when Gaudi1's DRAM has no free chunk.
  template <class T>
  device_buffer<T, gaudi> allocate(std::size_t count) {
    return allocate_or_reclaim(scratch_, [&] { return allocate_on_device<T>(count); });
  }

  /// Copies the view into the front of `dst` through an mmap of the
  /// allocation's DMA-BUF (made once per allocation) and counts it.
  /// Errors: throws std::system_error: errc::buffer_too_small,
  /// errc::invalid_argument (not a live allocation of this domain), or the
  /// DMA-BUF mmap's errno (habanalabs does not support it; see above).
  template <class T, class U>
    requires std::same_as<std::remove_const_t<T>, U>
  void copy_to_host(const pdcoll::view<T, gaudi>& src, std::span<U> dst) const {
    if (dst.size() < src.size())
      detail::fail(errc::buffer_too_small, "gaudi::copy_to_host: " + std::to_string(dst.size()) + " < " +
                                               std::to_string(src.size()) + " elements");
    if (!src.empty()) std::memcpy(dst.data(), host_address(src, "copy_to_host"), src.size_bytes());
    copies_.count_to_host(src.size_bytes());
  }

  /// Copies `src` into the front of the view through the DMA-BUF mmap and
  /// counts it. Errors as copy_to_host.
  template <class U, class T>
    requires(std::same_as<std::remove_const_t<U>, T> && !std::is_const_v<T>)
  void copy_from_host(std::span<U> src, const pdcoll::view<T, gaudi>& dst) const {
    if (dst.size() < src.size())
      detail::fail(errc::buffer_too_small, "gaudi::copy_from_host: " + std::to_string(dst.size()) + " < " +
                                               std::to_string(src.size()) + " elements");
    if (!src.empty()) std::memcpy(host_address(dst, "copy_from_host"), src.data(), src.size_bytes());
    copies_.count_from_host(src.size_bytes());
  }

  /// The view as {fd, offset, length}: `fd` is the allocation's DMA-BUF
  /// (exported once, at allocation), owned by this domain and closed when
  /// the buffer is freed; `offset` is the view's offset inside the
  /// allocation. Cost: a mutex and a map lookup.
  /// Errors: throws std::system_error(errc::invalid_argument) when the view
  /// is not inside a live allocation of this domain.
  template <class T>
  dmabuf_export export_dmabuf(const pdcoll::view<T, gaudi>& v) const {
    std::lock_guard lock(mutex_);
    const allocation& record = find_live(v, "export_dmabuf");
    return {record.dmabuf_fd, v.device_address() - record.address, v.size_bytes()};
  }

  /// The copy counters so far.
  copy_counters counters() const noexcept {
    return copies_.snapshot();
  }
  /// Sets every counter to zero.
  void reset_counters() noexcept {
    copies_.reset();
  }

  /// Subscribes to "this allocation is about to be freed" (the hook gets
  /// fabric_region of the allocation's full view, DMA-BUF fd still open).
  hook_id add_invalidation_hook(invalidation_hook hook) { return hooks_.add(std::move(hook)); }
  /// Unsubscribes; no call of the hook runs after this returns.
  void remove_invalidation_hook(hook_id id) { hooks_.remove(id); }
  /// What this domain's regions carry as their free_notice: its hooks,
  /// which announce every free (track_frees tells a communicator so).
  const void* free_notice() const noexcept { return &hooks_; }

  /// False: pdcoll has no Gaudi reduction kernels, so reductions stage to host.
  bool reduces_on_device() const noexcept { return false; }

 private:
  // allocate() without the reclaiming of idle scratch.
  template <class T>
  device_buffer<T, gaudi> allocate_on_device(std::size_t count) {
    std::size_t bytes = 0;
    std::size_t reserved = 0;
    if (!detail::checked_bytes<T>(count, bytes) || !detail::round_up(bytes, allocation_granule_, reserved))
      detail::fail(errc::count_overflow, "gaudi::allocate: " + std::to_string(count) + " elements");
    if (count == 0) return device_buffer<T, gaudi>(this, 0, 0);
    allocation record{};
    record.reserved = reserved;
    record.bytes = bytes;
    if (generation_ == generation::gaudi1) {
      std::lock_guard lock(mutex_);
      if (!dram_.allocate(reserved, record.address))
        detail::fail(std::make_error_code(std::errc::not_enough_memory),
                     "gaudi::allocate: no free DRAM chunk of " + std::to_string(reserved) + " bytes");
    } else {
      record.handle = memory_op_alloc(reserved);
      try {
        record.address = memory_op_map(record.handle);
      } catch (...) {
        memory_op_free(record.handle);
        throw;
      }
    }
    try {
      record.dmabuf_fd = memory_op_export(record);
      std::lock_guard lock(mutex_);
      live_.emplace(record.address, record);  // may throw bad_alloc: undone like a failed export
    } catch (...) {
      undo(record);
      throw;
    }
    return device_buffer<T, gaudi>(this, record.address, count);
  }

  friend struct detail::domain_access;

  struct allocation {
    std::uint64_t handle = 0;   // HL_MEM_OP_ALLOC's handle (Gaudi2+)
    std::uint64_t address = 0;  // device virtual address (Gaudi2+) or physical address (Gaudi1)
    std::size_t reserved = 0;   // bytes taken on the device (whole granules)
    std::size_t bytes = 0;      // bytes asked for
    int dmabuf_fd = -1;
    void* host_mapping = nullptr;  // mmap of the DMA-BUF, made by the first copy
  };

  int memory_ioctl(hl_mem_args& args, const std::string& what) const {
    const int rc = driver_->ioctl(fd_, detail::hl_memory_request, &args);
    if (rc < 0) detail::fail_errno(rc, what);
    return rc;
  }
  std::uint64_t memory_op_alloc(std::size_t size) {
    hl_mem_args args{};
    args.in.op = HL_MEM_OP_ALLOC;
    args.in.alloc.mem_size = size;
    args.in.alloc.page_size = 0;  // the driver's default page size
    memory_ioctl(args, "HL_MEM_OP_ALLOC(mem_size=" + std::to_string(size) + ")");
    return args.out.handle;
  }
  std::uint64_t memory_op_map(std::uint64_t handle) {
    hl_mem_args args{};
    args.in.op = HL_MEM_OP_MAP;
    args.in.map_device.handle = handle;
    args.in.map_device.hint_addr = 0;  // let the driver choose
    memory_ioctl(args, "HL_MEM_OP_MAP(handle=" + std::to_string(handle) + ")");
    // The uAPI: "A value of 0 means the requested operation failed."
    if (args.out.device_virt_addr == 0)
      detail::fail(errc::device, "gaudi: HL_MEM_OP_MAP returned device address 0");
    return args.out.device_virt_addr;
  }
  int memory_op_export(const allocation& record) {
    hl_mem_args args{};
    args.in.op = HL_MEM_OP_EXPORT_DMABUF_FD;
    args.in.flags = O_RDWR | O_CLOEXEC;  // for this op, the DMA-BUF fd's flags
    detail::fill_export_request(args.in.export_dmabuf_fd, generation_ == generation::gaudi1, record.handle,
                                record.address, record.reserved);
    memory_ioctl(args, "HL_MEM_OP_EXPORT_DMABUF_FD(size=" + std::to_string(record.reserved) + ")");
    const int fd = static_cast<int>(args.out.fd);
    if (fd < 0) detail::fail(errc::device, "gaudi: HL_MEM_OP_EXPORT_DMABUF_FD returned fd " + std::to_string(fd));
    return fd;
  }
  int memory_op_unmap(std::uint64_t address) noexcept {
    hl_mem_args args{};
    args.in.op = HL_MEM_OP_UNMAP;
    args.in.unmap.device_virt_addr = address;
    return driver_->ioctl(fd_, detail::hl_memory_request, &args);
  }
  int memory_op_free(std::uint64_t handle) noexcept {
    hl_mem_args args{};
    args.in.op = HL_MEM_OP_FREE;
    args.in.free.handle = handle;
    return driver_->ioctl(fd_, detail::hl_memory_request, &args);
  }

  // Releases what allocate() acquired, in reverse order; the first failure
  // is kept for last_release_error(). The driver refuses to free a mapped
  // handle, hence UNMAP before FREE.
  void undo(allocation& record) noexcept {
    int rc = 0;
    auto note = [&](int result) {
      if (result < 0 && rc == 0) rc = result;
    };
    if (record.host_mapping != nullptr) note(driver_->munmap(record.host_mapping, record.reserved));
    if (record.dmabuf_fd >= 0) note(driver_->close(record.dmabuf_fd));
    std::lock_guard lock(mutex_);
    if (generation_ == generation::gaudi1) {
      dram_.release(record.address, record.reserved);
    } else {
      note(memory_op_unmap(record.address));
      note(memory_op_free(record.handle));
    }
    if (rc < 0 && !release_error_) release_error_ = std::error_code(-rc, std::system_category());
  }

  void release(std::uint64_t address) noexcept {
    allocation record;
    {
      std::lock_guard lock(mutex_);
      const auto it = live_.find(address);
      if (it == live_.end()) return;
      record = it->second;
    }
    // Hooks first, while the memory and its DMA-BUF are still valid: the
    // registration cache must deregister before the NIC's pages go away.
    hooks_.notify(region_of(address, record.bytes));
    {
      std::lock_guard lock(mutex_);
      live_.erase(address);
    }
    undo(record);
  }

  transport::memory_region region_of(std::uint64_t address, std::size_t length) const noexcept {
    transport::memory_region region;
    region.address = reinterpret_cast<void*>(static_cast<std::uintptr_t>(address));
    region.length = length;
    region.kind = kind;
    region.free_notice = &hooks_;
    region.hmem_iface = hmem_iface;
    region.device_id = static_cast<std::uint64_t>(ordinal_);
    std::lock_guard lock(mutex_);
    auto it = live_.upper_bound(address);
    if (it != live_.begin()) {
      --it;
      if (address - it->second.address < it->second.reserved) {
        region.dmabuf_fd = it->second.dmabuf_fd;
        region.dmabuf_offset = address - it->second.address;
      }
    }
    return region;
  }

  // The live allocation holding all of `v`; throws otherwise. Caller locks.
  template <class T>
  allocation& find_live(const pdcoll::view<T, gaudi>& v, const char* operation) const {
    if (detail::domain_access::domain(v) == this) {
      const std::uint64_t address = v.device_address();
      auto it = live_.upper_bound(address);
      if (it != live_.begin()) {
        --it;
        const std::uint64_t offset = address - it->second.address;
        if (offset <= it->second.bytes && v.size_bytes() <= it->second.bytes - offset) return it->second;
      }
    }
    detail::fail(errc::invalid_argument,
                 std::string("gaudi::") + operation + ": the view is not inside a live allocation of this device");
  }

  // The host address of `v` through the allocation's DMA-BUF mapping.
  template <class T>
  std::byte* host_address(const pdcoll::view<T, gaudi>& v, const char* operation) const {
    std::lock_guard lock(mutex_);
    allocation& record = find_live(v, operation);
    if (record.host_mapping == nullptr) {
      void* mapped = nullptr;
      const int rc = driver_->mmap(record.dmabuf_fd, record.reserved, PROT_READ | PROT_WRITE, &mapped);
      if (rc < 0)
        detail::fail_errno(rc, std::string(operation) +
                                   ": mmap of the DMA-BUF failed; the habanalabs DMA-BUF exporter may not "
                                   "support mmap, so host-staged copies are unavailable on this device");
      record.host_mapping = mapped;
    }
    return static_cast<std::byte*>(record.host_mapping) + (v.device_address() - record.address);
  }

  gaudi_driver* driver_;
  std::string path_;
  int ordinal_ = 0;
  int fd_ = -1;
  hl_info_hw_ip_info hw_ip_{};
  generation generation_ = generation::gaudi2_or_later;
  std::size_t allocation_granule_ = 0;
  mutable std::mutex mutex_;
  detail::first_fit_arena dram_;  // Gaudi1 only: physical DRAM
  // address → allocation; mutable because the first copy caches its mmap there
  mutable std::map<std::uint64_t, allocation> live_;
  std::error_code release_error_;
  mutable detail::copy_meter copies_;
  detail::invalidation_hooks hooks_;
  scratch_cache<gaudi> scratch_;  // last: its blocks are freed before the rest goes
};

static_assert(device_domain<gaudi>);

}  // namespace pdcoll::memory
