// File: pdcoll.hpp — the whole public surface of pdcoll in one include.
#pragma once

#include <pdcoll/collectives.hpp>
#include <pdcoll/communicator.hpp>
#include <pdcoll/error.hpp>
#include <pdcoll/exec/exec.hpp>
#include <pdcoll/group.hpp>
#include <pdcoll/memory/domains.hpp>
#include <pdcoll/memory/track.hpp>
#include <pdcoll/memory/view.hpp>
#include <pdcoll/point_to_point.hpp>
#include <pdcoll/reduce/data_type.hpp>
#include <pdcoll/reduce/half.hpp>
#include <pdcoll/reduce/ops.hpp>
#include <pdcoll/transport/inproc.hpp>
#include <pdcoll/job.hpp>
