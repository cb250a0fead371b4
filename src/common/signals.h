// common/signals.h - how every Granary binary stops: SIGINT and SIGTERM are blocked in all threads
// and one thread waits for them with sigwait, so shutdown runs as ordinary code, not in a handler.
#pragma once

#include <csignal>

namespace granary {

// Call first in main, before any thread starts: threads inherit the blocked mask.
inline sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

}  // namespace granary
