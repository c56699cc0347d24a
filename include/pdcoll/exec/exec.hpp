// File: exec/exec.hpp — pdcoll's sender/receiver core in one include: the
// vocabulary, stop tokens, run_loop (with the progress-driver hook) and the
// algorithms.
#pragma once

#include "pdcoll/exec/vocabulary.hpp"
#include "pdcoll/exec/stop_token.hpp"
#include "pdcoll/exec/run_loop.hpp"
#include "pdcoll/exec/just.hpp"
#include "pdcoll/exec/then.hpp"
#include "pdcoll/exec/upon_error.hpp"
#include "pdcoll/exec/upon_stopped.hpp"
#include "pdcoll/exec/let_value.hpp"
#include "pdcoll/exec/let_error.hpp"
#include "pdcoll/exec/when_all.hpp"
#include "pdcoll/exec/with_deadline.hpp"
#include "pdcoll/exec/sync_wait.hpp"
#include "pdcoll/exec/start_detached.hpp"
