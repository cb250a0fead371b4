// granary-bench trace: replays a conversation trace (Mooncake's FAST'25 trace, JSON lines) against
// a running store and reports the prefix hit rate the store's own eviction achieves.
//
// Per request, in trace order: as fast as the store answers (arrival times ignored), or with
// --speed X not before its arrival time divided by X (at a paced rate the node's offload keeps
// up as it would in service; flat out, offload bandwidth bounds the disk tier's hit rate):
// one batch existence check (or PrefixMatch) of its blocks, a
// BatchGetInto of the hit prefix with every byte verified, a BatchPut of the blocks that missed.
// Block i is object "<prefix>/<hash id>" of 512 tokens x bytes_per_token bytes; its bytes are a
// function of the hash id, so a wrong or stale block is caught. No client-side cache: a block is a
// hit only if the store still holds it.
// Hit rate = hit tokens / input tokens, where a hit prefix of h blocks counts h x 512 tokens, or
// input_length when all blocks hit (the last block is partial) - as in shared/workloads/README.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "granary/client.h"
#include "tools/bench/bench.h"
#include "tools/bench/trace_file.h"

namespace granary::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The bytes of block `id`: 8-byte words mixing the id and the word's index, so any two blocks
// (and any shifted copy of one) differ in nearly every word.
uint64_t Word(uint64_t id, uint64_t index) {
  uint64_t x = (id + 1) * 0x9E3779B97F4A7C15ull ^ (index + 1) * 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 31);
}
void FillBlock(uint64_t id, std::span<std::byte> out) {
  for (size_t w = 0; w * 8 + 8 <= out.size(); ++w) {
    uint64_t v = Word(id, w);
    std::memcpy(out.data() + w * 8, &v, 8);
  }
}
bool BlockMatches(uint64_t id, std::span<const std::byte> in) {
  for (size_t w = 0; w * 8 + 8 <= in.size(); ++w) {
    uint64_t v;
    std::memcpy(&v, in.data() + w * 8, 8);
    if (v != Word(id, w)) return false;
  }
  return true;
}

struct Totals {
  uint64_t requests = 0;
  uint64_t input_tokens = 0;
  uint64_t hit_tokens = 0;
  uint64_t blocks = 0;
  uint64_t hit_blocks = 0;
  uint64_t exist_hit_blocks = 0;  // hit by the existence check (some may vanish before the get)
  uint64_t put_blocks = 0;
  uint64_t get_bytes = 0;
  uint64_t put_bytes = 0;
  uint64_t lookup_errors = 0;
  uint64_t vanished = 0;          // existed at the check, gone at the get (evicted in between)
  uint64_t get_errors = 0;
  uint64_t verify_failures = 0;
  uint64_t put_errors = 0;
  std::string first_error;

  double hit_rate() const { return input_tokens ? double(hit_tokens) / input_tokens : 0; }
  void Error(uint64_t& counter, const Status& s) {
    if (first_error.empty()) first_error = s.ToString();
    counter++;
  }
};

}  // namespace

int RunTraceBench(const TraceBenchOptions& o) {
  auto trace = LoadTrace(o.trace_path, o.limit);
  if (!trace.ok()) {
    std::fprintf(stderr, "granary-bench trace: %s\n", trace.status().ToString().c_str());
    return 2;
  }
  const uint64_t block_bytes = kTokensPerBlock * o.bytes_per_token;
  ClientOptions co;
  co.master_address = o.master;
  co.use_shared_memory = o.path == "shm";
  auto connected = Client::Connect(co);
  if (!connected.ok()) {
    std::fprintf(stderr, "granary-bench trace: %s\n", connected.status().ToString().c_str());
    return 1;
  }
  Client& client = **connected;
  uint64_t capacity = 0;
  if (auto segments = client.ListSegments(); segments.ok()) {
    for (const auto& s : *segments) capacity += s.size;
  }
  if (capacity == 0) {
    std::fprintf(stderr, "granary-bench trace: no segment mounted at %s\n", o.master.c_str());
    return 1;
  }

  std::printf("trace %s: %zu requests; blocks of 512 tokens x %llu B = %llu B; store %llu B = "
              "%llu blocks = %llu tokens; lookup by %s; data path %s\n",
              o.trace_path.c_str(), trace->size(), (unsigned long long)o.bytes_per_token,
              (unsigned long long)block_bytes, (unsigned long long)capacity,
              (unsigned long long)(capacity / block_bytes),
              (unsigned long long)(capacity / block_bytes * kTokensPerBlock), o.lookup.c_str(),
              o.path.c_str());

  auto key = [&](uint64_t id) { return o.key_prefix + "/" + std::to_string(id); };
  Totals t;
  nlohmann::json progress = nlohmann::json::array();  // cumulative hit rate every 1000 requests
  std::vector<std::vector<std::byte>> buffers;        // one per block of the longest request
  const auto start = Clock::now();
  for (const TraceRequest& r : *trace) {
    if (o.speed > 0) {
      std::this_thread::sleep_until(
          start + std::chrono::microseconds(static_cast<int64_t>(r.timestamp_ms * 1000 / o.speed)));
    }
    const size_t n = r.hash_ids.size();
    if (buffers.size() < n) buffers.resize(n, std::vector<std::byte>(block_bytes));
    std::vector<std::string> keys;
    keys.reserve(n);
    for (uint64_t id : r.hash_ids) keys.push_back(key(id));

    // 1. How long a prefix does the store hold?
    std::vector<bool> exists(n, false);
    size_t prefix = 0;
    if (o.lookup == "prefix") {
      auto matched = client.PrefixMatch(keys);
      if (matched.ok()) {
        prefix = std::min<size_t>(*matched, n);
      } else {
        t.Error(t.lookup_errors, matched.status());
      }
      for (size_t i = 0; i < prefix; ++i) exists[i] = true;
    } else {
      auto found = client.BatchExist(keys);
      for (size_t i = 0; i < n; ++i) {
        if (found[i].ok()) {
          exists[i] = *found[i];
        } else {
          t.Error(t.lookup_errors, found[i].status());
        }
      }
      while (prefix < n && exists[prefix]) ++prefix;
    }
    t.exist_hit_blocks += prefix;

    // 2. Fetch the hit prefix and check every byte; the prefix ends at the first failure.
    size_t hit = 0;
    if (prefix > 0) {
      std::vector<std::string> get_keys(keys.begin(), keys.begin() + prefix);
      std::vector<MutableByteSpan> dst;
      for (size_t i = 0; i < prefix; ++i) dst.emplace_back(buffers[i]);
      auto got = client.BatchGetInto(get_keys, dst);
      while (hit < prefix) {
        if (!got[hit].ok()) {
          if (got[hit].status().code() == ErrorCode::OBJECT_NOT_FOUND) {
            t.vanished++;
          } else {
            t.Error(t.get_errors, got[hit].status());
          }
          break;
        }
        if (*got[hit] != block_bytes || (o.verify && !BlockMatches(r.hash_ids[hit], buffers[hit]))) {
          t.Error(t.verify_failures, Status(ErrorCode::CHECKSUM_MISMATCH,
                                            "wrong bytes for " + get_keys[hit]));
          break;
        }
        t.get_bytes += block_bytes;
        ++hit;
      }
      for (size_t i = hit; i < prefix; ++i) exists[i] = false;  // to be put again
    }

    // 3. Put what the store lacks (blocks past the prefix that it holds stay untouched).
    std::vector<std::string> put_keys;
    std::vector<ByteSpan> values;
    for (size_t i = hit; i < n; ++i) {
      if (exists[i]) continue;
      FillBlock(r.hash_ids[i], buffers[i]);
      put_keys.push_back(keys[i]);
      values.emplace_back(buffers[i]);
    }
    if (!put_keys.empty()) {
      auto statuses = client.BatchPut(put_keys, values);
      for (const Status& s : statuses) {
        if (s.ok()) {
          t.put_blocks++;
          t.put_bytes += block_bytes;
        } else {
          t.Error(t.put_errors, s);
        }
      }
    }

    t.requests++;
    t.blocks += n;
    t.hit_blocks += hit;
    t.input_tokens += r.input_length;
    t.hit_tokens += HitTokens(r, hit);
    if (t.requests % 1000 == 0) progress.push_back({{"requests", t.requests}, {"hit_rate", t.hit_rate()}});
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const uint64_t errors = t.lookup_errors + t.get_errors + t.verify_failures + t.put_errors;

  std::printf("%-12s %9s %9s %9s %9s %10s %10s %8s %8s %7s\n", "capacity", "requests", "hit rate",
              "hit blks", "put blks", "got GB", "put GB", "wall s", "req/s", "errors");
  std::printf("%-12s %9llu %9.4f %9llu %9llu %10.2f %10.2f %8.1f %8.0f %7llu\n",
              (std::to_string(capacity / block_bytes * kTokensPerBlock / 1000) + "k tok").c_str(),
              (unsigned long long)t.requests, t.hit_rate(), (unsigned long long)t.hit_blocks,
              (unsigned long long)t.put_blocks, t.get_bytes / 1e9, t.put_bytes / 1e9, seconds,
              t.requests / seconds, (unsigned long long)errors);
  std::printf("block hit rate %.4f; blocks that existed at the check but were gone at the get: %llu\n",
              t.blocks ? double(t.hit_blocks) / t.blocks : 0, (unsigned long long)t.vanished);
  if (!t.first_error.empty()) std::printf("first error: %s\n", t.first_error.c_str());

  if (!o.json_path.empty()) {
    nlohmann::json j = {
        {"trace", o.trace_path},
        {"label", o.label},
        {"requests", t.requests},
        {"bytes_per_token", o.bytes_per_token},
        {"block_bytes", block_bytes},
        {"store_bytes", capacity},
        {"capacity_blocks", capacity / block_bytes},
        {"capacity_tokens", capacity / block_bytes * kTokensPerBlock},
        {"speed", o.speed},
        {"lookup", o.lookup},
        {"path", o.path},
        {"input_tokens", t.input_tokens},
        {"hit_tokens", t.hit_tokens},
        {"hit_rate", t.hit_rate()},
        {"blocks", t.blocks},
        {"hit_blocks", t.hit_blocks},
        {"exist_hit_blocks", t.exist_hit_blocks},
        {"vanished_blocks", t.vanished},
        {"put_blocks", t.put_blocks},
        {"get_bytes", t.get_bytes},
        {"put_bytes", t.put_bytes},
        {"seconds", seconds},
        {"requests_per_s", t.requests / seconds},
        {"errors",
         {{"lookup", t.lookup_errors}, {"get", t.get_errors}, {"verify", t.verify_failures},
          {"put", t.put_errors}, {"first", t.first_error}}},
        {"progress", progress}};
    std::ofstream(o.json_path) << j.dump(2) << "\n";
  }
  return errors == 0 ? 0 : 1;
}

}  // namespace granary::bench
