// tools/bench/bench.h - the subcommands of granary-bench, each in its own file.
//
// Each Run* function runs one suite in the calling process, prints a table to stdout and, when
// json_path is set, writes the same figures as JSON. Returns a process exit code.
#pragma once

#include <netinet/in.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace granary::bench {

// The p-th percentile (0..100, e.g. 99.9) of sorted samples; 0 for none.
inline double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(sorted.size() * p / 100))];
}

struct MasterBenchOptions {
  std::string master = "127.0.0.1:50051";
  uint32_t segments = 128;
  std::vector<int> threads = {1, 2, 4};
  double seconds = 3;
  uint32_t batch = 128;
  uint64_t value_size = 4096;
  uint64_t segment_size = uint64_t{1} << 30;
  std::string path = "auto";  // auto (what the client uses), grpc or fast
  std::vector<std::string> ops = {"tcp", "ping", "put", "get", "exist"};  // cases to run (profiling)
  std::string json_path;
  uint64_t cache_ms = 0;  // gets ask a cache lease this long (ClientOptions::location_cache_ms)
};
int RunMasterBench(const MasterBenchOptions& options);

// The master's state machine in process (no RPC): put = start + end + remove, get = replica list +
// finish read, exist; keys/s per thread count.
struct StateBenchOptions {
  uint32_t segments = 128;
  std::vector<int> threads = {1, 2};
  double seconds = 2;
  uint32_t batch = 128;
  uint64_t value_size = 4096;
  std::string eviction_policy = "s3fifo";  // as the master's --eviction-policy
  std::vector<std::string> ops = {"put", "get", "exist"};
  uint32_t apply_turn_ops = 32;  // as the master's --apply-turn-ops
  uint32_t apply_combine_waiting = 4;  // as the master's --apply-combine-waiting
  bool apply_groups = false;           // as the master's --apply-groups
  std::string json_path;
};
int RunStateBench(const StateBenchOptions& options);

// Same-host copies between a pinned shared-memory file and GPU memory, with and without the
// checksum, per object size and thread count (gpu_copy_bench.cc lists the modes).
struct GpuCopyBenchOptions {
  uint64_t bytes = uint64_t{2} << 30;
  std::vector<uint64_t> objects = {64 << 10, 256 << 10, 8 << 20};
  std::vector<int> threads = {1, 4, 8, 16};
  std::vector<std::string> modes = {"dma-each", "dma-batch", "hash", "each", "batch"};
  std::vector<std::string> directions = {"h2d", "d2h"};
  int repeats = 2;
  std::string json_path;
};
int RunGpuCopyBench(const GpuCopyBenchOptions& options);

struct LimitsOptions {
  double seconds = 1;            // per measurement
  std::string disk_dir = "/tmp"; // where the O_DIRECT file goes
  uint64_t disk_bytes = uint64_t{1} << 30;
  std::vector<int> tcp_streams = {1, 4};
  uint64_t first_access_bytes = uint64_t{512} << 20;  // the shared-memory file of FirstAccessLimits
  std::string json_path;
};
// The machine's own ceilings: memcpy, loopback TCP, sequential disk with O_DIRECT, the first
// access to shared memory through a new mapping.
int RunLimits(const LimitsOptions& options);

// Ping-pong of `message_bytes` over one loopback TCP connection (TCP_NODELAY) for `seconds`.
struct RoundTrip {
  double p50_us = -1;
  double p99_us = -1;
  uint64_t samples = 0;
};
RoundTrip LoopbackRoundTrip(size_t message_bytes, double seconds);
// A 64-byte request answered with `answer_bytes` over a loopback TCP connection, timed from the
// request to the answer's last byte into a buffer already written once: what one object per call
// can take at best, where a stream (LoopbackTcpGBps) has no request and no wait between objects.
// The better p50 of two readers (plain recv()s; recv(MSG_WAITALL)), each on its own connection,
// `seconds` in all.
RoundTrip LoopbackAnswer(size_t answer_bytes, double seconds);
// The same over a unix stream socket pair: the master's local socket's limit (fast port).
RoundTrip UnixRoundTrip(size_t message_bytes, double seconds);

// A shared-memory file of `bytes`, fully written through one mapping, then written in 4 MiB
// memcpy blocks through new mappings: at once (first and second pass), and after a warm-up of the
// new mapping with MADV_POPULATE_READ (its time per GiB; -1 if the kernel lacks it). Also the
// time per GiB of the same warm-up done by reading one byte per 4 KiB page.
struct FirstAccess {
  uint64_t bytes = 0;
  double first_write_gbps = -1;
  double second_write_gbps = -1;
  double warm_seconds_per_gib = -1;
  double write_after_warm_gbps = -1;
  double touch_seconds_per_gib = -1;
  uint64_t touch_checksum = 0;
  std::string error;
};
FirstAccess FirstAccessLimits(uint64_t bytes);
// memcpy of `chunk`-byte blocks over buffers larger than the caches, on `threads` threads.
double MemcpyGBps(size_t chunk, double seconds, int threads = 1);
// How many threads can copy at once for `clients` clients: min(clients, cores).
inline int MemcpyThreadsFor(int clients) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::max(1, std::min(clients, cores));
}
// The limits' JSON name of 4 MiB-block memcpy on `threads` threads.
inline std::string MemcpyLimitName(int threads) {
  return threads == 1 ? "memcpy_4096KiB" : "memcpy_4096KiB_" + std::to_string(threads) + "_threads";
}
// A listening socket on 127.0.0.1 at a free port (written to *addr); -1 if it cannot be made.
int ListenLoopback(int backlog, sockaddr_in* addr);
// `streams` loopback TCP connections sending 1 MiB writes, the best of three ways to receive
// (limits_bench.cc), `seconds` each; -1 if sockets fail.
double LoopbackTcpGBps(int streams, double seconds);

// Object put/get throughput and latency through a running store, by path (shm, tcp) and size.
struct TransferBenchOptions {
  std::string master = "127.0.0.1:50051";
  std::vector<std::string> sizes = {"64KiB", "1MiB", "4MiB", "16MiB"};
  std::vector<std::string> paths = {"shm", "tcp"};
  double seconds = 2;
  int threads = 1;
  uint32_t batch = 1;  // objects per call (BatchPut / BatchGetInto when > 1)
  std::string json_path;
};
int RunTransferBench(const TransferBenchOptions& options);

// Replays a conversation trace against a running store: prefix hit rate, bytes, wall time; see
// trace_bench.cc.
struct TraceBenchOptions {
  std::string master = "127.0.0.1:50051";
  std::string trace_path = "../shared/workloads/conversation_trace.jsonl";
  uint64_t bytes_per_token = 128;  // 512-token blocks of 64 KiB
  uint64_t limit = 0;              // requests replayed; 0: all
  double speed = 0;                // > 0: requests at their arrival time / speed; 0: flat out
  std::string lookup = "exist";    // exist (BatchExist) or prefix (PrefixMatch)
  std::string path = "shm";        // shm or tcp
  std::string key_prefix = "trace";
  bool verify = true;
  std::string label;               // copied into the JSON (e.g. the capacity and policy)
  std::string json_path;
  // --simulate: no store; these policies (lru, s3fifo, prefix, belady, infinite; or all) at
  // each capacity, in process (trace_sim.cc).
  std::vector<std::string> simulate;
  std::vector<uint64_t> capacity_tokens = {1'000'000, 3'000'000};
  // With --simulate, a node's SSD tier beside memory (trace_sim_disk.h); 0: none. Its periodic
  // work is spaced by --speed in trace time.
  uint64_t disk_tokens = 0;
  std::string disk_eviction = "lru";    // the node's --disk-eviction
  std::string disk_backend = "bucket";  // bucket (500-copy units) or file (one copy a unit)
  uint64_t disk_bucket_bytes = 0;       // a bucket's data at most; 0: the store's (BucketBytes)
  int64_t offload_interval_ms = 100;    // the node's --offload-interval (bench/disk.sh's)
  uint32_t promote_after = 2;           // the master's --promote-after
};
int RunTraceBench(const TraceBenchOptions& options);
int RunTraceSimulation(const TraceBenchOptions& options);

// Object put/get of Granary (shm, tcp), Redis and memcached side by side; see kv_bench.cc.
struct KvBenchOptions {
  std::string master;     // granary targets skipped when empty
  std::string redis;      // HOST:PORT; skipped when empty
  std::string memcached;  // HOST:PORT; skipped when empty
  std::vector<std::string> targets = {"granary-shm", "granary-shm-cold", "granary-tcp", "redis",
                                      "memcached"};
  std::vector<std::string> sizes = {"64KiB", "1MiB", "4MiB", "16MiB"};
  std::vector<int> clients = {1, 4};
  double seconds = 2;
  uint64_t budget = uint64_t{1} << 30;  // bytes put per case at most, so every store holds them
  std::string limits_json;  // `limits --json` output to read the machine's ceilings from
  std::string json_path;
  int64_t location_cache_ms = -1;  // granary targets' ClientOptions::location_cache_ms; < 0: default
};
int RunKvBench(const KvBenchOptions& options);

// The master's RSS per object and batch-exist keys/s at millions of objects; see scale_bench.cc.
struct ScaleBenchOptions {
  std::string master = "127.0.0.1:50051";
  int master_pid = 0;
  std::vector<uint64_t> objects = {1'000'000, 5'000'000};
  uint64_t value_size = 1024;
  uint32_t put_batch = 1024;
  int put_threads = 2;
  uint32_t exist_batch = 128;
  std::vector<int> threads = {1, 4};
  double seconds = 3;
  std::string json_path;
};
int RunScaleBench(const ScaleBenchOptions& options);

// The disk tier in process (src/disk): write GB/s (batches of `batch` objects) and batched read
// GB/s (random keys, `batch` per call) per backend, I/O engine and object size; see disk_bench.cc.
struct DiskBenchOptions {
  std::string dir = "/tmp";  // each case gets a fresh directory in it, removed afterwards
  std::vector<std::string> backends = {"bucket", "file", "offset"};
  std::vector<std::string> io = {"io_uring", "posix"};
  std::vector<std::string> sizes = {"64KiB", "256KiB", "1MiB", "4MiB"};
  uint32_t batch = 32;
  std::string bytes = "512MiB";  // written per case
  double seconds = 2;                    // of reads per case
  std::string eviction = "lru";  // the node's default: it decides the bucket backend's bucket size
  std::string json_path;
};
int RunDiskBench(const DiskBenchOptions& options);

// Gets served from a node's disk tier end to end, around a master restart; see disk_hit_bench.cc.
struct DiskHitBenchOptions {
  std::string master = "127.0.0.1:50051";
  std::string phase = "get";  // put (then restart the master) or get
  std::vector<std::string> sizes = {"64KiB", "256KiB", "1MiB", "4MiB"};
  uint32_t batch = 32;              // objects per BatchPut / BatchGetInto
  uint64_t bytes = 256ull << 20;    // per size
  double seconds = 2;               // of gets per size, after the first pass over every key
  int wait_seconds = 120;           // for offload (put) or registration (get)
  std::string prefix = "diskhit";
  // Get phase: "shm" lets a same-host client load through the node's staging region (and map
  // its segment), "tcp" forces every byte over the data plane's sockets.
  std::string transport = "shm";
  std::string label;
  std::string json_path;
};
int RunDiskHitBench(const DiskHitBenchOptions& options);

// How long a node's disk store takes to open `objects` objects again, per backend: after a crash
// (the writer killed, no clean close) and after a clean close; see disk_recovery_bench.cc.
struct DiskRecoveryBenchOptions {
  std::string dir = "/tmp";
  std::vector<std::string> backends = {"bucket", "file", "offset"};
  uint64_t objects = 100000;
  std::string size = "16KiB";
  uint32_t batch = 500;  // objects per write call (a bucket's worth of keys)
  std::string keep;      // leave the last backend's store here (for a node to open), not removed
  std::string json_path;
};
int RunDiskRecoveryBench(const DiskRecoveryBenchOptions& options);

// HA failover (failover_bench.cc): starts `masters` masters against a running etcd and one node,
// then kills the leader `kills` times, timing the kill to the first successful put and checking
// that each round's acknowledged objects read back exact.
struct FailoverBenchOptions {
  std::string bin_dir = "build/bin";
  std::string etcd;                      // endpoints of a running etcd
  std::string cluster_id = "bench-failover";
  int masters = 3;
  int kills = 10;
  uint64_t segment_size = 64ull << 20;
  uint64_t object_size = 64 << 10;
  int objects_per_round = 100;
  bool full = false;                     // fill the segment first: every later put evicts
  std::vector<std::string> master_flags = {"--leader-lease", "1s", "--lease-margin", "300ms",
                                           "--standby-timeout", "500ms"};
  std::string json_path;
};
int RunFailoverBench(const FailoverBenchOptions& options);

}  // namespace granary::bench
