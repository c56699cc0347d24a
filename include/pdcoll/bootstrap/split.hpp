// File: bootstrap/split.hpp — splitting a job's ranks into sub-groups: who
// belongs to which (MPI_Comm_split's and ncclCommSplit's rule), and the
// address exchange a sub-group's transport endpoint runs through the job's
// rendezvous store.
//
// job::split gathers every rank's (color, key) with one store all_gather, so
// every rank computes the same membership. A sub-group's endpoint then sets
// up with group_exchange: keyed SETs and GETs under a prefix of its own, so
// sub-groups whose transports need different numbers of exchange rounds (shm
// on one host, tcp across hosts) never wait for each other.
#pragma once

#include <pdcoll/bootstrap/store.hpp>
#include <pdcoll/error.hpp>
#include <pdcoll/transport/endpoint.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pdcoll::bootstrap {

/// The color that leaves a rank out of every sub-group of a split (MPI's
/// MPI_UNDEFINED, NCCL's NCCL_SPLIT_NOCOLOR).
inline constexpr int no_color = -1;

/// One rank's part in a split: ranks of equal color form a sub-group, ordered
/// by key, ties broken by job rank.
struct split_request {
  int color = no_color;  ///< sub-group to join, >= 0; no_color joins none
  int key = 0;           ///< order within the sub-group
  /// What every rank must agree on besides the colors (job::new_group puts a
  /// digest of its rank list here); compared across ranks, never interpreted.
  std::uint64_t agreement = 0;
};

/// `request` as this rank's all_gather contribution.
inline std::string encode(const split_request& request) {
  return std::to_string(request.color) + ' ' + std::to_string(request.key) + ' ' + std::to_string(request.agreement);
}

/// Parses a contribution made by encode(). Throws errc::protocol on anything else.
inline split_request decode_split_request(std::string_view text) {
  split_request r;
  const char* at = text.data();
  const char* end = text.data() + text.size();
  auto field = [&](auto& value) {
    auto [next, ec] = std::from_chars(at, end, value);
    if (ec != std::errc{}) return false;
    at = next;
    return true;
  };
  auto space = [&] { return at != end && *at++ == ' '; };
  if (!(field(r.color) && space() && field(r.key) && space() && field(r.agreement) && at == end))
    detail::throw_error(errc::protocol, "malformed split request '" + std::string(text) + "'");
  return r;
}

/// The job ranks of `rank`'s sub-group, in sub-group rank order: every rank
/// whose color equals `rank`'s, sorted by key and then by job rank. Empty
/// when `rank`'s color is no_color.
inline std::vector<int> split_members(std::span<const split_request> requests, int rank) {
  const int color = requests[static_cast<std::size_t>(rank)].color;
  std::vector<int> members;
  if (color == no_color) return members;
  for (int r = 0; r < static_cast<int>(requests.size()); ++r)
    if (requests[static_cast<std::size_t>(r)].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return requests[static_cast<std::size_t>(a)].key < requests[static_cast<std::size_t>(b)].key;
  });
  return members;
}

/// An address_exchange among the `members` ranks of one sub-group, run
/// through the job's `store`: each call (round) sets
/// `<prefix>/<round>/<index>` to this rank's contribution and gets every
/// member's, so it returns once all members made the same call. `prefix`
/// must name this sub-group uniquely in the job (job::split uses the split's
/// number and the color). Cost per round: one SET and `members` GETs, each a
/// round trip to the store, each bounded by the store's deadline. The store
/// must outlive the returned function and not be used meanwhile by another
/// thread.
inline transport::address_exchange group_exchange(store& s, std::string prefix, int members, int index) {
  auto round = std::make_shared<std::uint32_t>(0);
  return [&s, prefix = std::move(prefix), members, index, round](std::string_view mine) {
    const std::string stem = prefix + '/' + std::to_string((*round)++) + '/';
    s.set(stem + std::to_string(index), mine);
    std::vector<std::string> all(static_cast<std::size_t>(members));
    for (int m = 0; m < members; ++m)
      all[static_cast<std::size_t>(m)] = m == index ? std::string(mine) : s.get(stem + std::to_string(m));
    return all;
  };
}

}  // namespace pdcoll::bootstrap
