// tools/cli/top.h - `granary top`: the store's figures, refreshed like top(1).
//
// Promise: one sample every interval_s (ListSegments and ClusterStatus over gRPC, counters from
// the master's HTTP /metrics), rendered by top_view.h. On a terminal (and without `batch`) the
// screen is redrawn in place until 'q', Ctrl-C or `iterations` frames, and the terminal is given
// back as it was; otherwise frames are printed one after another, a blank line between them. A
// master that does not answer is shown as an error line and asked again at the next tick; the
// exit code is then 3 once `iterations` frames are done (0 when every sample succeeded, or when
// the user quit).
// Ownership: RunTop owns its client and the terminal's settings while it runs.
// Thread safety: one call at a time per process (it installs SIGINT and SIGTERM handlers).
#pragma once

#include <cstdint>
#include <string>

#include "granary/client.h"

namespace granary::top {

struct TopOptions {
  ClientOptions client;
  // HOST:PORT of the master's HTTP server (/metrics); empty: the host of the master's gRPC
  // address (the leader's, with etcd://) and port 9003, the master's default --http-port.
  std::string http;
  double interval_s = 2;
  uint64_t iterations = 0;  // frames to show; 0: until 'q' or Ctrl-C
  bool batch = false;       // plain frames even on a terminal
};

// Runs the view; returns the process's exit code (0, 2 for bad options, 3 as above).
int RunTop(const TopOptions& options);

}  // namespace granary::top
