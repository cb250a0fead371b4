// granary-bench trace --simulate: a trace's prefix hit rate under the master's own eviction
// policies, in seconds, with no node and no bytes. Each policy runs in the master's real state
// machine and evictor (MasterState + Evictor, in process): one segment of metadata sized to the
// capacity, a manual clock that follows the trace's arrival times, and per request what a store
// sees from an engine (trace_bench.cc does the same against real processes): one BatchExist of
// its blocks, a GetReplicaList + FinishRead of the hit prefix, a PutStart + PutEnd of the blocks
// that missed. A put that finds the segment full evicts and retries as the master's service does,
// and the housekeeping tick's watermark eviction runs every 100 ms of trace time.
// Next to them, two offline references computed here: belady (evicts the block whose next use
// is farthest, and admits nothing used later than all it holds: the optimum no online policy
// beats) and infinite (nothing is ever evicted).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "master/master_config.h"
#include "master/policy/evictor.h"
#include "master/state/master_state.h"
#include "tools/bench/bench.h"
#include "tools/bench/trace_file.h"
#include "tools/bench/trace_sim_disk.h"

namespace granary::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kHousekeepingTickMs = 100;  // master_server.cc's tick
constexpr uint64_t kNever = UINT64_MAX;

struct SimResult {
  std::string policy;
  uint64_t capacity_blocks = 0;
  uint64_t input_tokens = 0;
  uint64_t hit_tokens = 0;
  uint64_t hit_blocks = 0;
  uint64_t put_blocks = 0;
  uint64_t evicted = 0;       // objects evicted (master policies)
  uint64_t put_failures = 0;  // blocks that found no space even after eviction (not cached)
  SimDiskCounters disk;       // with a disk tier
  double seconds = 0;

  double hit_rate() const { return input_tokens ? double(hit_tokens) / input_tokens : 0; }
  void Count(const TraceRequest& r, size_t hit) {
    input_tokens += r.input_length;
    hit_tokens += HitTokens(r, hit);
    hit_blocks += hit;
  }
};

// A time in the trace's milliseconds, for `real_ms` of the store's own time at `speed`.
uint64_t TraceMs(int64_t real_ms, double speed) {
  return std::max<uint64_t>(1, static_cast<uint64_t>(real_ms * std::max(speed, 1.0)));
}

// disk: the SSD tier beside memory (nullptr: memory only). speed: the replay's pace, by which the
// store's periodic work (the master's housekeeping tick, the node's offload interval) is spaced
// in trace time.
SimResult SimulateMaster(const std::vector<TraceRequest>& trace, master::EvictionPolicy policy,
                         const std::string& name, uint64_t capacity_blocks, uint64_t block_bytes,
                         const SimDiskOptions* disk, double speed, int64_t offload_interval_ms) {
  SimResult result{name, capacity_blocks};
  master::MasterPolicy p;
  p.eviction_policy = policy;
  p.shard_count = 64;  // a few thousand objects: fewer, fuller shards scan faster
  ManualClock clock;
  master::MasterState state(p, &clock);
  master::Evictor evictor(&state);
  const uint64_t segment_bytes = capacity_blocks * master::OffsetAllocator::AllocationSize(block_bytes);
  auto mounted =
      state.Mount({"sim-node", {"sim-segment", segment_bytes, "127.0.0.1:1", "", "", 0, true}});
  if (!mounted.status.ok()) {
    std::fprintf(stderr, "granary-bench trace: %s\n", mounted.status.ToString().c_str());
    std::exit(1);
  }
  std::unique_ptr<SimDiskTier> tier;
  if (disk != nullptr) {
    tier = std::make_unique<SimDiskTier>(&state, "sim-node", *disk);
    if (Status s = tier->Register(); !s.ok()) {
      std::fprintf(stderr, "granary-bench trace: disk: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  const uint64_t tick_ms = TraceMs(kHousekeepingTickMs, disk ? speed : 1.0);
  const uint64_t offload_ms = TraceMs(offload_interval_ms, speed);
  const std::string client = "sim-engine";
  const auto start = Clock::now();
  uint64_t trace_ms = 0, last_tick_ms = 0, last_offload_ms = 0;
  for (const TraceRequest& r : trace) {
    if (r.timestamp_ms > trace_ms) {
      clock.Advance(std::chrono::milliseconds(r.timestamp_ms - trace_ms));
      trace_ms = r.timestamp_ms;
    }
    // Both due at once: the offload first, so that a watermark eviction can demote what the
    // round copied (in the store the two run on their own timers).
    if (tier && trace_ms - last_offload_ms >= offload_ms) {
      last_offload_ms = trace_ms;
      tier->OffloadInterval();
    }
    if (trace_ms - last_tick_ms >= tick_ms) {
      last_tick_ms = trace_ms;
      result.evicted += evictor.RunIfAboveWatermark().objects;
    }
    const size_t n = r.hash_ids.size();
    std::vector<std::string> keys;
    keys.reserve(n);
    for (uint64_t id : r.hash_ids) keys.push_back("trace/" + std::to_string(id));

    std::vector<int32_t> exists = state.BatchExist(keys);
    size_t prefix = 0;
    while (prefix < n && exists[prefix] == 1) ++prefix;
    size_t hit = 0;
    if (prefix > 0) {
      std::vector<std::string> got(keys.begin(), keys.begin() + prefix);
      auto read = state.GetReplicaList({client, got});
      while (hit < prefix && read[hit].status.ok()) ++hit;
      if (tier) tier->NoteReads(got, read, hit);
      state.FinishRead({client, std::move(got)});
    }
    for (size_t i = hit; i < prefix; ++i) exists[i] = 0;

    master::PutStartOp put{client, {}, {}, {}, false};
    for (size_t i = hit; i < n; ++i) {
      if (exists[i] == 1) continue;
      put.keys.push_back(keys[i]);
      put.sizes.push_back(block_bytes);
    }
    if (!put.keys.empty()) {
      auto started = state.PutStart(put);
      // A full segment evicts once and retries the keys that found no space (master_service.cc).
      master::PutStartOp retry{client, {}, {}, {}, false};
      std::vector<size_t> retried;
      for (size_t i = 0; i < started.size(); ++i) {
        if (started[i].status.code() != ErrorCode::NO_AVAILABLE_HANDLE) continue;
        retried.push_back(i);
        retry.keys.push_back(put.keys[i]);
        retry.sizes.push_back(block_bytes);
      }
      if (!retried.empty()) {
        const uint64_t one = master::OffsetAllocator::AllocationSize(block_bytes);
        result.evicted += evictor.EvictForAllocation(one * retried.size(), one).objects;
        auto again = state.PutStart(retry);
        for (size_t j = 0; j < retried.size(); ++j) started[retried[j]] = std::move(again[j]);
      }
      master::PutEndOp end{client, {}, {}, {}};
      for (size_t i = 0; i < started.size(); ++i) {
        if (!started[i].status.ok()) {
          result.put_failures++;
          continue;
        }
        end.keys.push_back(put.keys[i]);
        end.checksums.push_back(1);
        end.put_gens.push_back(started[i].put_gen);
      }
      result.put_blocks += end.keys.size();
      if (!end.keys.empty()) state.PutEnd(std::move(end));
    }
    result.Count(r, hit);
  }
  if (tier) result.disk = tier->counters();
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

// Belady's MIN for prefix hits: on a miss with the cache full, the block whose next request is
// farthest leaves, unless the new block's own next request is farther still (then it is not
// kept). Blocks of a request past its hit prefix that are cached stay, untouched, as in a store.
SimResult SimulateBelady(const std::vector<TraceRequest>& trace, uint64_t capacity_blocks) {
  SimResult result{"belady", capacity_blocks};
  const auto start = Clock::now();
  // next[r][i]: the index of the next request that holds block i of request r, or kNever.
  std::vector<std::vector<uint64_t>> next(trace.size());
  std::unordered_map<uint64_t, uint64_t> upcoming;
  for (size_t r = trace.size(); r-- > 0;) {
    next[r].resize(trace[r].hash_ids.size());
    for (size_t i = 0; i < trace[r].hash_ids.size(); ++i) {
      const uint64_t id = trace[r].hash_ids[i];
      auto found = upcoming.find(id);
      next[r][i] = found == upcoming.end() ? kNever : found->second;
    }
    for (uint64_t id : trace[r].hash_ids) upcoming[id] = r;
  }
  std::unordered_map<uint64_t, uint64_t> cached;    // id -> its next use
  std::priority_queue<std::pair<uint64_t, uint64_t>> farthest;  // (next use, id); stale ones skipped
  auto top = [&]() {
    while (!farthest.empty()) {
      auto [use, id] = farthest.top();
      auto found = cached.find(id);
      if (found != cached.end() && found->second == use) return true;
      farthest.pop();
    }
    return false;
  };
  for (size_t r = 0; r < trace.size(); ++r) {
    const auto& ids = trace[r].hash_ids;
    size_t hit = 0;
    while (hit < ids.size() && cached.contains(ids[hit])) ++hit;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto found = cached.find(ids[i]);
      if (found == cached.end()) continue;
      found->second = next[r][i];
      farthest.emplace(next[r][i], ids[i]);
    }
    for (size_t i = hit; i < ids.size(); ++i) {
      if (cached.contains(ids[i])) continue;
      if (cached.size() >= capacity_blocks) {
        if (capacity_blocks == 0 || !top() || farthest.top().first <= next[r][i]) continue;
        cached.erase(farthest.top().second);
        farthest.pop();
        result.evicted++;
      }
      cached.emplace(ids[i], next[r][i]);
      farthest.emplace(next[r][i], ids[i]);
      result.put_blocks++;
    }
    result.Count(trace[r], hit);
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

SimResult SimulateInfinite(const std::vector<TraceRequest>& trace) {
  SimResult result{"infinite", 0};
  std::unordered_set<uint64_t> cached;
  for (const TraceRequest& r : trace) {
    size_t hit = 0;
    while (hit < r.hash_ids.size() && cached.contains(r.hash_ids[hit])) ++hit;
    for (uint64_t id : r.hash_ids) result.put_blocks += cached.insert(id).second ? 1 : 0;
    result.Count(r, hit);
  }
  return result;
}

}  // namespace

int RunTraceSimulation(const TraceBenchOptions& o) {
  auto trace = LoadTrace(o.trace_path, o.limit);
  if (!trace.ok()) {
    std::fprintf(stderr, "granary-bench trace: %s\n", trace.status().ToString().c_str());
    return 2;
  }
  std::vector<std::string> policies = o.simulate;
  if (policies.size() == 1 && policies[0] == "all") {
    policies = {"lru", "s3fifo", "prefix", "belady", "infinite"};
  }
  const uint64_t block_bytes = kTokensPerBlock * o.bytes_per_token;
  std::printf("trace %s: %zu requests, simulated: the master's policies in its own state machine "
              "(no nodes, no bytes), blocks of %llu B\n",
              o.trace_path.c_str(), trace->size(), (unsigned long long)block_bytes);
  std::optional<SimDiskOptions> disk;
  if (o.disk_tokens > 0) {
    disk.emplace();
    disk->capacity_bytes = o.disk_tokens * o.bytes_per_token;  // as bench/disk.sh sizes the disk
    disk->lru_eviction = o.disk_eviction != "fifo";
    disk->copy_eviction = o.disk_eviction == "lru" && o.disk_backend == "bucket";
    disk->unit_max_keys = o.disk_backend == "bucket" ? disk::DiskStoreOptions{}.bucket_max_keys : 1;
    disk->unit_max_bytes = o.disk_bucket_bytes;
    disk->promote_after = o.promote_after;
    std::printf("with a disk tier of %llu tokens (%s, disk eviction %s), offload every %lld ms "
                "at %gx the trace's pace (belady: memory and disk as one cache)\n",
                (unsigned long long)o.disk_tokens, o.disk_backend.c_str(),
                o.disk_eviction.c_str(), (long long)o.offload_interval_ms, std::max(o.speed, 1.0));
  }
  std::printf("%-9s %12s %9s %10s %10s %10s %9s %8s %8s\n", "policy", "capacity", "hit rate",
              "of belady", "hit blks", "put blks", "evicted", "no space", "wall s");
  nlohmann::json json = nlohmann::json::array();
  for (uint64_t tokens : o.capacity_tokens) {
    const uint64_t blocks = tokens / kTokensPerBlock;
    const uint64_t belady_blocks = (tokens + (disk ? o.disk_tokens : 0)) / kTokensPerBlock;
    std::vector<SimResult> results;
    for (const std::string& policy : policies) {
      if (policy == "belady") {
        results.push_back(SimulateBelady(*trace, belady_blocks));
      } else if (policy == "infinite") {
        results.push_back(SimulateInfinite(*trace));
      } else {
        master::MasterConfig config;  // the master's own reading of --eviction-policy
        config.eviction_policy = policy;
        results.push_back(SimulateMaster(*trace, config.EffectivePolicy().eviction_policy, policy,
                                         blocks, block_bytes, disk ? &*disk : nullptr, o.speed,
                                         o.offload_interval_ms));
      }
    }
    // Belady's figure is computed even when not asked for: every row reads as a share of it.
    double belady = 0;
    for (const auto& r : results) {
      if (r.policy == "belady") belady = r.hit_rate();
    }
    if (belady == 0) belady = SimulateBelady(*trace, belady_blocks).hit_rate();
    for (const auto& r : results) {
      const double share = belady > 0 ? r.hit_rate() / belady : 0;
      std::printf("%-9s %12s %9.4f %9.0f%% %10llu %10llu %9llu %8llu %8.2f\n", r.policy.c_str(),
                  (std::to_string(tokens / 1000) + "k tok").c_str(), r.hit_rate(), share * 100,
                  (unsigned long long)r.hit_blocks, (unsigned long long)r.put_blocks,
                  (unsigned long long)r.evicted, (unsigned long long)r.put_failures, r.seconds);
      if (disk && r.disk.rounds > 0) {
        std::printf("%-9s %12s   disk: %llu offloaded, %llu evicted from disk, %llu read from "
                    "disk, %llu promoted, %llu lost\n", "", "",
                    (unsigned long long)r.disk.offloaded, (unsigned long long)r.disk.disk_evicted,
                    (unsigned long long)r.disk.disk_reads, (unsigned long long)r.disk.promoted,
                    (unsigned long long)r.disk.lost);
      }
      json.push_back({{"trace", o.trace_path},
                      {"label", o.label},
                      {"policy", r.policy},
                      {"capacity_tokens", tokens},
                      {"capacity_blocks", blocks},
                      {"requests", trace->size()},
                      {"hit_rate", r.hit_rate()},
                      {"of_belady", share},
                      {"belady_hit_rate", belady},
                      {"hit_blocks", r.hit_blocks},
                      {"put_blocks", r.put_blocks},
                      {"evicted", r.evicted},
                      {"put_failures", r.put_failures},
                      {"disk_tokens", disk ? o.disk_tokens : 0},
                      {"disk_offloaded", r.disk.offloaded},
                      {"disk_evicted", r.disk.disk_evicted},
                      {"disk_reads", r.disk.disk_reads},
                      {"disk_promoted", r.disk.promoted},
                      {"disk_lost", r.disk.lost},
                      {"seconds", r.seconds}});
    }
  }
  if (!o.json_path.empty()) std::ofstream(o.json_path) << json.dump(2) << "\n";
  return 0;
}

}  // namespace granary::bench
