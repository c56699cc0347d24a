// File: bootstrap/split.hpp — splitting a job's ranks into sub-groups: who
// belongs to which (MPI_Comm_split's and ncclCommSplit's rule), and the
// address exchange a sub-group's transport endpoint runs through the job's
// rendezvous store.
//
// job::split gathers every rank's (color, key) with one store all_gather, so
// every rank computes the same membership. A sub-group's endpoint then sets
// up through a group_rendezvous: keyed SETs and GETs under a prefix of its
// own, so sub-groups whose transports need different numbers of exchange
// rounds (shm on one host, tcp across hosts) never wait for each other.
#pragma once

#include <pdcoll/bootstrap/store.hpp>
#include <pdcoll/error.hpp>
#include <pdcoll/transport/endpoint.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pdcoll::bootstrap {

/// The color that leaves a rank out of every sub-group of a split (MPI's
/// MPI_UNDEFINED, NCCL's NCCL_SPLIT_NOCOLOR).
inline constexpr int no_color = -1;

/// One rank's part in a split: ranks of equal color form a sub-group, ordered
/// by key, ties broken by rank in the group being split (the job, or a group).
struct split_request {
  int color = no_color;  ///< sub-group to join, >= 0; no_color joins none
  int key = 0;           ///< order within the sub-group
  /// What every rank must agree on besides the colors (job::new_group puts a
  /// digest of its rank list here); compared across ranks, never interpreted.
  std::uint64_t agreement = 0;
  /// False when this rank's arguments were refused: it still takes part in
  /// the exchange, so that every rank fails the split together and stays in
  /// step with the store.
  bool valid = true;
};

/// `request` as this rank's all_gather contribution.
inline std::string encode(const split_request& request) {
  return std::to_string(request.valid ? 1 : 0) + ' ' + std::to_string(request.color) + ' ' +
         std::to_string(request.key) + ' ' + std::to_string(request.agreement);
}

/// Parses a contribution made by encode(). Throws errc::protocol on anything else.
inline split_request decode_split_request(std::string_view text) {
  split_request r;
  int valid = -1;
  const char* at = text.data();
  const char* end = text.data() + text.size();
  auto field = [&](auto& value) {
    auto [next, ec] = std::from_chars(at, end, value);
    if (ec != std::errc{}) return false;
    at = next;
    return true;
  };
  auto space = [&] { return at != end && *at++ == ' '; };
  if (!(field(valid) && (valid == 0 || valid == 1) && space() && field(r.color) && space() && field(r.key) &&
        space() && field(r.agreement) && at == end))
    detail::throw_error(errc::protocol, "malformed split request '" + std::string(text) + "'");
  r.valid = valid == 1;
  return r;
}

/// The ranks of `rank`'s sub-group (indices into `requests`: ranks in the
/// job or group being split), in sub-group rank order: every rank whose
/// color equals `rank`'s, sorted by key and then by index. Empty when
/// `rank`'s color is no_color.
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

/// The address exchange of one sub-group's transport endpoint, run through
/// the job's store: each round (each call of exchange()'s function) sets
/// `<prefix>/<round>/<index>` to this rank's contribution and gets every
/// member's, so it returns once all members made the same call. `prefix`
/// must name this sub-group uniquely in the job (job::split uses the split's
/// number and the color). Cost per round: one SET and `members` GETs, each a
/// round trip to the store, each bounded by the store's deadline.
///
/// A member whose setup fails calls fail(): the members waiting for its next
/// round get its reason at once (errc::bootstrap) instead of waiting out the
/// store's deadline, which would leave the job's store broken for good. The
/// members that succeed call conclude(), a last round in which a failure
/// after the exchanges (a connect, the communicator) reaches them too.
/// The store must outlive this object, which must outlive the exchange, and
/// not be used meanwhile by another thread.
class group_rendezvous {
 public:
  /// This rank is member `index` of `members`.
  group_rendezvous(store& s, std::string prefix, int members, int index)
      : store_(s), prefix_(std::move(prefix)), members_(members), index_(index) {}

  /// The address_exchange to hand the transport.
  transport::address_exchange exchange() {
    return [this](std::string_view mine) { return round(mine); };
  }

  /// The closing round, once this rank's endpoint and communicator are
  /// built: returns when every member's are, and throws errc::bootstrap
  /// naming a member that failed instead, so either every member keeps the
  /// group or none does.
  void conclude() { (void)round({}); }

  /// Tells the members this rank fails with `why`: sets its next round's key
  /// (an exchange round, or the closing one) to a failure notice. Never
  /// throws (the store may be what failed).
  void fail(std::string_view why) noexcept {
    try {
      store_.set(key(next_round_, index_), std::string(1, failed_tag) + std::string(why));
    } catch (...) {
    }
  }

  /// The key of member `member`'s contribution to `round`.
  std::string key(std::uint32_t round, int member) const {
    return prefix_ + '/' + std::to_string(round) + '/' + std::to_string(member);
  }

 private:
  // Every value starts with a tag, so a transport address (any bytes) is
  // never mistaken for a failure notice.
  static constexpr char value_tag = 'v';
  static constexpr char failed_tag = 'x';

  std::vector<std::string> round(std::string_view mine) {
    const std::uint32_t r = next_round_;
    store_.set(key(r, index_), std::string(1, value_tag) + std::string(mine));
    ++next_round_;  // only once set: a failure notice goes where the members wait
    std::vector<std::string> all(static_cast<std::size_t>(members_));
    for (int m = 0; m < members_; ++m) {
      if (m == index_) {
        all[static_cast<std::size_t>(m)] = mine;
        continue;
      }
      std::string value = store_.get(key(r, m));
      if (value.empty() || value[0] != value_tag)
        detail::throw_error(errc::bootstrap, "group member " + std::to_string(m) + " failed to set up" +
                                                 (value.empty() ? std::string() : ": " + value.substr(1)));
      all[static_cast<std::size_t>(m)] = value.substr(1);
    }
    return all;
  }

  store& store_;
  std::string prefix_;
  int members_;
  int index_;
  std::uint32_t next_round_ = 0;
};

}  // namespace pdcoll::bootstrap
