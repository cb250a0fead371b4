// tools/bench/kv_target.h - one key-value store as `granary-bench kv` sees it: put a value, get
// it into the caller's buffer, drop what the run wrote. Granary (shm or TCP), Redis, memcached.
//
// Ownership: a target owns one connection (or one Granary Client); the caller's buffers stay the
// caller's. Thread safety: none; the benchmark gives every client thread its own target.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "granary/client.h"
#include "granary/status.h"

namespace granary::bench {

class KvTarget {
 public:
  virtual ~KvTarget() = default;
  virtual Status Put(const std::string& key, ByteSpan value) = 0;
  // Reads the value of key into buffer and returns its size; OBJECT_NOT_FOUND on a miss.
  virtual Result<uint64_t> GetInto(const std::string& key, MutableByteSpan buffer) = 0;
  // Removes the keys prefix+"0" .. prefix+(count-1), so memory stays bounded between cases.
  virtual Status Clear(const std::string& prefix, uint64_t count) = 0;
  // Waits (at most timeout_s) until the target's background warm-up of shared memory is done;
  // what it populated and how long populating took. Zeros for targets that warm nothing.
  struct Warmup {
    uint64_t bytes = 0;
    double seconds = 0;
    bool done = true;
  };
  virtual Warmup WaitWarm(double /*timeout_s*/) { return {}; }
};

// shm=false turns the same-host shared-memory path off: every byte crosses TCP to the node.
// warm=false leaves the client's new mappings cold (ClientOptions::warm_shared_memory).
// location_cache_ms < 0 keeps the client's default (ClientOptions::location_cache_ms).
Result<std::unique_ptr<KvTarget>> ConnectGranary(const std::string& master, bool shm,
                                                 bool warm = true, int64_t location_cache_ms = -1);
// address is HOST:PORT; SET/GET in RESP over one socket, values read straight into the buffer.
Result<std::unique_ptr<KvTarget>> ConnectRedis(const std::string& address);
// address is HOST:PORT; the text protocol over one socket, values read straight into the buffer.
Result<std::unique_ptr<KvTarget>> ConnectMemcached(const std::string& address);

}  // namespace granary::bench
