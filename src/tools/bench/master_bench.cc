// granary-bench master: control-plane throughput against a running master.
//
//   granary-bench master --master HOST:PORT [--segments 128] [--threads 1,2,4] [--seconds 3]
//                        [--batch 128] [--value-size 4096] [--path auto|grpc|fast]
//                        [--ops tcp,ping,put,get,exist] [--json FILE]
//
// `master` measures the control plane alone: it mounts --segments fake segments (metadata only;
// no bytes move), then for each thread count runs, for --seconds each: batch put (start + end),
// batch get-replica-list + finish-read, and batch exist, each thread on its own connection.
// It prints batches/s, keys/s and batch latency p50/p99, and optionally writes them as JSON.
// `ping` (an empty RPC per iteration) is the ceiling any one-RPC batch can reach on this machine;
// put and get take two RPCs per batch (start+end, get+finish), exist one. A batch's messages
// live in a per-thread arena (CallArena). `tcp` is a raw 64-byte
// round trip to an echo thread of this process over loopback: the floor under any RPC, measured
// in the same run. --path picks the transport of the hot calls (client::MasterLink).
#include <google/protobuf/arena.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/master_link.h"
#include "granary/proto/master.grpc.pb.h"
#include "proto/rpc_util.h"
#include "tools/bench/bench.h"
#include "tools/bench/fake_segments.h"
#include "tools/bench/master_rpc.h"
#include "tools/bench/kv_socket.h"
#include "tools/bench/tcp_echo.h"

namespace granary::bench {
namespace {

using Clock = std::chrono::steady_clock;
namespace pb = granary::proto;

using client::MasterLink;
constexpr int kDeadlineMs = 30'000;

std::unique_ptr<pb::Master::Stub> NewStub(const std::string& target) { return MasterStub(target); }
std::unique_ptr<grpc::ClientContext> Ctx() { return RpcContext(kDeadlineMs); }

MasterLink::Path PathOf(const std::string& name) {
  if (name == "grpc") return MasterLink::Path::kGrpc;
  if (name == "fast") return MasterLink::Path::kFast;
  return MasterLink::Path::kAuto;
}

// A batch's messages, built and parsed in an arena whose first block is the thread's own, as a
// client written for throughput would: no malloc per reply sub-message (only key strings longer
// than the small-string buffer still take one).
class CallArena {
 public:
  CallArena() : arena_(Options()) {}
  template <typename M>
  M& Make() {
    return *google::protobuf::Arena::CreateMessage<M>(&arena_);
  }

 private:
  static constexpr size_t kBlock = 256 * 1024;  // a batch of 128 keys' messages fit
  static google::protobuf::ArenaOptions Options() {
    thread_local std::unique_ptr<char[]> block(new char[kBlock]);
    google::protobuf::ArenaOptions options;
    options.initial_block = block.get();
    options.initial_block_size = kBlock;
    return options;
  }
  google::protobuf::Arena arena_;
};

// One thread's connection: its own gRPC channel, and its own fast-port connections.
struct Conn {
  std::unique_ptr<pb::Master::Stub> stub;
  MasterLink link;
  Conn(const MasterBenchOptions& o)
      : stub(NewStub(o.master)),
        link(client::MasterLocator::Create(o.master, "", kDeadlineMs, /*own_connection=*/true,
                                           BenchSecret(), BenchTls())
                 .value(),
             kDeadlineMs, PathOf(o.path)) {}
};

struct CaseResult {
  std::string op;
  int threads = 0;
  uint64_t batches = 0;
  uint64_t keys = 0;
  uint64_t errors = 0;
  double seconds = 0;
  double p50_us = 0;
  double p99_us = 0;
  bool skipped = false;  // not in --ops
};

// Runs body(thread_index, conn, iteration) on `threads` threads for `seconds`; each call is one
// batch and returns how many keys in it failed.
template <typename Body>
CaseResult RunCase(const MasterBenchOptions& o, const std::string& op, int threads, Body body) {
  if (std::find(o.ops.begin(), o.ops.end(), op) == o.ops.end()) {
    CaseResult skipped;
    skipped.skipped = true;
    return skipped;
  }
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> latencies(threads);
  std::vector<uint64_t> errors(threads, 0);
  std::vector<std::thread> workers;
  auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      Conn conn(o);
      for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        auto t0 = Clock::now();
        errors[t] += body(t, conn, i);
        latencies[t].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  stop = true;
  for (auto& w : workers) w.join();
  CaseResult r;
  r.op = op;
  r.threads = threads;
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  for (int t = 0; t < threads; ++t) {
    all.insert(all.end(), latencies[t].begin(), latencies[t].end());
    r.errors += errors[t];
  }
  std::sort(all.begin(), all.end());
  r.batches = all.size();
  r.keys = r.batches * o.batch;
  r.p50_us = Percentile(all, 50);
  r.p99_us = Percentile(all, 99);
  return r;
}

}  // namespace

int RunMasterBench(const MasterBenchOptions& o) {
  auto admin = NewStub(o.master);
  // Fake nodes: they only exist in the master's metadata, and keep pinging to stay alive.
  std::vector<FakeSegments::Spec> specs;
  for (uint32_t i = 0; i < o.segments; ++i) {
    specs.push_back({"bench-node-" + std::to_string(i), "bench-seg-" + std::to_string(i),
                     o.segment_size});
  }
  auto segments = FakeSegments::Mount(o.master, std::move(specs));
  if (!segments.ok()) {
    std::fprintf(stderr, "granary-bench: %s\n", segments.status().message().c_str());
    return 1;
  }

  const std::string run_tag = std::to_string(Clock::now().time_since_epoch().count());
  auto key_of = [&](int t, uint64_t i, uint32_t k) {
    return "bench/" + run_tag + "/" + std::to_string(t) + "/" + std::to_string(i) + "/" +
           std::to_string(k);
  };
  // A fixed working set for the read cases.
  const uint32_t kReadBatches = 64;
  std::vector<std::string> read_keys;
  for (uint32_t b = 0; b < kReadBatches; ++b) {
    pb::BatchPutStartRequest start;
    pb::BatchPutEndRequest end;
    start.set_client_id("bench-loader");
    end.set_client_id("bench-loader");
    for (uint32_t k = 0; k < o.batch; ++k) {
      std::string key = "bench/" + run_tag + "/read/" + std::to_string(b) + "/" + std::to_string(k);
      start.add_keys(key);
      start.add_sizes(o.value_size);
      end.add_keys(key);
      end.add_checksums(k);
      read_keys.push_back(key);
    }
    pb::BatchPutStartResponse sr;
    pb::BatchStatusResponse er;
    (void)admin->BatchPutStart(Ctx().get(), start, &sr);
    for (const auto& r : sr.results()) end.add_put_gens(r.put_gen());
    (void)admin->BatchPutEnd(Ctx().get(), end, &er);
  }

  {
    MasterLink probe(client::MasterLocator::Create(o.master, "", kDeadlineMs, false, BenchSecret(),
                                                   BenchTls())
                         .value(),
                     kDeadlineMs,
                     PathOf(o.path));
    const uint16_t fast = o.path == "grpc" ? 0 : probe.FastPort();
    if (o.path == "fast" && fast == 0) {
      std::fprintf(stderr, "granary-bench: the master advertises no fast port\n");
      return 1;
    }
    std::printf("hot calls over %s\n", fast ? ("the fast port " + std::to_string(fast)).c_str()
                                           : "gRPC");
  }
  auto echo = TcpEcho::Start();
  if (!echo.ok()) {
    std::fprintf(stderr, "granary-bench: %s\n", echo.status().message().c_str());
    return 1;
  }

  std::vector<CaseResult> results;
  for (int threads : o.threads) {
    // The floor: a raw 64-byte TCP round trip, no RPC stack at all.
    {
      std::vector<std::unique_ptr<LineSocket>> sockets(threads);
      for (auto& s : sockets) {
        auto c = LineSocket::Connect("127.0.0.1:" + std::to_string((*echo)->port()));
        if (c.ok()) s = std::move(*c);
      }
      results.push_back(RunCase(o, "tcp", threads, [&](int t, Conn&, uint64_t) {
        char buf[64] = {};
        iovec iov{buf, sizeof(buf)};
        if (!sockets[t] || !sockets[t]->WriteAll(&iov, 1).ok()) return uint64_t{1};
        return sockets[t]->ReadExact(buf, sizeof(buf)).ok() ? uint64_t{0} : uint64_t{1};
      }));
      results.back().keys = 0;
    }
    // The ceiling: one empty round trip (a Ping) per "batch", through the same RPC stack.
    results.push_back(RunCase(o, "ping", threads, [&](int t, Conn& c, uint64_t) {
      pb::PingRequest req;
      req.set_client_id("bench-pinger-" + std::to_string(t));
      pb::PingResponse resp;
      return c.link.Ping(req, &resp).ok() ? uint64_t{0} : uint64_t{1};
    }));
    results.back().keys = 0;
    results.push_back(RunCase(o, "put", threads, [&](int t, Conn& c, uint64_t i) {
      CallArena arena;
      auto& start = arena.Make<pb::BatchPutStartRequest>();
      auto& end = arena.Make<pb::BatchPutEndRequest>();
      std::string client = "bench-writer-" + std::to_string(t);
      start.set_client_id(client);
      end.set_client_id(client);
      for (uint32_t k = 0; k < o.batch; ++k) {
        std::string key = key_of(t, i, k) + "/" + std::to_string(threads);
        start.add_keys(key);
        start.add_sizes(o.value_size);
        end.add_keys(key);
        end.add_checksums(k);
      }
      auto& sr = arena.Make<pb::BatchPutStartResponse>();
      auto& er = arena.Make<pb::BatchStatusResponse>();
      uint64_t errors = 0;
      if (!c.link.PutStart(start, &sr).ok()) return uint64_t{o.batch};
      for (const auto& r : sr.results()) {
        errors += r.code() != 0;
        end.add_put_gens(r.put_gen());
      }
      if (!c.link.PutEnd(end, &er).ok()) return uint64_t{o.batch};
      return errors;
    }));
    {  // untimed: the read cases then find the same 8,192 objects as `granary-bench state`'s
      pb::RegexRequest req;
      req.set_pattern("^bench/" + run_tag + "/[0-9]+/");
      req.set_force(true);
      pb::RemoveCountResponse resp;
      (void)admin->RemoveByRegex(Ctx().get(), req, &resp);
    }
    results.push_back(RunCase(o, "get", threads, [&](int t, Conn& c, uint64_t i) {
      uint32_t b = static_cast<uint32_t>((i * 7 + t * 13) % kReadBatches);
      CallArena arena;
      auto& get = arena.Make<pb::BatchGetReplicaListRequest>();
      auto& fin = arena.Make<pb::BatchFinishReadRequest>();
      std::string client = "bench-reader-" + std::to_string(t);
      get.set_client_id(client);
      get.set_cache_ms(o.cache_ms);
      fin.set_client_id(client);
      for (uint32_t k = 0; k < o.batch; ++k) {
        get.add_keys(read_keys[b * o.batch + k]);
        fin.add_keys(read_keys[b * o.batch + k]);
      }
      auto& gr = arena.Make<pb::BatchGetReplicaListResponse>();
      auto& fr = arena.Make<pb::BatchStatusResponse>();
      uint64_t errors = 0;
      if (!c.link.GetReplicaList(get, &gr).ok()) return uint64_t{o.batch};
      for (const auto& r : gr.results()) errors += r.code() != 0;
      if (!c.link.FinishRead(fin, &fr).ok()) return uint64_t{o.batch};
      return errors;
    }));
    results.push_back(RunCase(o, "exist", threads, [&](int t, Conn& c, uint64_t i) {
      uint32_t b = static_cast<uint32_t>((i * 7 + t * 13) % kReadBatches);
      CallArena arena;
      auto& req = arena.Make<pb::BatchExistRequest>();
      for (uint32_t k = 0; k < o.batch; ++k) req.add_keys(read_keys[b * o.batch + k]);
      auto& resp = arena.Make<pb::BatchExistResponse>();
      if (!c.link.Exist(req, &resp).ok()) return uint64_t{o.batch};
      uint64_t errors = 0;
      for (int32_t r : resp.results()) errors += r != 1;
      return errors;
    }));
  }
  {  // one scan removes what this run made; unmounting 128 segments one by one would scan 128 times
    pb::RegexRequest req;
    req.set_pattern("^bench/" + run_tag + "/");
    req.set_force(true);
    pb::RemoveCountResponse resp;
    (void)admin->RemoveByRegex(Ctx().get(), req, &resp);
  }
  segments->reset();  // stops the pings, unmounts

  std::printf("%-6s %7s %12s %12s %10s %10s %8s\n", "op", "threads", "batches/s", "keys/s",
              "p50(us)", "p99(us)", "errors");
  nlohmann::json json = nlohmann::json::array();
  for (const auto& r : results) {
    if (r.skipped) continue;
    std::printf("%-6s %7d %12.0f %12.0f %10.0f %10.0f %8llu\n", r.op.c_str(), r.threads,
                r.batches / r.seconds, r.keys / r.seconds, r.p50_us, r.p99_us,
                static_cast<unsigned long long>(r.errors));
    json.push_back({{"op", r.op}, {"threads", r.threads}, {"batch", o.batch}, {"path", o.path},
                    {"batches_per_s", r.batches / r.seconds}, {"keys_per_s", r.keys / r.seconds},
                    {"p50_us", r.p50_us}, {"p99_us", r.p99_us}, {"errors", r.errors}});
  }
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << json.dump(2) << "\n";
  }
  uint64_t total_errors = 0;
  for (const auto& r : results) total_errors += r.errors;
  return total_errors == 0 ? 0 : 1;
}

}  // namespace granary::bench
