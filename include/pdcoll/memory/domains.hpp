// File: memory/domains.hpp — every memory domain pdcoll has: host,
// emulated_device, and gaudi where the habanalabs uAPI header is installed
// (PDCOLL_HAS_GAUDI is then defined to 1).
#pragma once

#include <pdcoll/memory/device_buffer.hpp>
#include <pdcoll/memory/domain.hpp>
#include <pdcoll/memory/emulated_device.hpp>
#include <pdcoll/memory/host.hpp>
#include <pdcoll/memory/view.hpp>

#if __has_include(<drm/habanalabs_accel.h>) || __has_include(<misc/habanalabs.h>)
#include <pdcoll/memory/gaudi.hpp>
#define PDCOLL_HAS_GAUDI 1
#endif
