// granary-bench scale: the master's memory per object and its batch-exist speed with millions of
// objects.
//
// Mounts one fake segment (metadata only: no node, no bytes move) large enough that nothing is
// evicted, then fills the master in steps (--objects, ascending) with BatchPutStart+BatchPutEnd of
// --value-size objects of 1 replica. After each step it reads the master's VmRSS from
// /proc/<pid>/status (so the master must run on this host) and reports (RSS - RSS before the
// first put) / objects, then runs BatchExist of --exist-batch random existing keys for --seconds
// per client-thread count. Keys look like an engine's: a model name plus a 32-hex-digit hash.
// Then the offload planner's cost at that size: the segment's node registers a disk, puts
// kEagerKeys objects of persistence eager, and calls OffloadStart (kOffloadBatch keys a call,
// each answer's copies reported written by OffloadEnd) until an answer names nothing: the calls
// that name keys and the empty one at the end (a node's idle round) are timed. The other objects
// stay lazy below the offload watermark, so a planner costs what it returns only if it skips them.
// The first step also reports the master's RSS growth when that disk registered: the master
// starts its offload index then, listing every object.
// Then the re-replication planner's cost at that size (MeasureRereplicate): a ReplicaCopyStart
// after a node mounted with nothing short, those that copy 2000 objects raised to 2 replicas,
// and the one after a drain began (the only look that walks every object).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "granary/proto/master.grpc.pb.h"
#include "proto/rpc_util.h"
#include "tools/bench/bench.h"
#include "tools/bench/fake_segments.h"
#include "tools/bench/master_rpc.h"

namespace granary::bench {
namespace {

using Clock = std::chrono::steady_clock;
namespace pb = granary::proto;

constexpr char kNode[] = "bench-scale-node";
constexpr char kSegment[] = "bench-scale-seg";
constexpr uint64_t kDisk = 0x5ca1e;  // the fake node's disk id
constexpr uint32_t kEagerKeys = 2000;
constexpr uint32_t kOffloadBatch = 500;

std::unique_ptr<pb::Master::Stub> NewStub(const std::string& target) { return MasterStub(target); }
std::unique_ptr<grpc::ClientContext> Ctx() { return RpcContext(60'000); }

// Object i's key: 55 bytes, spread over the shards like real hashes (a alone is a bijection of i,
// so keys never clash).
std::string KeyOf(uint64_t i) {
  static const char* kHex = "0123456789abcdef";
  uint64_t a = i * 0x9E3779B97F4A7C15ull, b = (i ^ 0xC2B2AE3D27D4EB4Full) * 0x165667B19E3779F9ull;
  std::string key = "bench-scale/llama-3-8b/";
  for (uint64_t v : {a, b}) {
    for (int s = 60; s >= 0; s -= 4) key += kHex[(v >> s) & 15];
  }
  return key;
}

// VmRSS of pid in bytes, or -1.
int64_t RssBytes(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

struct ExistResult {
  int threads = 0;
  double keys_per_s = 0, batches_per_s = 0, p50_us = 0, p99_us = 0;
  uint64_t misses = 0;
};

ExistResult RunExist(const ScaleBenchOptions& o, uint64_t objects, int threads) {
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> lat(threads);
  std::vector<uint64_t> misses(threads, 0);
  std::vector<std::thread> workers;
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto stub = NewStub(o.master);
      std::mt19937_64 rng(t + 1);
      while (!stop.load(std::memory_order_relaxed)) {
        pb::BatchExistRequest req;
        for (uint32_t k = 0; k < o.exist_batch; ++k) req.add_keys(KeyOf(rng() % objects));
        pb::BatchExistResponse resp;
        const auto t0 = Clock::now();
        grpc::Status s = stub->BatchExist(Ctx().get(), req, &resp);
        lat[t].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        if (!s.ok()) {
          misses[t] += o.exist_batch;
          continue;
        }
        for (int32_t r : resp.results()) misses[t] += r != 1;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  stop = true;
  for (auto& w : workers) w.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  ExistResult r;
  r.threads = threads;
  for (int t = 0; t < threads; ++t) {
    all.insert(all.end(), lat[t].begin(), lat[t].end());
    r.misses += misses[t];
  }
  std::sort(all.begin(), all.end());
  r.batches_per_s = all.size() / seconds;
  r.keys_per_s = r.batches_per_s * o.exist_batch;
  r.p50_us = Percentile(all, 50);
  r.p99_us = Percentile(all, 99);
  return r;
}

// Puts objects [from, to) with put_threads threads; returns keys/s, or -1 after a failure.
double Fill(const ScaleBenchOptions& o, uint64_t from, uint64_t to) {
  std::atomic<uint64_t> next{from};
  std::atomic<uint64_t> failed{0};
  std::string first_error;
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < o.put_threads; ++t) {
    workers.emplace_back([&, t] {
      auto stub = NewStub(o.master);
      const std::string client = "bench-scale-writer-" + std::to_string(t);
      for (;;) {
        const uint64_t first = next.fetch_add(o.put_batch);
        if (first >= to || failed.load() > 0) break;
        const uint64_t last = std::min<uint64_t>(to, first + o.put_batch);
        pb::BatchPutStartRequest start_req;
        pb::BatchPutEndRequest end_req;
        start_req.set_client_id(client);
        end_req.set_client_id(client);
        for (uint64_t i = first; i < last; ++i) {
          std::string key = KeyOf(i);
          start_req.add_keys(key);
          start_req.add_sizes(o.value_size);
          end_req.add_keys(std::move(key));
          end_req.add_checksums(i);
        }
        pb::BatchPutStartResponse sr;
        pb::BatchStatusResponse er;
        grpc::Status s = stub->BatchPutStart(Ctx().get(), start_req, &sr);
        uint64_t bad = s.ok() ? 0 : last - first;
        for (const auto& r : sr.results()) {
          bad += r.code() != 0;
          end_req.add_put_gens(r.put_gen());
        }
        if (s.ok()) s = stub->BatchPutEnd(Ctx().get(), end_req, &er);
        if (!s.ok() || bad > 0) {
          if (failed.fetch_add(1) == 0) {
            first_error = !s.ok() ? s.error_message()
                                  : std::to_string(bad) + " keys refused, first code " +
                                        std::to_string(sr.results(0).code());
          }
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  if (failed > 0) {
    std::fprintf(stderr, "granary-bench: scale: put failed: %s\n", first_error.c_str());
    return -1;
  }
  return (to - from) / std::chrono::duration<double>(Clock::now() - start).count();
}

struct OffloadResult {
  uint32_t offloaded = 0;
  uint32_t calls = 0;
  double naming_ms_p50 = -1;  // a call that named keys
  double idle_ms = -1;        // the call that named none
  int64_t index_bytes = -1;   // RSS growth when the first disk registered (the index is built)
};

// See the file's comment. step: a number for this measurement's keys.
Result<OffloadResult> MeasureOffload(const ScaleBenchOptions& o, size_t step) {
  auto stub = NewStub(o.master);
  int64_t index_bytes = -1;
  if (step == 0) {
    pb::DiskRegisterRequest reg;
    reg.set_client_id(kNode);
    reg.set_disk_id(kDisk);
    reg.set_complete(true);
    pb::BatchStatusResponse resp;
    const int64_t rss_before = RssBytes(o.master_pid);
    grpc::Status s = stub->DiskRegister(Ctx().get(), reg, &resp);
    if (!s.ok()) return Status(ErrorCode::RPC_FAIL, "DiskRegister: " + s.error_message());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the allocator settle
    index_bytes = RssBytes(o.master_pid) - rss_before;
  }
  const std::string client = "bench-scale-eager";
  for (uint32_t first = 0; first < kEagerKeys; first += kOffloadBatch) {
    pb::BatchPutStartRequest start_req;
    pb::BatchPutEndRequest end_req;
    start_req.set_client_id(client);
    end_req.set_client_id(client);
    start_req.mutable_config()->set_persistence(pb::PERSISTENCE_EAGER);
    for (uint32_t i = first; i < std::min(kEagerKeys, first + kOffloadBatch); ++i) {
      std::string key = "bench-scale-eager/" + std::to_string(step) + "/" + std::to_string(i);
      start_req.add_keys(key);
      start_req.add_sizes(o.value_size);
      end_req.add_keys(std::move(key));
      end_req.add_checksums(i);
    }
    pb::BatchPutStartResponse sr;
    pb::BatchStatusResponse er;
    grpc::Status s = stub->BatchPutStart(Ctx().get(), start_req, &sr);
    if (!s.ok()) return Status(ErrorCode::RPC_FAIL, "BatchPutStart: " + s.error_message());
    for (const auto& r : sr.results()) {
      if (r.code() != 0) return Status(ErrorCode::RPC_FAIL, "eager put refused: " + r.message());
      end_req.add_put_gens(r.put_gen());
    }
    s = stub->BatchPutEnd(Ctx().get(), end_req, &er);
    if (!s.ok()) return Status(ErrorCode::RPC_FAIL, "BatchPutEnd: " + s.error_message());
  }
  OffloadResult r;
  r.index_bytes = index_bytes;
  std::vector<double> naming;
  uint64_t location = step << 32;
  // Bounded: twice the calls the keys need, and one more for the empty answer.
  for (uint32_t call = 0; call < 2 * kEagerKeys / kOffloadBatch + 1; ++call) {
    pb::OffloadStartRequest req;
    req.set_client_id(kNode);
    req.set_max_keys(kOffloadBatch);
    req.set_max_bytes(uint64_t{1} << 40);
    req.set_disk_id(kDisk);
    pb::OffloadStartResponse resp;
    const auto t0 = Clock::now();
    grpc::Status s = stub->OffloadStart(Ctx().get(), req, &resp);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    r.calls++;
    if (!s.ok() || resp.code() != 0) {
      return Status(ErrorCode::RPC_FAIL, "OffloadStart: " + (s.ok() ? resp.message() : s.error_message()));
    }
    if (resp.items_size() == 0) {
      r.idle_ms = ms;
      break;
    }
    naming.push_back(ms);
    pb::OffloadEndRequest end;
    end.set_client_id(kNode);
    end.set_disk_id(kDisk);
    for (const auto& item : resp.items()) {
      end.add_keys(item.key());
      end.add_version_gens(item.version_gen());
      end.add_locations(location++);
      end.add_written(true);
    }
    pb::BatchStatusResponse er;
    s = stub->OffloadEnd(Ctx().get(), end, &er);
    if (!s.ok()) return Status(ErrorCode::RPC_FAIL, "OffloadEnd: " + s.error_message());
    for (const auto& e : er.results()) r.offloaded += e.code() == 0;
  }
  std::sort(naming.begin(), naming.end());
  if (!naming.empty()) r.naming_ms_p50 = Percentile(naming, 50);
  return r;
}

struct RereplicateResult {
  double idle_ms = -1;      // the first ReplicaCopyStart after a mount moved the epoch: none short
  double first_ms = -1;     // the first after kShortKeys objects were raised to 2 replicas
  double naming_ms_p50 = -1;
  uint32_t copied = 0;
  uint32_t calls = 0;
  double drain_ms = -1;       // the Drain call (its apply walks nothing)
  double drain_walk_ms = -1;  // the first ReplicaCopyStart after it: one walk over every object,
                              // as every call after an epoch move made before the index
};

// The re-replication planner's cost at this size: a copying node mounts a segment of its own
// (the replica epoch moves: the planner looks for work, and there is none), then kShortKeys
// objects spread over the keys put so far are raised to 2 replicas, and the node asks for copies
// (ReplicaCopyStart, each answer reported copied by ReplicaCopyEnd) until an answer names nothing.
// Lowered back to 1 replica and unmounted after, so that each step starts alike.
Result<RereplicateResult> MeasureRereplicate(const ScaleBenchOptions& o, uint64_t objects,
                                             size_t step) {
  constexpr char kCopier[] = "bench-scale-copier";
  constexpr uint32_t kShortKeys = 2000;
  static uint64_t round = 0;  // the copier's rounds count up across steps
  auto copier = FakeSegments::Mount(
      o.master, {{kCopier, "bench-scale-copy-seg-" + std::to_string(step),
                  2 * kShortKeys * ((o.value_size + 63) / 64 * 64) + (64ull << 20)}});
  if (!copier.ok()) return copier.status();
  auto stub = NewStub(o.master);
  RereplicateResult r;
  std::vector<double> naming;
  auto ask = [&](double* first) -> Result<size_t> {
    pb::ReplicaCopyStartRequest req;
    req.set_client_id(kCopier);
    req.set_round(++round);
    req.set_max_keys(256);
    pb::ReplicaCopyStartResponse resp;
    const auto t0 = Clock::now();
    grpc::Status s = stub->ReplicaCopyStart(Ctx().get(), req, &resp);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!s.ok() || resp.code() != 0) {
      return Status(ErrorCode::RPC_FAIL,
                    "ReplicaCopyStart: " + (s.ok() ? resp.message() : s.error_message()));
    }
    r.calls++;
    if (first && *first < 0) *first = ms;
    if (resp.items_size() == 0) return size_t{0};
    naming.push_back(ms);
    pb::ReplicaCopyEndRequest end;
    end.set_client_id(kCopier);
    end.set_round(round);
    for (const auto& item : resp.items()) {
      end.add_keys(item.key());
      end.add_version_gens(item.version_gen());
      end.add_copied(true);
    }
    pb::BatchStatusResponse er;
    s = stub->ReplicaCopyEnd(Ctx().get(), end, &er);
    if (!s.ok()) return Status(ErrorCode::RPC_FAIL, "ReplicaCopyEnd: " + s.error_message());
    for (const auto& e : er.results()) r.copied += e.code() == 0;
    return static_cast<size_t>(resp.items_size());
  };
  auto idle = ask(&r.idle_ms);
  if (!idle.ok()) return idle.status();
  if (*idle != 0) return Status(ErrorCode::INTERNAL_ERROR, "copies named with nothing short");
  pb::ReplicateRequest raise;
  raise.set_client_id("bench-scale-admin");
  const uint64_t stride = std::max<uint64_t>(1, objects / kShortKeys);
  for (uint64_t i = 0; i < kShortKeys && i * stride < objects; ++i) raise.add_keys(KeyOf(i * stride));
  raise.set_replica_num(2);
  pb::BatchStatusResponse raised;
  grpc::Status s = stub->Replicate(Ctx().get(), raise, &raised);
  if (!s.ok()) return Status(ErrorCode::RPC_FAIL, "Replicate: " + s.error_message());
  // Until all are copied; an empty answer may be the rate's budget: a few more, bounded.
  uint32_t empty = 0;
  for (uint32_t call = 0; call < 4 * kShortKeys / 256 + 50 && r.copied < kShortKeys; ++call) {
    auto named = ask(call == 0 ? &r.first_ms : nullptr);
    if (!named.ok()) return named.status();
    if (*named == 0) {
      if (++empty > 20) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  // The copies go again, so that the next step starts with none short: lowered while the
  // copier's segment drains (its replicas are dropped first), undrained, then unmounted.
  const std::string copy_segment = "bench-scale-copy-seg-" + std::to_string(step);
  auto drain = [&](bool undrain) -> Status {
    pb::DrainRequest req;
    req.set_segment_name(copy_segment);
    req.set_undrain(undrain);
    pb::DrainResponse resp;
    grpc::Status ds = stub->Drain(Ctx().get(), req, &resp);
    if (!ds.ok() || resp.code() != 0) {
      return Status(ErrorCode::RPC_FAIL, "Drain: " + (ds.ok() ? resp.message() : ds.error_message()));
    }
    return Status::Ok();
  };
  const auto drain_start = Clock::now();
  if (Status d = drain(false); !d.ok()) return d;
  r.drain_ms = std::chrono::duration<double, std::milli>(Clock::now() - drain_start).count();
  // The planner's first look after a drain began walks every object once (what only the
  // draining segment holds needs copies): nothing for the copier, which holds those copies.
  auto walked = ask(&r.drain_walk_ms);
  if (!walked.ok()) return walked.status();
  raise.set_replica_num(1);
  s = stub->Replicate(Ctx().get(), raise, &raised);
  if (!s.ok()) return Status(ErrorCode::RPC_FAIL, "Replicate: " + s.error_message());
  if (Status d = drain(true); !d.ok()) return d;
  std::sort(naming.begin(), naming.end());
  if (!naming.empty()) r.naming_ms_p50 = Percentile(naming, 50);
  return r;
}

}  // namespace

int RunScaleBench(const ScaleBenchOptions& o) {
  if (RssBytes(o.master_pid) < 0) {
    std::fprintf(stderr, "granary-bench: no /proc/%d/status: --master-pid must be the master's pid "
                 "on this host\n", o.master_pid);
    return 2;
  }
  std::vector<uint64_t> steps = o.objects;
  std::sort(steps.begin(), steps.end());
  if (steps.empty() || steps.front() == 0) return 2;
  // 2x the bytes of the largest step: far below the eviction watermark.
  auto segment = FakeSegments::Mount(
      o.master, {{kNode, kSegment,
                  steps.back() * ((o.value_size + 63) / 64 * 64) * 2 + (1ull << 30)}});
  if (!segment.ok()) {
    std::fprintf(stderr, "granary-bench: %s\n", segment.status().message().c_str());
    return 1;
  }

  const int64_t rss0 = RssBytes(o.master_pid);
  std::printf("master pid %d, RSS before puts %.1f MiB; objects of %llu bytes, 1 replica, keys of "
              "%zu bytes; puts in batches of %u on %d threads\n", o.master_pid, rss0 / 1048576.0,
              static_cast<unsigned long long>(o.value_size), KeyOf(0).size(), o.put_batch,
              o.put_threads);
  std::printf("%10s %10s %10s %12s %8s %12s %10s %10s\n", "objects", "RSS MiB", "B/object",
              "put keys/s", "threads", "exist keys/s", "p50(us)", "p99(us)");
  nlohmann::json json;
  json["value_size"] = o.value_size;
  json["key_bytes"] = KeyOf(0).size();
  json["exist_batch"] = o.exist_batch;
  json["rss_before_bytes"] = rss0;
  json["steps"] = nlohmann::json::array();
  int rc = 0;
  uint64_t have = 0;
  for (uint64_t target : steps) {
    const double put_rate = Fill(o, have, target);
    if (put_rate < 0) {
      rc = 1;
      break;
    }
    have = target;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the allocator settle
    const int64_t rss = RssBytes(o.master_pid);
    const double per_object = static_cast<double>(rss - rss0) / have;
    nlohmann::json step = {{"objects", have}, {"rss_bytes", rss}, {"bytes_per_object", per_object},
                           {"put_keys_per_s", put_rate}, {"exist", nlohmann::json::array()}};
    for (int threads : o.threads) {
      ExistResult e = RunExist(o, have, threads);
      std::printf("%10llu %10.1f %10.0f %12.0f %8d %12.0f %10.0f %10.0f\n",
                  static_cast<unsigned long long>(have), rss / 1048576.0, per_object, put_rate,
                  threads, e.keys_per_s, e.p50_us, e.p99_us);
      if (e.misses) {
        std::printf("    %llu keys reported missing\n", static_cast<unsigned long long>(e.misses));
        rc = 1;
      }
      step["exist"].push_back({{"threads", threads}, {"keys_per_s", e.keys_per_s},
                               {"batches_per_s", e.batches_per_s}, {"p50_us", e.p50_us},
                               {"p99_us", e.p99_us}, {"misses", e.misses}});
    }
    auto offload = MeasureOffload(o, json["steps"].size());
    if (!offload.ok()) {
      std::printf("    offload: %s\n", offload.status().message().c_str());
      rc = 1;
    } else {
      std::printf("    offload at %llu objects: %u eager keys offloaded in %u OffloadStart calls; "
                  "a call naming %u keys p50 %.2f ms, the idle call %.2f ms\n",
                  static_cast<unsigned long long>(have), offload->offloaded, offload->calls,
                  kOffloadBatch, offload->naming_ms_p50, offload->idle_ms);
      if (offload->index_bytes >= 0) {
        std::printf("    the first disk's registration listed %llu objects for offload: master RSS "
                    "+%.1f MiB (%.0f B/object)\n", static_cast<unsigned long long>(have),
                    offload->index_bytes / 1048576.0,
                    static_cast<double>(offload->index_bytes) / have);
        step["offload_index_bytes"] = offload->index_bytes;
      }
      if (offload->offloaded != kEagerKeys) rc = 1;
      step["offload"] = {{"eager_keys", kEagerKeys}, {"offloaded", offload->offloaded},
                         {"calls", offload->calls}, {"keys_per_call", kOffloadBatch},
                         {"naming_call_p50_ms", offload->naming_ms_p50},
                         {"idle_call_ms", offload->idle_ms}};
    }
    auto copies = MeasureRereplicate(o, have, json["steps"].size());
    if (!copies.ok()) {
      std::printf("    re-replication: %s\n", copies.status().message().c_str());
      rc = 1;
    } else {
      std::printf("    re-replication at %llu objects: a ReplicaCopyStart after a mount (none "
                  "short) %.2f ms; after 2000 objects were raised to 2 replicas: the first %.2f "
                  "ms, p50 %.2f ms; %u copies in %u calls; a Drain call %.2f ms, the next "
                  "call (one walk over every object) %.2f ms\n",
                  static_cast<unsigned long long>(have), copies->idle_ms, copies->first_ms,
                  copies->naming_ms_p50, copies->copied, copies->calls, copies->drain_ms,
                  copies->drain_walk_ms);
      if (copies->copied < 2000) rc = 1;
      step["rereplicate"] = {{"idle_call_ms", copies->idle_ms},
                             {"first_call_ms", copies->first_ms},
                             {"naming_call_p50_ms", copies->naming_ms_p50},
                             {"copied", copies->copied}, {"calls", copies->calls},
                             {"drain_call_ms", copies->drain_ms},
                             {"drain_walk_call_ms", copies->drain_walk_ms}};
    }
    json["steps"].push_back(step);
  }
  segment->reset();  // stops the pings; unmounting drops its objects
  if (!o.json_path.empty()) std::ofstream(o.json_path) << json.dump(2) << "\n";
  return rc;
}

}  // namespace granary::bench
