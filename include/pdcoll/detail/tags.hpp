// File: detail/tags.hpp — how pdcoll lays out the 64-bit transport tag.
//
//   63      reserved for the transport (libfabric's split-message protocol)
//   62..61  class: collective data, user point-to-point, control
//   60..40  collective sequence number (wraps; ranks issue collectives in order)
//   39..24  signature of the collective (kind, count, type, op, root)
//   23..0   message index inside the collective
//
// Receives ignore the signature bits and check them on completion: a message
// of another collective or count completes the receive with
// errc::collective_mismatch instead of silently matching wrong data.
#pragma once

#include <cstdint>

namespace pdcoll::detail {

/// The three kinds of traffic that share one endpoint.
enum class tag_class : std::uint64_t { collective = 0, point_to_point = 1, control = 2 };

inline constexpr int tag_class_shift = 61;
inline constexpr int tag_seq_shift = 40;
inline constexpr int tag_signature_shift = 24;
inline constexpr std::uint64_t tag_seq_mask = (std::uint64_t{1} << 21) - 1;
inline constexpr std::uint64_t tag_signature_mask = 0xffff;
inline constexpr std::uint64_t tag_index_mask = (std::uint64_t{1} << 24) - 1;
/// The largest message index an algorithm may use: bits 22 and 23 of the
/// index carry a staged chunk's slot (staging.hpp). A collective whose
/// algorithm numbers more messages (a chunk of a few bytes over gigabytes)
/// fails with errc::invalid_argument rather than reuse another's tags.
inline constexpr std::uint32_t max_message_index = (std::uint32_t{1} << 22) - 1;
/// Message index of a collective's signature check (collective_operation.hpp):
/// above every algorithm's and staging slot's indices.
inline constexpr std::uint32_t signature_check_index = static_cast<std::uint32_t>(tag_index_mask);
/// The bits a collective receive ignores (then checks itself).
inline constexpr std::uint64_t tag_signature_bits = tag_signature_mask << tag_signature_shift;

/// Tag of message `index` of collective `seq` with `signature`.
constexpr std::uint64_t collective_tag(std::uint64_t seq, std::uint16_t signature, std::uint64_t index) noexcept {
  return (static_cast<std::uint64_t>(tag_class::collective) << tag_class_shift) |
         ((seq & tag_seq_mask) << tag_seq_shift) |
         (static_cast<std::uint64_t>(signature) << tag_signature_shift) | (index & tag_index_mask);
}

/// The signature bits carried by a tag.
constexpr std::uint16_t tag_signature(std::uint64_t tag) noexcept {
  return static_cast<std::uint16_t>((tag >> tag_signature_shift) & tag_signature_mask);
}

/// Tag of a user point-to-point message with user tag `user_tag`.
constexpr std::uint64_t point_to_point_tag(std::uint32_t user_tag) noexcept {
  return (static_cast<std::uint64_t>(tag_class::point_to_point) << tag_class_shift) | user_tag;
}

/// Tag of control traffic (abort notices).
constexpr std::uint64_t control_tag() noexcept {
  return static_cast<std::uint64_t>(tag_class::control) << tag_class_shift;
}

/// A 64-bit finaliser (SplitMix64's): every input bit reaches every output bit.
constexpr std::uint64_t mix_bits(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// 16-bit signature of a collective: the count, scrambled by an odd
/// multiplier, xor-ed with the other fields packed into one word, and the
/// sum mixed once (three multiplies: it is computed on every collective's
/// start; mixing three words one after the other was 4 % of an 8-byte
/// all-reduce's instructions). Either word alone maps one-to-one to the
/// mixed value, so changing one field changes the signature but for the
/// 2^-16 chance of a collision in the fold to 16 bits.
constexpr std::uint16_t collective_signature(std::uint32_t kind, std::uint64_t count, std::uint32_t type,
                                             std::uint32_t op, std::int32_t root) noexcept {
  // kind < 2^8 and type < 2^8 in practice; the op's id may use its 32 bits
  // (user ops), which then share bits with the type and kind: those fields
  // still reach the word one-to-one when the others stay fixed.
  const std::uint64_t fields = (static_cast<std::uint64_t>(kind) << 56) ^ (static_cast<std::uint64_t>(type) << 48) ^
                               (static_cast<std::uint64_t>(op) << 32) ^ static_cast<std::uint32_t>(root);
  const std::uint64_t h = mix_bits((count * 0x9e3779b97f4a7c15ull) ^ fields);
  return static_cast<std::uint16_t>(h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48));
}

}  // namespace pdcoll::detail
