// etcd/watch.h - Watch over one Watch stream per watch (see etcd_client.h).
//
// Promise: StartWatchStream returns once etcd has created the watch (so every change after the
// call is seen), or the error that prevented it, within the client's timeout. Then one thread
// reads the stream and hands each batch of events to on_events, in revision order, each event
// once. When the stream fails the thread re-creates the watch from the revision after the last
// one delivered, retrying (with backoff) for up to the client's timeout from the failure; when
// that fails, or etcd cancels the watch (it compacted the revisions wanted, or refused it),
// on_error runs once and the thread ends. No callback runs once the destructor has returned.
// Ownership: the thread and its stream share one state object with the Watch, so a Watch may
// even be destroyed from its own callback (the thread then finishes on its own, calling nothing).
// Thread safety: callbacks run on the watch's thread, one at a time.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "etcd/etcd_client.h"
#include "etcd/etcd_internal.h"

namespace granary::etcd {

struct WatchSpec {
  std::string key;
  std::string range_end;  // empty: the key alone
  int64_t start_revision = 0;
};

// auth: the client's (null: none); each stream is opened with a token etcd has not refused.
Result<std::unique_ptr<Watch>> StartWatchStream(std::shared_ptr<grpc::Channel> channel,
                                                std::shared_ptr<EtcdAuth> auth,
                                                WatchSpec spec, int timeout_ms,
                                                EtcdClient::WatchCallback on_events,
                                                std::function<void(Status)> on_error);

}  // namespace granary::etcd
