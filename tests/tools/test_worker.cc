// granary-test-worker: a misbehaving or ordinary client process for the integration tests.
//
//   put-start-and-hang --master A --key K --size N   BatchPutStart (raw gRPC), print "started",
//                                                    then sleep until killed: a writer that died
//                                                    between put-start and put-end.
//   get-and-hang --master A --key K [--key K2 ...]   BatchGetReplicaList (raw gRPC), print
//                                                    "locked", then sleep: a reader that died
//                                                    holding read locks.
//   worker --master A --id I --objects N --size S    a same-host client: BatchPut N objects
//                                                    "worker-I-j" of S bytes, BatchGetInto them
//                                                    back and compare byte for byte.
//   chaos --master A --id I --dir D ...              the chaos test's mixed load until D/stop
//                                                    exists (tests/tools/chaos_worker.h).
//   shm-put-paused --master A --key K --size N       a same-host writer paused mid-copy:
//                                                    BatchPutStart (raw gRPC), map the replica's
//                                                    segment, check its token as the client
//                                                    does, memcpy the first half, print "copied
//                                                    half", stop itself (SIGSTOP), and on
//                                                    SIGCONT memcpy the second half, then print
//                                                    whether the mount changed meanwhile.
//   objects put|get|stat --master A --prefix P ...   the several-hosts test's puts and gets, and
//   rtt --endpoint IP:PORT --count N                 TCP round trips (tests/tools/hosts_worker.h).
//
// Exit codes: 0 done, 2 bad usage, 3 an RPC failed or answered an error, 4 wrong bytes read back,
// 5 a required shared-memory mapping was not made (or the segment was not of the replica's mount). The hang subcommands exit 6 if nobody killed
// them within --max-hang (a safety net: a crashed test must not leave them behind forever).
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "granary/client.h"
#include "granary/proto/master.grpc.pb.h"
#include "chaos_worker.h"
#include "hosts_worker.h"
#include "test_pattern.h"
#include "transfer/shm_mapping.h"

namespace {

namespace pb = ::granary::proto;

constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;
constexpr int kExitRpc = 3;
constexpr int kExitWrongBytes = 4;
constexpr int kExitNoShm = 5;
constexpr int kExitNotKilled = 6;

std::unique_ptr<pb::Master::Stub> Stub(const std::string& address) {
  return pb::Master::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

void Deadline(grpc::ClientContext& ctx, int ms) {
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
}

std::string ClientId(const std::string& role) {
  return "test-worker-" + role + "-" + std::to_string(getpid());
}

int HangUntilKilled(int max_seconds) {
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(max_seconds));
  std::fprintf(stderr, "granary-test-worker: not killed within %d s; exiting\n", max_seconds);
  return kExitNotKilled;
}

int PutStartAndHang(const std::string& master, const std::string& key, uint64_t size,
                    uint32_t replicas, int max_hang_s) {
  auto stub = Stub(master);
  pb::BatchPutStartRequest req;
  req.set_client_id(ClientId("put"));
  req.add_keys(key);
  req.add_sizes(size);
  req.mutable_config()->set_replica_num(replicas);
  pb::BatchPutStartResponse resp;
  grpc::ClientContext ctx;
  Deadline(ctx, 10'000);
  grpc::Status s = stub->BatchPutStart(&ctx, req, &resp);
  if (!s.ok()) {
    std::fprintf(stderr, "BatchPutStart failed: %d %s\n", static_cast<int>(s.error_code()),
                 s.error_message().c_str());
    return kExitRpc;
  }
  if (resp.results_size() != 1 || resp.results(0).code() != 0) {
    std::fprintf(stderr, "BatchPutStart answered %s\n",
                 resp.results_size() == 1 ? resp.results(0).message().c_str() : "no result");
    return kExitRpc;
  }
  std::printf("started %d replica(s)\n", resp.results(0).replicas_size());
  return HangUntilKilled(max_hang_s);
}

// Reserves `count` extents of `size` bytes for one-round-trip puts, then hangs holding them.
int ReserveAndHang(const std::string& master, uint64_t size, uint32_t count, int max_hang_s) {
  auto stub = Stub(master);
  pb::ReserveRequest req;
  req.set_client_id(ClientId("reserve"));
  req.set_size(size);
  req.set_count(count);
  pb::ReserveResponse resp;
  grpc::ClientContext ctx;
  Deadline(ctx, 10'000);
  grpc::Status s = stub->Reserve(&ctx, req, &resp);
  if (!s.ok() || resp.code() != 0) {
    std::fprintf(stderr, "Reserve failed: %s\n",
                 s.ok() ? resp.message().c_str() : s.error_message().c_str());
    return kExitRpc;
  }
  std::printf("reserved %d\n", resp.granted_size());
  std::fflush(stdout);
  return HangUntilKilled(max_hang_s);
}

int GetAndHang(const std::string& master, const std::vector<std::string>& keys, int max_hang_s) {
  auto stub = Stub(master);
  pb::BatchGetReplicaListRequest req;
  req.set_client_id(ClientId("get"));
  for (const auto& key : keys) req.add_keys(key);
  pb::BatchGetReplicaListResponse resp;
  grpc::ClientContext ctx;
  Deadline(ctx, 10'000);
  grpc::Status s = stub->BatchGetReplicaList(&ctx, req, &resp);
  if (!s.ok()) {
    std::fprintf(stderr, "BatchGetReplicaList failed: %d %s\n", static_cast<int>(s.error_code()),
                 s.error_message().c_str());
    return kExitRpc;
  }
  if (resp.results_size() != static_cast<int>(keys.size())) {
    std::fprintf(stderr, "BatchGetReplicaList answered %d results for %zu keys\n",
                 resp.results_size(), keys.size());
    return kExitRpc;
  }
  for (int i = 0; i < resp.results_size(); ++i) {
    if (resp.results(i).code() != 0) {
      std::fprintf(stderr, "BatchGetReplicaList of %s answered %d %s\n", keys[i].c_str(),
                   resp.results(i).code(), resp.results(i).message().c_str());
      return kExitRpc;
    }
  }
  std::printf("locked (lease %llu ms)\n", static_cast<unsigned long long>(resp.lease_ttl_ms()));
  return HangUntilKilled(max_hang_s);
}

// The client's same-host write (client/replica_io.cc), cut in two by a pause: the token check
// before the copy, the copy itself, the check after it. The value is Pattern("paused-" + key).
int ShmPutPaused(const std::string& master, const std::string& key, uint64_t size) {
  auto stub = Stub(master);
  pb::BatchPutStartRequest req;
  req.set_client_id(ClientId("shm-put"));
  req.add_keys(key);
  req.add_sizes(size);
  req.mutable_config()->set_replica_num(1);
  pb::BatchPutStartResponse resp;
  grpc::ClientContext ctx;
  Deadline(ctx, 10'000);
  grpc::Status s = stub->BatchPutStart(&ctx, req, &resp);
  if (!s.ok() || resp.results_size() != 1 || resp.results(0).code() != 0 ||
      resp.results(0).replicas_size() != 1) {
    std::fprintf(stderr, "BatchPutStart failed: %s\n",
                 !s.ok() ? s.error_message().c_str()
                         : (resp.results_size() == 1 ? resp.results(0).message().c_str() : "?"));
    return kExitRpc;
  }
  const pb::Replica replica = resp.results(0).replicas(0);
  pb::ListSegmentsResponse list;
  grpc::ClientContext list_ctx;
  Deadline(list_ctx, 10'000);
  if (!stub->ListSegments(&list_ctx, pb::ListSegmentsRequest(), &list).ok()) return kExitRpc;
  std::string shm_name;
  uint64_t segment_size = 0;
  for (const auto& info : list.segments()) {
    if (info.segment_id() == replica.segment_id()) {
      shm_name = info.shm_name();
      segment_size = info.size();
    }
  }
  auto mapping = granary::transfer::ShmMapping::Attach(shm_name, segment_size);
  if (!mapping.ok()) {
    std::fprintf(stderr, "attach %s: %s\n", shm_name.c_str(), mapping.status().ToString().c_str());
    return kExitNoShm;
  }
  if ((*mapping)->token() != replica.token() || replica.offset() > segment_size ||
      size > segment_size - replica.offset()) {
    std::fprintf(stderr, "the replica is not of the segment's current mount\n");
    return kExitNoShm;
  }
  const std::vector<std::byte> value = granary::testdata::Pattern("paused-" + key, size);
  std::byte* dst = (*mapping)->data() + replica.offset();
  const uint64_t half = size / 2;
  std::memcpy(dst, value.data(), half);
  std::printf("copied half: segment %s offset %llu length %llu\n", replica.segment_name().c_str(),
              static_cast<unsigned long long>(replica.offset()),
              static_cast<unsigned long long>(size));
  std::fflush(stdout);
  raise(SIGSTOP);  // the pause: SIGCONT resumes the copy where it stopped
  std::memcpy(dst + half, value.data() + half, size - half);
  const bool remounted = (*mapping)->token() != replica.token();
  std::printf("%s\n", remounted ? "remounted during the write" : "copied under the same mount");
  return kExitOk;
}

int Worker(const std::string& master, const std::string& id, size_t objects, uint64_t size,
           bool use_shm, bool require_shm) {
  granary::ClientOptions options;
  options.master_address = master;
  options.segment_size = 0;
  options.use_shared_memory = use_shm;
  options.rpc_timeout_ms = 10'000;
  options.io_timeout_ms = 10'000;
  auto connected = granary::Client::Connect(options);
  if (!connected.ok()) {
    std::fprintf(stderr, "worker %s: connect: %s\n", id.c_str(),
                 connected.status().ToString().c_str());
    return kExitRpc;
  }
  granary::Client& client = **connected;

  std::vector<std::string> keys;
  std::vector<std::vector<std::byte>> values;
  std::vector<granary::ByteSpan> spans;
  for (size_t j = 0; j < objects; ++j) {
    keys.push_back("worker-" + id + "-" + std::to_string(j));
    values.push_back(granary::testdata::Pattern(keys.back(), size));
  }
  for (const auto& v : values) spans.emplace_back(v);
  auto put = client.BatchPut(keys, spans);
  for (size_t j = 0; j < objects; ++j) {
    if (!put[j].ok()) {
      std::fprintf(stderr, "worker %s: put %s: %s\n", id.c_str(), keys[j].c_str(),
                   put[j].ToString().c_str());
      return kExitRpc;
    }
  }

  std::vector<std::vector<std::byte>> back(objects, std::vector<std::byte>(size, std::byte{0}));
  std::vector<granary::MutableByteSpan> buffers;
  for (auto& b : back) buffers.emplace_back(b);
  auto got = client.BatchGetInto(keys, buffers);
  for (size_t j = 0; j < objects; ++j) {
    if (!got[j].ok()) {
      std::fprintf(stderr, "worker %s: get %s: %s\n", id.c_str(), keys[j].c_str(),
                   got[j].status().ToString().c_str());
      return kExitRpc;
    }
    if (*got[j] != size) {
      std::fprintf(stderr, "worker %s: get %s: size %llu, expected %llu\n", id.c_str(),
                   keys[j].c_str(), static_cast<unsigned long long>(*got[j]),
                   static_cast<unsigned long long>(size));
      return kExitWrongBytes;
    }
    int64_t diff = granary::testdata::FirstDifference(back[j], values[j]);
    if (diff >= 0) {
      std::fprintf(stderr, "worker %s: get %s: wrong byte at offset %lld\n", id.c_str(),
                   keys[j].c_str(), static_cast<long long>(diff));
      return kExitWrongBytes;
    }
  }
  if (require_shm && !granary::hosts::MapsSharedSegment()) {
    std::fprintf(stderr, "worker %s: no /dev/shm/granary-* segment is mapped: the same-host "
                         "path was not used\n", id.c_str());
    return kExitNoShm;
  }
  client.Close();
  std::printf("worker %s: %zu objects of %llu bytes stored and verified\n", id.c_str(), objects,
              static_cast<unsigned long long>(size));
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"granary-test-worker: client processes for the Granary integration tests"};
  app.require_subcommand(1);
  std::string master = "127.0.0.1:50051";
  std::string key, id;
  std::vector<std::string> get_keys;
  uint64_t size = 0;
  uint32_t replicas = 1;
  size_t objects = 0;
  int max_hang_s = 120;
  bool no_shm = false, require_shm = false;

  auto* put = app.add_subcommand("put-start-and-hang", "put-start one key, then hang");
  put->add_option("--master", master)->required();
  put->add_option("--key", key)->required();
  put->add_option("--size", size)->required();
  put->add_option("--replicas", replicas);
  put->add_option("--max-hang", max_hang_s, "seconds to hang before giving up");

  uint32_t reserve_count = 1;
  auto* reserve = app.add_subcommand("reserve-and-hang", "reserve extents, then hang");
  reserve->add_option("--master", master)->required();
  reserve->add_option("--size", size)->required();
  reserve->add_option("--count", reserve_count)->check(CLI::Range(1u, 65536u));
  reserve->add_option("--max-hang", max_hang_s, "seconds to hang before giving up");

  auto* get = app.add_subcommand("get-and-hang", "take a read lock on one key, then hang");
  get->add_option("--master", master)->required();
  get->add_option("--key", get_keys, "a key to lock (repeat for more)")->required();
  get->add_option("--max-hang", max_hang_s, "seconds to hang before giving up");

  auto* worker = app.add_subcommand("worker", "put N objects, read them back, verify");
  worker->add_option("--master", master)->required();
  worker->add_option("--id", id)->required();
  worker->add_option("--objects", objects)->required();
  worker->add_option("--size", size)->required();
  worker->add_flag("--no-shm", no_shm, "use TCP even on this host");
  worker->add_flag("--require-shm-mapping", require_shm,
                   "fail unless a node's segment got mapped into this process");

  granary::chaos::WorkerOptions chaos_options;
  bool chaos_no_shm = false;
  auto* chaos = app.add_subcommand("chaos", "mixed verified load until <dir>/stop exists");
  chaos->add_option("--master", chaos_options.master)->required();
  chaos->add_option("--id", chaos_options.id)->required();
  chaos->add_option("--dir", chaos_options.dir, "where the attempt/read logs go")->required();
  chaos->add_option("--read-ids", chaos_options.read_ids, "other workers whose keys to read")
      ->delimiter(',');
  chaos->add_option("--seconds", chaos_options.seconds, "stop after this long at the latest");
  chaos->add_option("--threads", chaos_options.threads)->check(CLI::Range(1, 16));
  chaos->add_option("--keys", chaos_options.keys, "own keys")->check(CLI::Range(1, 100000));
  chaos->add_option("--seed", chaos_options.seed);
  chaos->add_option("--min-size", chaos_options.min_size)->check(CLI::Range(64u, 1u << 30));
  chaos->add_option("--max-size", chaos_options.max_size)->check(CLI::Range(64u, 1u << 30));
  chaos->add_flag("--no-shm", chaos_no_shm, "use TCP even on this host");

  auto* shm_put = app.add_subcommand("shm-put-paused",
                                     "same-host put that stops itself halfway through its copy");
  shm_put->add_option("--master", master)->required();
  shm_put->add_option("--key", key)->required();
  shm_put->add_option("--size", size)->required()->check(CLI::Range(uint64_t{2}, uint64_t{1} << 30));

  granary::hosts::ObjectsOptions objects_options;
  std::string objects_mode;
  bool objects_no_shm = false;
  auto* objects_cmd = app.add_subcommand("objects", "put or get verified objects (hosts test)");
  objects_cmd->add_option("mode", objects_mode, "put, get or stat")
      ->required()
      ->check(CLI::IsMember({"put", "get", "stat"}));
  objects_cmd->add_option("--master", objects_options.master)->required();
  objects_cmd->add_option("--prefix", objects_options.prefix);
  objects_cmd->add_option("--objects", objects_options.objects)->check(CLI::Range(1, 100000));
  objects_cmd->add_option("--min-size", objects_options.min_size);
  objects_cmd->add_option("--max-size", objects_options.max_size)
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  objects_cmd->add_option("--replicas", objects_options.replicas)->check(CLI::Range(1, 16));
  objects_cmd->add_option("--batch", objects_options.batch)->check(CLI::Range(1, 1024));
  objects_cmd->add_flag("--no-shm", objects_no_shm, "use TCP even on this host");
  std::string rtt_endpoint;
  int rtt_count = 20;
  auto* rtt_cmd = app.add_subcommand("rtt", "time TCP handshakes to IP:PORT");
  rtt_cmd->add_option("--endpoint", rtt_endpoint)->required();
  rtt_cmd->add_option("--count", rtt_count)->check(CLI::Range(1, 10000));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  // Whatever happens, the worker does not outlive a broken test for long.
  if (chaos->parsed()) max_hang_s = chaos_options.seconds;
  alarm(static_cast<unsigned>(max_hang_s + 60));
  if (put->parsed()) return PutStartAndHang(master, key, size, replicas, max_hang_s);
  if (get->parsed()) return GetAndHang(master, get_keys, max_hang_s);
  if (reserve->parsed()) return ReserveAndHang(master, size, reserve_count, max_hang_s);
  if (shm_put->parsed()) return ShmPutPaused(master, key, size);
  if (objects_cmd->parsed()) {
    using Mode = granary::hosts::ObjectsOptions::Mode;
    objects_options.mode = objects_mode == "put"   ? Mode::kPut
                           : objects_mode == "get" ? Mode::kGet
                                                   : Mode::kStat;
    objects_options.use_shm = !objects_no_shm;
    return granary::hosts::RunObjects(objects_options);
  }
  if (rtt_cmd->parsed()) return granary::hosts::RunConnectRtt(rtt_endpoint, rtt_count);
  if (chaos->parsed()) {
    chaos_options.use_shm = !chaos_no_shm;
    if (chaos_options.min_size > chaos_options.max_size) {
      std::fprintf(stderr, "--min-size exceeds --max-size\n");
      return kExitUsage;
    }
    return granary::chaos::RunWorker(chaos_options);
  }
  if (worker->parsed()) {
    if (objects == 0 || size == 0) {
      std::fprintf(stderr, "--objects and --size must be positive\n");
      return kExitUsage;
    }
    return Worker(master, id, objects, size, !no_shm, require_shm);
  }
  return kExitUsage;
}
