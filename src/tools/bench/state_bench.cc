// granary-bench state: the master's state machine alone, in process, no RPC: what the metadata
// work of a batch costs, so the `master` suite's figures can be split into state work and the
// gRPC round trip around it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "master/master_config.h"
#include "master/state/master_state.h"
#include "tools/bench/bench.h"

namespace granary::bench {
namespace {

using Clock = std::chrono::steady_clock;

template <typename Body>
double KeysPerSecond(int threads, double seconds, uint32_t batch, Body body) {
  std::atomic<bool> stop{false};
  std::vector<uint64_t> batches(threads, 0);
  std::vector<std::thread> workers;
  auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        body(t, i);
        batches[t]++;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& w : workers) w.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  uint64_t total = 0;
  for (uint64_t b : batches) total += b;
  return total * batch / elapsed;
}

}  // namespace

int RunStateBench(const StateBenchOptions& o) {
  master::MasterConfig config;
  config.eviction_policy = o.eviction_policy;
  master::MasterState state(config.EffectivePolicy(), WallClock::Instance());
  state.set_apply_turns(o.apply_turn_ops, o.apply_combine_waiting);
  state.set_apply_groups(o.apply_groups);
  for (uint32_t i = 0; i < o.segments; ++i) {
    auto r = state.Mount({"node-" + std::to_string(i),
                          {"seg-" + std::to_string(i), uint64_t{1} << 30, "127.0.0.1:1", "", "", 0, true}});
    if (!r.status.ok()) return 1;
  }
  // Keys prepared up front: the suite measures the state machine, not string building.
  const uint32_t kReadBatches = 64;
  std::vector<std::vector<std::string>> read_batches(kReadBatches);
  for (uint32_t b = 0; b < kReadBatches; ++b) {
    for (uint32_t k = 0; k < o.batch; ++k) {
      read_batches[b].push_back("model/read/" + std::to_string(b) + "/" + std::to_string(k));
    }
    auto started =
        state.PutStart({"loader", read_batches[b], std::vector<uint64_t>(o.batch, o.value_size), {}, false});
    state.PutEnd({"loader", read_batches[b], std::vector<uint64_t>(o.batch, 1), master::Gens(started)});
  }
  std::vector<std::string> prefixes;
  for (int t = 0; t < 64; ++t) prefixes.push_back("model/put/" + std::to_string(t) + "/");

  std::printf("%-6s %7s %14s\n", "op", "threads", "keys/s");
  nlohmann::json json = nlohmann::json::array();
  for (int threads : o.threads) {
    std::atomic<uint64_t> generation{0};
    auto wanted = [&](const char* op) {
      return std::find(o.ops.begin(), o.ops.end(), op) != o.ops.end();
    };
    std::vector<std::pair<const char*, double>> rows;
    // Puts keep their objects, as over RPC (`granary-bench master`); they go, untimed, after.
    if (wanted("put")) rows.emplace_back("put", KeysPerSecond(threads, o.seconds, o.batch, [&](int t, uint64_t i) {
      std::vector<std::string> keys;
      keys.reserve(o.batch);
      uint64_t g = generation.fetch_add(1, std::memory_order_relaxed);
      for (uint32_t k = 0; k < o.batch; ++k) {
        keys.push_back(prefixes[t] + std::to_string(g) + "/" + std::to_string(k));
      }
      std::string client = "writer-" + std::to_string(t);
      auto started = state.PutStart({client, keys, std::vector<uint64_t>(o.batch, o.value_size), {}, false});
      state.PutEnd({client, keys, std::vector<uint64_t>(o.batch, 1), master::Gens(started)});
    }));
    state.RemoveByRegex({"^model/put/", true});
    if (wanted("get")) rows.emplace_back("get", KeysPerSecond(threads, o.seconds, o.batch, [&](int t, uint64_t i) {
      const auto& keys = read_batches[(i * 7 + t * 13) % kReadBatches];
      std::string client = "reader-" + std::to_string(t);
      state.GetReplicaList({client, keys});
      state.FinishRead({client, keys});
    }));
    if (wanted("exist")) rows.emplace_back("exist", KeysPerSecond(threads, o.seconds, o.batch, [&](int t, uint64_t i) {
      state.BatchExist(read_batches[(i * 7 + t * 13) % kReadBatches]);
    }));
    for (auto [op, v] : rows) {
      std::printf("%-6s %7d %14.0f   (applied in groups so far: %llu ops, %llu parts lent)\n", op,
                  threads, v, static_cast<unsigned long long>(state.applies_grouped()),
                  static_cast<unsigned long long>(state.apply_parts_helped()));
      json.push_back({{"op", op}, {"threads", threads}, {"keys_per_s", v}, {"batch", o.batch},
                      {"apply_turn_ops", o.apply_turn_ops},
                      {"apply_combine_waiting", o.apply_combine_waiting},
                      {"apply_groups", o.apply_groups},
                      {"eviction_policy", o.eviction_policy}});
    }
  }
  if (!o.json_path.empty()) std::ofstream(o.json_path) << json.dump(2) << "\n";
  return 0;
}

}  // namespace granary::bench
