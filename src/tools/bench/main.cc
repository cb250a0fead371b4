// granary-bench: benchmark drivers. `granary-bench --help` lists the suites.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "common/units.h"
#include "tools/bench/bench.h"

int main(int argc, char** argv) {
  using namespace granary::bench;
  CLI::App app{"granary-bench: benchmark drivers for Granary"};
  app.require_subcommand(1);

  MasterBenchOptions mo;
  auto* master = app.add_subcommand("master", "control-plane ops/s against a running master");
  master->add_option("--master", mo.master, "master address HOST:PORT")->capture_default_str();
  master->add_option("--segments", mo.segments, "segments to mount")
      ->capture_default_str()->check(CLI::Range(1u, 4096u));
  master->add_option("--threads", mo.threads, "client thread counts to run")
      ->capture_default_str()->delimiter(',');
  master->add_option("--seconds", mo.seconds, "duration of each case")
      ->capture_default_str()->check(CLI::Range(0.1, 600.0));
  master->add_option("--batch", mo.batch, "keys per batch")
      ->capture_default_str()->check(CLI::Range(1u, 65536u));
  master->add_option("--value-size", mo.value_size, "object size in bytes")->capture_default_str();
  master->add_option("--path", mo.path,
                     "how the hot calls travel: auto (fast port if the master has one, as the "
                     "client does), grpc or fast")
      ->capture_default_str()->check(CLI::IsMember({"auto", "grpc", "fast"}));
  master->add_option("--ops", mo.ops, "cases to run, e.g. get to profile one alone")
      ->capture_default_str()->delimiter(',')
      ->check(CLI::IsMember({"tcp", "ping", "put", "get", "exist"}));
  master->add_option("--json", mo.json_path, "also write the results as JSON to this file");
  master->add_option("--cache-ms", mo.cache_ms,
                     "gets ask a cache lease this long, as a client's location cache does (0: none)")
      ->capture_default_str();

  StateBenchOptions so;
  auto* state = app.add_subcommand("state", "the master's state machine in process, no RPC");
  state->add_option("--segments", so.segments, "segments to mount")->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  state->add_option("--threads", so.threads, "thread counts to run")->capture_default_str()
      ->delimiter(',');
  state->add_option("--seconds", so.seconds, "duration of each case")->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  state->add_option("--batch", so.batch, "keys per batch")->capture_default_str()
      ->check(CLI::Range(1u, 65536u));
  state->add_option("--eviction-policy", so.eviction_policy, "the master's eviction policy")
      ->capture_default_str()->check(CLI::IsMember({"lru", "s3fifo", "prefix"}));
  state->add_option("--apply-turn-ops", so.apply_turn_ops, "the master's --apply-turn-ops")
      ->capture_default_str()->check(CLI::Range(1u, 4096u));
  state->add_option("--apply-combine-waiting", so.apply_combine_waiting,
                    "the master's --apply-combine-waiting")
      ->capture_default_str()->check(CLI::Range(1u, 4096u));
  state->add_option("--apply-groups", so.apply_groups, "the master's --apply-groups");
  state->add_option("--ops", so.ops, "cases to run, e.g. put to profile one alone")
      ->capture_default_str()->delimiter(',')->check(CLI::IsMember({"put", "get", "exist"}));
  state->add_option("--json", so.json_path, "also write the results as JSON to this file");

  TransferBenchOptions to;
  auto* transfer = app.add_subcommand("transfer", "object put/get GB/s and latency, shm and TCP");
  transfer->add_option("--master", to.master, "master address HOST:PORT")->capture_default_str();
  transfer->add_option("--sizes", to.sizes, "object sizes")->capture_default_str()->delimiter(',');
  transfer->add_option("--paths", to.paths, "shm, tcp")->capture_default_str()->delimiter(',')
      ->check(CLI::IsMember({"shm", "tcp"}));
  transfer->add_option("--seconds", to.seconds, "duration of each case")->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  transfer->add_option("--threads", to.threads, "client threads")->capture_default_str()
      ->check(CLI::Range(1, 64));
  transfer->add_option("--batch", to.batch, "objects per call")->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  transfer->add_option("--json", to.json_path, "also write the results as JSON to this file");

  KvBenchOptions ko;
  auto* kv = app.add_subcommand("kv", "object put/get: Granary shm and TCP next to Redis, memcached");
  kv->add_option("--master", ko.master, "Granary master HOST:PORT (granary targets)");
  kv->add_option("--redis", ko.redis, "redis-server HOST:PORT");
  kv->add_option("--memcached", ko.memcached, "memcached HOST:PORT");
  kv->add_option("--targets", ko.targets, "targets to run")->capture_default_str()->delimiter(',')
      ->check(CLI::IsMember({"granary-shm", "granary-shm-cold", "granary-tcp", "redis", "memcached"}));
  kv->add_option("--sizes", ko.sizes, "value sizes")->capture_default_str()->delimiter(',');
  kv->add_option("--clients", ko.clients, "concurrent clients (threads, one connection each)")
      ->capture_default_str()->delimiter(',')->check(CLI::Range(1, 64));
  kv->add_option("--seconds", ko.seconds, "duration of each put and get case")
      ->capture_default_str()->check(CLI::Range(0.1, 600.0));
  kv->add_option("--budget", ko.budget, "bytes put per case at most")->capture_default_str();
  kv->add_option("--limits-json", ko.limits_json, "read memcpy/TCP limits from `limits --json`");
  kv->add_option("--json", ko.json_path, "also write the results as JSON to this file");
  kv->add_option("--location-cache-ms", ko.location_cache_ms,
                 "Granary clients' location cache (ClientOptions::location_cache_ms; 0: every "
                 "get asks the master; default: the client's)");

  ScaleBenchOptions sco;
  auto* scale = app.add_subcommand("scale", "master RSS per object, batch exist and OffloadStart at millions of objects");
  scale->add_option("--master", sco.master, "master address HOST:PORT")->capture_default_str();
  scale->add_option("--master-pid", sco.master_pid, "the master's pid (RSS from /proc)")->required();
  scale->add_option("--objects", sco.objects, "object counts to fill up to, ascending")
      ->capture_default_str()->delimiter(',');
  scale->add_option("--value-size", sco.value_size, "object size in bytes")->capture_default_str();
  scale->add_option("--put-batch", sco.put_batch, "keys per put batch")->capture_default_str()
      ->check(CLI::Range(1u, 65536u));
  scale->add_option("--put-threads", sco.put_threads, "threads filling the master")
      ->capture_default_str()->check(CLI::Range(1, 64));
  scale->add_option("--exist-batch", sco.exist_batch, "keys per BatchExist")->capture_default_str()
      ->check(CLI::Range(1u, 65536u));
  scale->add_option("--threads", sco.threads, "client thread counts for exist")
      ->capture_default_str()->delimiter(',');
  scale->add_option("--seconds", sco.seconds, "duration of each exist case")->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  scale->add_option("--json", sco.json_path, "also write the results as JSON to this file");

  LimitsOptions lo;
  GpuCopyBenchOptions go;
  auto* gpu_copy = app.add_subcommand(
      "gpu-copy", "same-host copies between pinned shared memory and a GPU, with the checksum");
  gpu_copy->add_option("--bytes", go.bytes, "bytes moved per case")->capture_default_str();
  gpu_copy->add_option("--objects", go.objects, "object sizes in bytes")->capture_default_str()
      ->delimiter(',');
  gpu_copy->add_option("--threads", go.threads, "thread counts")->capture_default_str()
      ->delimiter(',')->check(CLI::Range(1, 256));
  gpu_copy->add_option("--modes", go.modes, "dma-each, dma-batch, hash, each, batch")
      ->capture_default_str()->delimiter(',')
      ->check(CLI::IsMember({"dma-each", "dma-batch", "hash", "each", "batch"}));
  gpu_copy->add_option("--directions", go.directions, "h2d (gets), d2h (puts)")
      ->capture_default_str()->delimiter(',')->check(CLI::IsMember({"h2d", "d2h"}));
  gpu_copy->add_option("--repeats", go.repeats, "passes per case; the best counts")
      ->capture_default_str()->check(CLI::Range(1, 100));
  gpu_copy->add_option("--json", go.json_path, "also write the results as JSON to this file");

  auto* limits = app.add_subcommand("limits", "this machine's memcpy, loopback TCP, disk GB/s");
  limits->add_option("--seconds", lo.seconds, "duration of each measurement")
      ->capture_default_str()->check(CLI::Range(0.1, 60.0));
  limits->add_option("--disk-dir", lo.disk_dir, "directory for the O_DIRECT test file")
      ->capture_default_str();
  limits->add_option("--disk-bytes", lo.disk_bytes, "bytes written and read")->capture_default_str();
  limits->add_option("--tcp-streams", lo.tcp_streams, "TCP stream counts")
      ->capture_default_str()->delimiter(',');
  limits->add_option("--first-access-bytes", lo.first_access_bytes,
                     "size of the shared-memory file of the first-access limit")
      ->capture_default_str();
  limits->add_option("--json", lo.json_path, "also write the results as JSON to this file");

  TraceBenchOptions tro;
  auto* trace = app.add_subcommand("trace", "replay a conversation trace: prefix hit rate");
  trace->add_option("--master", tro.master, "master address HOST:PORT")->capture_default_str();
  trace->add_option("--trace", tro.trace_path, "trace file (JSON lines)")->capture_default_str();
  trace->add_option("--bytes-per-token", tro.bytes_per_token, "block size = 512 x this")
      ->capture_default_str()->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  trace->add_option("--limit", tro.limit, "replay only the first N requests (0: all)")
      ->capture_default_str();
  trace->add_option("--speed", tro.speed,
                    "replay at the trace's arrival times divided by this (0: as fast as possible)")
      ->capture_default_str()->check(CLI::Range(0.0, 1e6));
  trace->add_option("--lookup", tro.lookup, "exist (BatchExist) or prefix (PrefixMatch)")
      ->capture_default_str()->check(CLI::IsMember({"exist", "prefix"}));
  trace->add_option("--path", tro.path, "shm or tcp")->capture_default_str()
      ->check(CLI::IsMember({"shm", "tcp"}));
  trace->add_option("--key-prefix", tro.key_prefix, "object keys are PREFIX/<hash id>")
      ->capture_default_str();
  trace->add_option("--verify", tro.verify, "check every fetched byte")->capture_default_str();
  trace->add_option("--label", tro.label, "free text copied into the JSON");
  trace->add_option("--json", tro.json_path, "also write the results as JSON to this file");
  trace->add_option("--simulate", tro.simulate,
                    "no store: replay through the master's own eviction code in process, for "
                    "these policies (lru, s3fifo, prefix; belady and infinite as references; all)")
      ->delimiter(',')
      ->check(CLI::IsMember({"lru", "s3fifo", "prefix", "belady", "infinite", "all"}));
  trace->add_option("--capacity-tokens", tro.capacity_tokens,
                    "with --simulate: cache capacities in tokens (512-token blocks)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{512}, uint64_t{1} << 40));
  trace->add_option("--disk-tokens", tro.disk_tokens,
                    "with --simulate: a disk tier of this many tokens beside memory (0: none)")
      ->capture_default_str()->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40));
  trace->add_option("--disk-eviction", tro.disk_eviction,
                    "with --disk-tokens: lru (per copy on buckets), lru-units or fifo")
      ->capture_default_str()->check(CLI::IsMember({"lru", "lru-units", "fifo"}));
  trace->add_option("--disk-backend", tro.disk_backend,
                    "with --disk-tokens: bucket (units of 500 copies) or file (one copy a unit)")
      ->capture_default_str()->check(CLI::IsMember({"bucket", "file"}));
  trace->add_option("--disk-bucket-bytes", tro.disk_bucket_bytes,
                    "with --disk-backend bucket: a bucket's data at most (0: the store's rule)")
      ->capture_default_str();
  trace->add_option("--offload-interval-ms", tro.offload_interval_ms,
                    "with --disk-tokens: the node's offload interval, in its own time")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{600000}));
  trace->add_option("--promote-after", tro.promote_after,
                    "with --disk-tokens: the master's --promote-after (0: no promotion)")
      ->capture_default_str();

  DiskBenchOptions dko;
  auto* disk = app.add_subcommand("disk", "the disk tier in process: write and batched read GB/s");
  disk->add_option("--dir", dko.dir, "directory to write in (a fresh subdirectory per case)")
      ->capture_default_str();
  disk->add_option("--backends", dko.backends, "bucket, file, offset")->capture_default_str()
      ->delimiter(',')->check(CLI::IsMember({"bucket", "file", "offset"}));
  disk->add_option("--io", dko.io, "io_uring, posix")->capture_default_str()->delimiter(',')
      ->check(CLI::IsMember({"io_uring", "posix"}));
  disk->add_option("--sizes", dko.sizes, "object sizes")->capture_default_str()->delimiter(',');
  disk->add_option("--batch", dko.batch, "objects per write and per read call")
      ->capture_default_str()->check(CLI::Range(1u, 4096u));
  disk->add_option("--bytes", dko.bytes, "bytes written per case")->capture_default_str();
  disk->add_option("--seconds", dko.seconds, "duration of each read case")->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  disk->add_option("--eviction", dko.eviction,
                   "the store's eviction policy (lru: buckets up to 500 objects; lru-units, fifo: "
                   "buckets of 1/1024 of the budget)")
      ->capture_default_str()->check(CLI::IsMember({"lru", "lru-units", "fifo"}));
  disk->add_option("--json", dko.json_path, "also write the results as JSON to this file");

  DiskHitBenchOptions dho;
  std::string dh_bytes = "256MiB";
  auto* diskhit = app.add_subcommand(
      "diskhit", "gets served from a node's disk tier, end to end (phases around a master restart)");
  diskhit->add_option("--master", dho.master, "master address HOST:PORT")->capture_default_str();
  diskhit->add_option("--phase", dho.phase, "put: store and wait for offload; get: measure")
      ->capture_default_str()->check(CLI::IsMember({"put", "get"}));
  diskhit->add_option("--sizes", dho.sizes, "object sizes")->capture_default_str()->delimiter(',');
  diskhit->add_option("--batch", dho.batch, "objects per call")->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  diskhit->add_option("--bytes", dh_bytes, "bytes of objects per size")->capture_default_str();
  diskhit->add_option("--seconds", dho.seconds, "gets per size after the first pass")
      ->capture_default_str()->check(CLI::Range(0.0, 600.0));
  diskhit->add_option("--wait-seconds", dho.wait_seconds, "bound on waiting for offload/registration")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  diskhit->add_option("--prefix", dho.prefix, "key prefix")->capture_default_str();
  diskhit->add_option("--transport", dho.transport,
                      "get phase: shm (same-host staging where the node offers it) or tcp")
      ->capture_default_str()->check(CLI::IsMember({"shm", "tcp"}));
  diskhit->add_option("--label", dho.label, "free text copied into the JSON");
  diskhit->add_option("--json", dho.json_path, "also write the results as JSON to this file");

  DiskRecoveryBenchOptions dro;
  auto* diskrecover = app.add_subcommand(
      "diskrecover", "how long the disk store takes to open N objects again, after a crash and clean");
  diskrecover->add_option("--dir", dro.dir, "directory to write in (a fresh subdirectory per case)")
      ->capture_default_str();
  diskrecover->add_option("--backends", dro.backends, "bucket, file, offset")
      ->capture_default_str()->delimiter(',')->check(CLI::IsMember({"bucket", "file", "offset"}));
  diskrecover->add_option("--objects", dro.objects, "objects on disk")->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{100'000'000}));
  diskrecover->add_option("--size", dro.size, "bytes per object")->capture_default_str();
  diskrecover->add_option("--batch", dro.batch, "objects per write call")->capture_default_str()
      ->check(CLI::Range(1u, 4096u));
  diskrecover->add_option("--keep", dro.keep, "leave the last backend's store in this directory");
  diskrecover->add_option("--json", dro.json_path, "also write the results as JSON to this file");

  FailoverBenchOptions fo;
  auto* failover = app.add_subcommand(
      "failover", "HA: kill -9 the leader N times: time to the first put, objects kept");
  failover->add_option("--bin", fo.bin_dir, "directory of granary-master and granary-node")
      ->capture_default_str();
  failover->add_option("--etcd", fo.etcd, "endpoints of a running etcd, HOST:PORT[;...]")
      ->required();
  failover->add_option("--cluster-id", fo.cluster_id, "the masters' cluster id")
      ->capture_default_str();
  failover->add_option("--masters", fo.masters, "masters to run")->capture_default_str()
      ->check(CLI::Range(2, 9));
  failover->add_option("--kills", fo.kills, "leaders to kill")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  failover->add_option("--objects", fo.objects_per_round, "acknowledged puts before each kill")
      ->capture_default_str();
  failover->add_option("--object-size", fo.object_size, "bytes per object")->capture_default_str();
  failover->add_option("--segment-size", fo.segment_size, "the node's segment in bytes")
      ->capture_default_str();
  failover->add_flag("--full", fo.full, "fill the segment first: every put after a kill evicts");
  failover->add_option("--master-flags", fo.master_flags, "extra flags for every master")
      ->capture_default_str()->delimiter(',');
  failover->add_option("--json", fo.json_path, "also write the results as JSON to this file");

  CLI11_PARSE(app, argc, argv);
  if (failover->parsed()) return RunFailoverBench(fo);
  if (diskrecover->parsed()) return RunDiskRecoveryBench(dro);
  if (diskhit->parsed()) {
    auto bytes = granary::ParseSize(dh_bytes);
    if (!bytes.ok()) {
      std::fprintf(stderr, "granary-bench: bad --bytes %s\n", dh_bytes.c_str());
      return 2;
    }
    dho.bytes = *bytes;
    return RunDiskHitBench(dho);
  }
  if (disk->parsed()) return RunDiskBench(dko);
  if (master->parsed()) return RunMasterBench(mo);
  if (limits->parsed()) return RunLimits(lo);
  if (gpu_copy->parsed()) return RunGpuCopyBench(go);
  if (state->parsed()) return RunStateBench(so);
  if (transfer->parsed()) return RunTransferBench(to);
  if (trace->parsed()) return tro.simulate.empty() ? RunTraceBench(tro) : RunTraceSimulation(tro);
  if (kv->parsed()) return RunKvBench(ko);
  if (scale->parsed()) return RunScaleBench(sco);
  return 2;
}
