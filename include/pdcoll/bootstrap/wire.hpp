// File: bootstrap/wire.hpp — the rendezvous store's wire format: message
// types, their encoding, and an incremental frame reader that validates
// every length before trusting it. No sockets here, so the fuzzer and the
// unit tests drive it with plain bytes.
//
// A frame is a 4-byte little-endian body length (1 .. limits::max_frame)
// followed by the body: one type byte, then the type's fields in order.
// Field encodings: u8; u32 (little-endian); short bytes (u16 length + bytes:
// tokens, keys, messages); long bytes (u32 length + bytes: values). A body
// with bytes left over after its last field is malformed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "pdcoll/error.hpp"

namespace pdcoll::bootstrap {

/// Bounds every message must respect; anything beyond them closes the connection.
struct limits {
  std::size_t max_token = 256;          ///< bytes in a HELLO token
  std::size_t max_key = 256;            ///< bytes in a key
  std::size_t max_value = 64 * 1024;    ///< bytes in a value or an all_gather contribution
  std::size_t max_frame = 1024 * 1024;  ///< bytes in one frame body
  std::size_t max_world_size = 65536;   ///< ranks a store serves
};

/// Message types. Client → server below 64, server → client from 64.
enum class message_type : std::uint8_t {
  hello = 1,         ///< token, rank, world_size: must be a client's first message
  set = 2,           ///< key, value → ok
  get = 3,           ///< key → value, once the key is set
  wait = 4,          ///< key → ready, once the key is set
  collect = 5,       ///< round, kind, value → part × world_size (gather) or done (barrier)
  status = 6,        ///< round → status_reply: who has not arrived in that round
  erase = 7,         ///< key prefix → ok, once every key that starts with it is removed
  welcome = 64,      ///< HELLO accepted
  error = 65,        ///< code (pdcoll::errc), text; the server closes fatal ones' connection
  ok = 66,           ///< SET stored
  value = 67,        ///< key, value
  ready = 68,        ///< key
  part = 69,         ///< round, rank, value: one rank's all_gather contribution
  done = 70,         ///< round: every rank reached the barrier
  status_reply = 71, ///< round, state, missing ranks with why
};

/// The two collectives a round can be.
enum class collect_kind : std::uint8_t { all_gather = 0, barrier = 1 };

/// Where a rank that has not arrived in a round is (status_reply).
enum class absence : std::uint8_t {
  connected = 0,        ///< connected, but has not reached this round
  never_connected = 1,  ///< never said HELLO
  departed = 2,         ///< said HELLO, then closed its connection
};

/// State of a round in a status_reply.
enum class round_state : std::uint8_t { open = 0, completed = 1, not_started = 2 };

/// One decoded message. A flat record: each type uses the fields its
/// comment in message_type lists and leaves the others empty.
struct message {
  message_type type{};  ///< what the message asks or answers
  std::string token;        ///< hello
  std::string key;          ///< set, get, wait, value, ready
  std::string value;        ///< set, collect, value, part
  std::string text;         ///< error
  std::uint32_t rank = 0;   ///< hello, part
  std::uint32_t world_size = 0;  ///< hello
  std::uint32_t round = 0;  ///< collect, status, part, done, status_reply
  std::uint32_t code = 0;   ///< error: a pdcoll::errc value
  collect_kind kind{};      ///< collect
  round_state state{};      ///< status_reply
  std::vector<std::pair<std::uint32_t, absence>> missing;  ///< status_reply
};

namespace detail {

inline void put_u8(std::string& out, std::uint8_t v) { out.push_back(static_cast<char>(v)); }
inline void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void put_short(std::string& out, std::string_view s) {
  out.push_back(static_cast<char>(s.size() & 0xff));
  out.push_back(static_cast<char>((s.size() >> 8) & 0xff));
  out.append(s);
}
inline void put_long(std::string& out, std::string_view s) {
  put_u32(out, static_cast<std::uint32_t>(s.size()));
  out.append(s);
}

/// Bounds-checked reader over one frame body; every get_* fails softly.
class body_reader {
 public:
  explicit body_reader(std::string_view body) : rest_(body) {}
  bool get_u8(std::uint8_t& v) {
    if (rest_.empty()) return false;
    v = static_cast<std::uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return true;
  }
  bool get_u32(std::uint32_t& v) {
    if (rest_.size() < 4) return false;
    v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(rest_[static_cast<std::size_t>(i)]);
    rest_.remove_prefix(4);
    return true;
  }
  bool get_bytes(std::string& out, std::size_t length) {
    if (rest_.size() < length) return false;
    out.assign(rest_.substr(0, length));
    rest_.remove_prefix(length);
    return true;
  }
  bool get_short(std::string& out, std::size_t max) {
    if (rest_.size() < 2) return false;
    std::size_t length = static_cast<std::uint8_t>(rest_[0]) | (static_cast<std::size_t>(static_cast<std::uint8_t>(rest_[1])) << 8);
    rest_.remove_prefix(2);
    return length <= max && get_bytes(out, length);
  }
  bool get_long(std::string& out, std::size_t max) {
    std::uint32_t length = 0;
    return get_u32(length) && length <= max && get_bytes(out, length);
  }
  bool at_end() const noexcept { return rest_.empty(); }

 private:
  std::string_view rest_;
};

}  // namespace detail

/// Appends `m` as one frame to `out`. The caller keeps fields within
/// `limits` (the store validates before encoding). Cost: one append.
inline void encode(const message& m, std::string& out) {
  using namespace detail;
  const std::size_t start = out.size();
  put_u32(out, 0);  // patched below once the body length is known
  put_u8(out, static_cast<std::uint8_t>(m.type));
  switch (m.type) {
    case message_type::hello: put_short(out, m.token); put_u32(out, m.rank); put_u32(out, m.world_size); break;
    case message_type::set: put_short(out, m.key); put_long(out, m.value); break;
    case message_type::get:
    case message_type::wait:
    case message_type::erase:
    case message_type::ready: put_short(out, m.key); break;
    case message_type::collect: put_u32(out, m.round); put_u8(out, static_cast<std::uint8_t>(m.kind)); put_long(out, m.value); break;
    case message_type::status:
    case message_type::done: put_u32(out, m.round); break;
    case message_type::welcome:
    case message_type::ok: break;
    case message_type::error: put_u32(out, m.code); put_short(out, m.text); break;
    case message_type::value: put_short(out, m.key); put_long(out, m.value); break;
    case message_type::part: put_u32(out, m.round); put_u32(out, m.rank); put_long(out, m.value); break;
    case message_type::status_reply:
      put_u32(out, m.round);
      put_u8(out, static_cast<std::uint8_t>(m.state));
      put_u32(out, static_cast<std::uint32_t>(m.missing.size()));
      for (const auto& [rank, why] : m.missing) { put_u32(out, rank); put_u8(out, static_cast<std::uint8_t>(why)); }
      break;
  }
  const auto body = static_cast<std::uint32_t>(out.size() - start - 4);
  for (int i = 0; i < 4; ++i) out[start + static_cast<std::size_t>(i)] = static_cast<char>((body >> (8 * i)) & 0xff);
}

/// Encodes `m` as one frame.
inline std::string encode(const message& m) {
  std::string out;
  encode(m, out);
  return out;
}

/// Decodes one frame body (without its length prefix).
/// Errors: returns false and sets `why` when the type is unknown, a field is
/// truncated or over its limit, an enum is out of range, or bytes are left over.
inline bool decode_body(std::string_view body, const limits& lim, message& m, std::string& why) {
  detail::body_reader r{body};
  std::uint8_t type = 0;
  if (!r.get_u8(type)) { why = "empty frame"; return false; }
  m = message{};
  m.type = static_cast<message_type>(type);
  bool ok = false;
  std::uint8_t small = 0;
  switch (m.type) {
    case message_type::hello: ok = r.get_short(m.token, lim.max_token) && r.get_u32(m.rank) && r.get_u32(m.world_size); break;
    case message_type::set:
    case message_type::value: ok = r.get_short(m.key, lim.max_key) && r.get_long(m.value, lim.max_value); break;
    case message_type::get:
    case message_type::wait:
    case message_type::erase:
    case message_type::ready: ok = r.get_short(m.key, lim.max_key); break;
    case message_type::collect:
      ok = r.get_u32(m.round) && r.get_u8(small) && small <= 1 && r.get_long(m.value, lim.max_value);
      m.kind = static_cast<collect_kind>(small);
      break;
    case message_type::status:
    case message_type::done: ok = r.get_u32(m.round); break;
    case message_type::welcome:
    case message_type::ok: ok = true; break;
    case message_type::error: ok = r.get_u32(m.code) && r.get_short(m.text, 4096); break;
    case message_type::part: ok = r.get_u32(m.round) && r.get_u32(m.rank) && r.get_long(m.value, lim.max_value); break;
    case message_type::status_reply: {
      std::uint32_t count = 0;
      ok = r.get_u32(m.round) && r.get_u8(small) && small <= 2 && r.get_u32(count) && count <= lim.max_world_size;
      m.state = static_cast<round_state>(small);
      for (std::uint32_t i = 0; ok && i < count; ++i) {
        std::uint32_t rank = 0;
        std::uint8_t why_byte = 0;
        ok = r.get_u32(rank) && r.get_u8(why_byte) && why_byte <= 2;
        if (ok) m.missing.emplace_back(rank, static_cast<absence>(why_byte));
      }
      break;
    }
    default: why = "unknown message type " + std::to_string(type); return false;
  }
  if (!ok) { why = "truncated or over-limit fields in message type " + std::to_string(type); return false; }
  if (!r.at_end()) { why = "trailing bytes after message type " + std::to_string(type); return false; }
  if ((m.type == message_type::set || m.type == message_type::get || m.type == message_type::wait) && m.key.empty()) {
    why = "empty key";
    return false;
  }
  return true;
}

/// Splits a byte stream into frames, validating each length prefix before
/// buffering the body, so a hostile length never makes it allocate more
/// than max_frame. Cost: the unread tail of the stream is buffered once.
class frame_reader {
 public:
  /// What next() found.
  enum class status { need_more, frame, error };

  /// A reader enforcing `lim` on every frame.
  explicit frame_reader(limits lim = {}) : limits_(lim) {}

  /// Applies `lim` from the next frame on (the store widens a connection's
  /// limits once it has said HELLO).
  void set_limits(limits lim) noexcept { limits_ = lim; }

  /// Appends received bytes.
  void feed(std::string_view bytes) { buffer_.append(bytes); }

  /// Extracts the next complete message into `out`. On `error`, `why` says
  /// what was wrong and the stream is unusable (the caller closes it).
  status next(message& out, std::string& why) {
    if (failed_) { why = "stream already failed"; return status::error; }
    if (buffer_.size() - offset_ < 4) { compact(); return status::need_more; }
    std::uint32_t length = 0;
    for (int i = 3; i >= 0; --i) length = (length << 8) | static_cast<std::uint8_t>(buffer_[offset_ + static_cast<std::size_t>(i)]);
    if (length == 0 || length > limits_.max_frame) {
      failed_ = true;
      why = "frame length " + std::to_string(length) + " outside [1, " + std::to_string(limits_.max_frame) + "]";
      return status::error;
    }
    if (buffer_.size() - offset_ - 4 < length) { compact(); return status::need_more; }
    std::string_view body{buffer_.data() + offset_ + 4, length};
    offset_ += 4 + length;
    if (!decode_body(body, limits_, out, why)) { failed_ = true; return status::error; }
    return status::frame;
  }

  /// Bytes received but not yet consumed as frames.
  std::size_t buffered() const noexcept { return buffer_.size() - offset_; }

 private:
  void compact() {
    if (offset_ == 0) return;
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
  limits limits_;
  std::string buffer_;
  std::size_t offset_ = 0;
  bool failed_ = false;
};

}  // namespace pdcoll::bootstrap
