// granary-node: contributes a DRAM segment to a Granary store, or with --standalone runs a master
// and one node in one process (the embedded default, no other process and no etcd needed).
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>

#include "common/config_schema.h"
#include "common/logging.h"
#include "common/signals.h"
#include "common/units.h"
#include "master/master_config.h"
#include "master/master_server.h"
#include "node/storage_node.h"
#include "security/secret.h"
#include "security/tls.h"

namespace {

struct NodeConfig {
  std::string master = "127.0.0.1:50051";
  std::string cluster_id;
  uint64_t segment_size = 0;  // 0: fit the machine
  std::string host = "127.0.0.1";
  std::string advertise_host;
  uint16_t port = 0;
  std::string name;
  std::string log_level = "info";
  bool prefault = true;
  int64_t heartbeat_interval_ms = 1000;
  int64_t reclaim_interval_ms = 30'000;
  bool standalone = false;
  uint16_t master_port = 50051;
  // Text, so that "not given" differs from 0: alone it is the node's endpoint (absent or 0: off),
  // with --standalone the master's HTTP port as it always was (absent: 9003).
  std::string http_port;
  // The SSD tier (docs/disk.md); defaults are node::DiskTierSettings'.
  std::string disk_dir;
  uint64_t disk_size = 0;  // 0: 80% of the free space of disk_dir's filesystem
  std::string disk_backend = granary::node::DiskTierSettings{}.backend;
  std::string disk_eviction = granary::node::DiskTierSettings{}.eviction;
  std::string disk_io = granary::node::DiskTierSettings{}.io;
  int64_t offload_interval_ms = granary::node::DiskTierSettings{}.offload_interval_ms;
  int64_t copy_interval_ms = granary::node::StorageNodeOptions{}.copy_interval_ms;
  uint64_t disk_shm_staging = granary::node::StorageNodeOptions{}.disk_shm_staging_bytes;
  int64_t disk_staging_ttl_ms = granary::node::StorageNodeOptions{}.disk_staging_ttl_ms;
  uint64_t data_max_connections = granary::node::StorageNodeOptions{}.data_max_connections;
  uint64_t data_io_threads = granary::node::StorageNodeOptions{}.data_io_threads;
  int64_t data_request_timeout_ms = granary::node::StorageNodeOptions{}.data_request_timeout_ms;
  std::string auth_token_file;
  std::string tls_cert, tls_key, tls_ca;
  std::string etcd_auth_file;
  bool insecure = false;
};

// Half of what /dev/shm can still hold, a quarter of RAM, and at most 4 GiB.
uint64_t FittingSegmentSize() {
  uint64_t limit = uint64_t{4} << 30;
  struct statvfs shm {};
  if (statvfs("/dev/shm", &shm) == 0) {
    limit = std::min<uint64_t>(limit, static_cast<uint64_t>(shm.f_bavail) * shm.f_frsize / 2);
  }
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_size > 0) {
    limit = std::min<uint64_t>(limit, static_cast<uint64_t>(pages) * page_size / 4);
  }
  return std::max<uint64_t>(limit & ~uint64_t{(1 << 20) - 1}, 1 << 20);
}

// A TCP port, 0-65535, as the whole text; nullopt for anything else ("80x", "-1", "70000").
std::optional<uint16_t> ParsePort(const std::string& text) {
  unsigned value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value > 65535) return std::nullopt;
  return static_cast<uint16_t>(value);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace granary;
  sigset_t stop_signals = BlockStopSignals();

  NodeConfig c;
  ConfigSchema schema("granary-node: contributes a shared-memory segment to a Granary store");
  schema.AddString("master", &c.master,
                   "master address HOST:PORT, or etcd://HOST:PORT[;HOST:PORT...] to follow the "
                   "leader of an HA cluster (docs/ha.md)");
  schema.AddString("cluster_id", &c.cluster_id,
                   "HA: the cluster's name in etcd (with an etcd:// master; default "
                   "$GRANARY_CLUSTER_ID, else granary)");
  schema.AddSize("segment_size", &c.segment_size,
                 "bytes of DRAM to contribute (e.g. 512MB, 4GiB); 0 fits the machine");
  schema.AddString("host", &c.host, "address to bind the data plane to");
  schema.AddString("advertise_host", &c.advertise_host,
                   "address clients reach the data plane at (default: host)");
  schema.AddPort("port", &c.port, "data-plane TCP port (0 picks a free one)");
  schema.AddString("name", &c.name, "segment name, unique in the store (default: hostname-pid-<random>)");
  schema.AddString("log_level", &c.log_level, "trace, debug, info, warn, error or off");
  schema.AddBool("prefault", &c.prefault,
                 "reserve every page of the segment at start (--prefault=false to skip)");
  schema.AddDurationMs("heartbeat_interval", &c.heartbeat_interval_ms, "how often to ping the master");
  schema.AddDurationMs("reclaim_interval", &c.reclaim_interval_ms,
                       "how often to unlink /dev/shm segments of dead nodes on this host "
                       "(0: only at start)");
  schema.AddUint("data_max_connections", &c.data_max_connections,
                 "data-plane connections open at once; more are refused (raises RLIMIT_NOFILE)",
                 1, 1'000'000);
  schema.AddUint("data_io_threads", &c.data_io_threads,
                 "threads driving every data-plane connection's socket I/O", 1, 256);
  schema.AddDurationMs("data_request_timeout", &c.data_request_timeout_ms,
                       "a data-plane request's time to arrive and be answered, plus its bytes "
                       "at 1 MiB/s; a slower peer is disconnected");
  schema.AddString("disk_dir", &c.disk_dir,
                   "SSD tier: directory for disk copies of objects (empty: no disk tier)");
  schema.AddSize("disk_size", &c.disk_size,
                 "SSD tier: byte budget (0: 80% of the free space of disk_dir at start)");
  schema.AddString("disk_backend", &c.disk_backend, "SSD tier: bucket, file-per-key or offset");
  schema.AddString("disk_eviction", &c.disk_eviction, "SSD tier: lru (per copy), lru-units or fifo");
  schema.AddString("disk_io", &c.disk_io, "SSD tier: auto (io_uring where it works), uring or posix");
  schema.AddDurationMs("offload_interval", &c.offload_interval_ms,
                       "SSD tier: how often to ask the master what to copy to disk");
  schema.AddDurationMs("copy_interval", &c.copy_interval_ms,
                       "re-replication: how often to ask the master for copies to make into this "
                       "node's segment while it has none (0: this node makes no copies)");
  schema.AddSize("disk_shm_staging", &c.disk_shm_staging,
                 "SSD tier: shared-memory staging for same-host clients' loads (0: TCP only)");
  schema.AddDurationMs("disk_staging_ttl", &c.disk_staging_ttl_ms,
                       "SSD tier: a staged load not released by its client this long is reclaimed");
  schema.AddString("auth_token_file", &c.auth_token_file,
                   "file (mode 0600) whose first line is the cluster's secret, presented to the "
                   "master (and required by the --standalone one); docs/security.md");
  schema.AddString("tls_ca", &c.tls_ca,
                   "TLS to the master: the CA (PEM) that signed its certificate; with "
                   "--standalone, also the CA whose clients its master accepts (mutual TLS)");
  schema.AddString("tls_cert", &c.tls_cert,
                   "TLS: this node's certificate (PEM), for a master that requires one; with "
                   "--standalone, its master's too");
  schema.AddString("tls_key", &c.tls_key, "TLS: the key of --tls-cert (PEM, mode 0600)");
  schema.AddString("etcd_auth_file", &c.etcd_auth_file,
                   "with --master etcd://...: file (mode 0600) whose first line is USER:PASSWORD "
                   "of an etcd user, for an etcd with auth enabled");
  schema.AddBool("insecure", &c.insecure,
                 "serve a host other than loopback without auth_token_file");
  schema.AddBool("standalone", &c.standalone, "run a master in this process too");
  schema.AddPort("master_port", &c.master_port, "with --standalone: the master's gRPC port");
  schema.AddString("http_port", &c.http_port,
                   "HTTP port of the node's /metrics, /health and /status, bound to --host "
                   "(absent or 0: none); with --standalone, the master's HTTP port instead "
                   "(absent: 9003), as before");
  if (Status s = schema.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "granary-node: %s\n", s.message().c_str());
    return 2;
  }
  if (schema.help_requested()) return 0;
  std::optional<uint16_t> http_port;
  if (!c.http_port.empty()) {
    http_port = ParsePort(c.http_port);
    if (!http_port) {
      std::fprintf(stderr,
                   "granary-node: --http-port: invalid value '%s': expected a port number "
                   "0-65535 (0: no HTTP endpoint)\n",
                   c.http_port.c_str());
      return 2;
    }
  }
  if (Status s = InitLogging("node", c.log_level); !s.ok()) {
    std::fprintf(stderr, "granary-node: %s\n", s.message().c_str());
    return 2;
  }
  if (c.segment_size == 0) c.segment_size = FittingSegmentSize();
  if (c.auth_token_file.empty() && !c.insecure && !security::IsLoopbackHost(c.host)) {
    std::fprintf(stderr,
                 "granary-node: host %s serves other machines, and without --auth-token-file the "
                 "master hands this node's data-plane token to anyone who asks: give the "
                 "cluster's secret file (docs/security.md), or --insecure on a network only "
                 "trusted hosts reach\n",
                 c.host.c_str());
    return 2;
  }
  std::string secret;
  if (!c.auth_token_file.empty()) {
    auto loaded = security::LoadSecretFile(c.auth_token_file);
    if (!loaded.ok()) {
      std::fprintf(stderr, "granary-node: %s\n", loaded.status().message().c_str());
      return 2;
    }
    secret = std::move(*loaded);
  }
  etcd::EtcdCredentials etcd_user;
  if (!c.etcd_auth_file.empty()) {
    auto loaded = security::LoadUserPasswordFile(c.etcd_auth_file);
    if (!loaded.ok()) {
      std::fprintf(stderr, "granary-node: %s\n", loaded.status().message().c_str());
      return 2;
    }
    etcd_user = {loaded->user, loaded->password};
  }
  const security::TlsFiles tls_files{c.tls_cert, c.tls_key, c.tls_ca};
  std::shared_ptr<const security::TlsContext> tls;
  if (tls_files.any()) {
    auto loaded = security::TlsContext::Load(tls_files, security::TlsContext::Side::kClient);
    if (!loaded.ok()) {
      std::fprintf(stderr, "granary-node: %s\n", loaded.status().message().c_str());
      return 2;
    }
    tls = std::move(*loaded);
  }

  std::unique_ptr<master::MasterServer> master;
  if (c.standalone) {
    master::MasterConfig mc;
    mc.host = c.host;
    mc.port = c.master_port;
    mc.http_port = http_port.value_or(9003);
    mc.auth_token_file = c.auth_token_file;
    mc.tls_cert_file = c.tls_cert;
    mc.tls_key_file = c.tls_key;
    mc.tls_ca_file = c.tls_ca;
    mc.insecure = c.insecure;
    master = std::make_unique<master::MasterServer>(mc);
    if (Status s = master->Start(); !s.ok()) {
      GLOG_ERROR("{}", s.ToString());
      return 1;
    }
    c.master = "127.0.0.1:" + std::to_string(master->grpc_port());
  }
  GLOG_INFO("configuration:\n{}", schema.Describe());

  node::StorageNodeOptions options;
  options.master_address = c.master;
  options.cluster_id = c.cluster_id;
  options.secret = secret;
  options.tls = tls;
  options.etcd_credentials = etcd_user;
  options.segment_name = c.name;
  options.segment_size = c.segment_size;
  options.listen_host = c.host;
  options.advertise_host = c.advertise_host;
  options.port = c.port;
  options.prefault = c.prefault;
  options.heartbeat_interval_ms = c.heartbeat_interval_ms;
  options.copy_interval_ms = c.copy_interval_ms;
  options.reclaim_interval_ms = c.reclaim_interval_ms;
  options.data_max_connections = c.data_max_connections;
  options.data_io_threads = c.data_io_threads;
  options.data_request_timeout_ms = c.data_request_timeout_ms;
  // Standalone, the port is its master's (above); the node's own endpoint then stays off.
  if (!c.standalone && http_port.value_or(0) != 0) options.http_port = *http_port;
  {
    auto disk = granary::node::MakeDiskTierOptions({c.disk_dir, c.disk_size, c.disk_backend,
                                           c.disk_eviction, c.disk_io, c.offload_interval_ms},
                                          options.rpc_timeout_ms);
    if (!disk.ok()) {
      std::fprintf(stderr, "granary-node: %s\n", disk.status().message().c_str());
      return 2;
    }
    options.disk = std::move(*disk);
    options.disk_shm_staging_bytes = c.disk_shm_staging;
    options.disk_staging_ttl_ms = c.disk_staging_ttl_ms;
  }
  auto node = node::StorageNode::Start(options);
  if (!node.ok()) {
    GLOG_ERROR("{}", node.status().ToString());
    return 1;
  }
  std::printf("granary-node ready: segment %s, %s, data plane %s, master %s%s\n",
              (*node)->segment_name().c_str(), FormatSize(c.segment_size).c_str(),
              (*node)->endpoint().c_str(), c.master.c_str(),
              (*node)->http_port() != 0
                  ? (", http " + c.host + ":" + std::to_string((*node)->http_port())).c_str()
                  : "");
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  GLOG_INFO("signal {}: unmounting and stopping", sig);
  (*node)->Stop();
  if (master) master->Shutdown();
  return 0;
}
