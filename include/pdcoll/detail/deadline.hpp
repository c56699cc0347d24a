// File: detail/deadline.hpp — deadlines from timeouts without overflow.
//
// A timeout is "this long from now"; the library turns it into a time point
// to compare clocks against. `now + timeout` overflows for the timeouts
// users write to mean "no deadline" (milliseconds::max(), hours::max(), a
// PDCOLL_TIMEOUT_MS of 2^63 - 1): the nanosecond ticks wrap to the past and
// the wait ends at once. These helpers saturate instead.
#pragma once

#include <chrono>
#include <ratio>

namespace pdcoll::detail {

/// `now + timeout`, saturated at the clock's ends: a deadline past the
/// clock's last tick is that tick (never reached), one before its first is
/// the first (already passed).
template <class Clock, class Duration, class Rep, class Period>
constexpr std::chrono::time_point<Clock, Duration> deadline_after(std::chrono::time_point<Clock, Duration> now,
                                                                  std::chrono::duration<Rep, Period> timeout) noexcept {
  using point = std::chrono::time_point<Clock, Duration>;
  using seconds = std::chrono::duration<long double>;
  // Every real timeout: below a century from a clock short of its last
  // century, in plain integer ticks (collectives start here on every call).
  // (Periods from nanoseconds to hours and clocks of nanoseconds to
  // seconds, so that neither the comparison nor the casts can overflow.)
  if constexpr (std::chrono::treat_as_floating_point_v<Rep> == false &&
                std::ratio_greater_equal_v<Period, std::nano> && std::ratio_less_equal_v<Period, std::ratio<3600>> &&
                std::ratio_greater_equal_v<typename Duration::period, std::nano> &&
                std::ratio_less_equal_v<typename Duration::period, std::ratio<1>>) {
    constexpr std::chrono::hours century{24 * 366 * 100};
    if (timeout >= timeout.zero() && timeout <= century && now.time_since_epoch() >= Duration::zero() &&
        now.time_since_epoch() <= Duration::max() - std::chrono::duration_cast<Duration>(century))
      return now + std::chrono::duration_cast<Duration>(timeout);
  }
  // Otherwise in long double seconds, a second short of each end so the
  // cast below cannot round past it; the timeout must also fit the clock's
  // duration by itself.
  const long double wanted = seconds(timeout).count();
  const long double from_now = seconds(now.time_since_epoch()).count();
  const long double top = seconds(Duration::max()).count(), bottom = seconds(Duration::min()).count();
  if (wanted >= (from_now > 0 ? top - from_now : top) - 1.0L) return point::max();
  if (wanted <= (from_now < 0 ? bottom - from_now : bottom) + 1.0L) return point::min();
  return now + std::chrono::duration_cast<Duration>(timeout);
}

/// `2 * timeout`, saturated at the duration's largest value (a wait given
/// twice the job's timeout, where that timeout already means "no deadline").
template <class Rep, class Period>
constexpr std::chrono::duration<Rep, Period> twice(std::chrono::duration<Rep, Period> timeout) noexcept {
  using duration = std::chrono::duration<Rep, Period>;
  if (timeout > duration::max() / 2) return duration::max();
  if (timeout < duration::min() / 2) return duration::min();
  return 2 * timeout;
}

}  // namespace pdcoll::detail
