// File: detail/staging.hpp — the host-staged data path: device buffers move
// through host bounce buffers in chunks, with the copies of one chunk
// overlapping the network transfers of another.
//
// A staged collective is cut along its element range into chunks of
// `staging_chunk_bytes()` (all blocks of a chunk together: all_gather's
// output, reduce_scatter's input and all_to_all's buffers have one block per
// rank, so their chunk is a slice of every block). Each chunk runs as a
// sub-collective of the same algorithm on host bounce buffers:
//
//     slot 0:  d2h c0 | net c0 ........| h2d c0 | d2h c2 | net c2 ...
//     slot 1:          d2h c1 | net c1 ..........| h2d c1 | d2h c3 | net c3
//
// `staging_depth` slots are in flight at once, so chunk k's host→device copy
// and chunk k+2's device→host copy run while chunk k+1 is on the wire, and
// host memory stays bounded by depth × (input + output) chunk bytes however
// large the buffers are. Chunks in different slots use disjoint message
// indices (slot << staging_slot_shift), so their messages never match each
// other; a slot's next chunk reuses its indices only after its previous one
// completed on this rank, and messages between a pair match in send order.
//
// The v forms (all_to_allv, all_gatherv) chunk each pair's block on its
// own instead: a block of n elements goes in n / L + 1 chunks of at most L
// = staging_chunk_bytes() / element size / P elements, the last one
// shorter (maybe empty), so both ends of a pair know the sequence from
// their own count and a count they disagree on fails a chunk's length.
// Chunk k of a rank exchanges slice k of each block that reaches it, so a
// rank runs as many chunks as its longest block needs.
//
// Every rank must choose the same path for the same collective (the chunking
// changes the messages): use the same memory domain and the same
// PDCOLL_FORCE_STAGING and PDCOLL_STAGING_CHUNK_BYTES on every rank, or the
// collective completes with errc::collective_mismatch or errc::timeout.
//
// Performance: the emulated device's copies are memcpy on the calling
// thread, so "overlap" means the copies run while the kernel (io_uring, tcp)
// or the peer (shm) moves the other chunk; a copy engine would overlap more.
#pragma once

#include <pdcoll/detail/collective_task.hpp>
#include <pdcoll/detail/tags.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

namespace pdcoll::detail {

/// Chunks a staged collective keeps in flight.
inline constexpr int staging_depth = 2;
/// Message-index bit where a chunk's slot goes (algorithms use far fewer indices).
inline constexpr int staging_slot_shift = 22;
static_assert((std::uint64_t{max_message_index} + 1) == (std::uint64_t{1} << staging_slot_shift) &&
                  staging_depth <= (1 << (24 - staging_slot_shift)),
              "a staged chunk's slot goes above every index an algorithm may use, inside the tag's 24 index bits");

/// Bytes per staging chunk: PDCOLL_STAGING_CHUNK_BYTES (at least 4 KiB), default 4 MiB.
inline std::size_t staging_chunk_bytes() noexcept {
  static const std::size_t bytes = [] {
    std::size_t b = std::size_t{4} << 20;
    if (const char* v = std::getenv("PDCOLL_STAGING_CHUNK_BYTES")) {
      char* end = nullptr;
      unsigned long long n = std::strtoull(v, &end, 10);
      if (end != v && *end == '\0' && n >= 4096) b = static_cast<std::size_t>(n);
    }
    return b;
  }();
  return bytes;
}

/// Elements of each block per chunk, the same on every rank: the chunk's
/// bytes over the blocks the collective's largest buffer has.
inline std::size_t staging_chunk_elements(std::size_t chunk_bytes, std::size_t element_size,
                                          std::size_t blocks) noexcept {
  const std::size_t per_block = chunk_bytes / (element_size * (blocks ? blocks : 1));
  return per_block ? per_block : 1;
}

/// A staged buffer's shape on this rank: `blocks` blocks of `block_bytes`,
/// block b at b × block_bytes (0 blocks: this rank passes no such buffer).
struct staged_layout {
  std::size_t blocks = 0;
  std::size_t block_bytes = 0;

  /// The shape of `length` bytes of a collective of `count` elements.
  static staged_layout of(std::size_t length, std::size_t count, std::size_t element_size) noexcept {
    const std::size_t block = count * element_size;
    if (length == 0 || block == 0) return {};
    return {length / block, block};
  }
};

}  // namespace pdcoll::detail
