// granary: the command-line tool for a Granary store, in the spirit of redis-cli and etcdctl.
//
//   granary [--master HOST:PORT] put KEY [FILE|-]     store FILE (or stdin) under KEY
//                                                     (--replicas N, --upsert, --persistence P)
//   granary get KEY [-o FILE]                         print the object (or write it to FILE)
//   granary rm KEY [--force]                          remove it
//   granary ls [REGEX]                                list keys (RE2, searched in the key)
//   granary stat KEY                                  size, state, replicas, locks, pins
//   granary nodes                                     segments with capacity and usage
//   granary replicate KEY N [--wait SECONDS]          set KEY's number of memory replicas
//   granary drain SEGMENT [--drop]                    move a segment's objects off, unmount it
//   granary undrain SEGMENT                           revert a drain (or re-admit the name)
//   granary health                                    is the master answering?
//   granary whoami                                    the role and tenant the secret names
//   granary tenants                                   tenants' bytes, objects and quotas
//   granary top [-d SECONDS] [-n N] [-b] [--http H:P]  live view of nodes, usage, hit rate,
//                                                     throughput and backlog (top.h)
//
// Exit codes a script can rely on: 0 done, 1 the key is not there, 2 bad usage, 3 any other
// failure (master unreachable, no space, ...). Errors are one line on stderr.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <thread>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "common/units.h"
#include "granary/client.h"
#include "tools/cli/top.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitNotFound = 1;
constexpr int kExitUsage = 2;
constexpr int kExitFailure = 3;

int Fail(const std::string& what, const granary::Status& s) {
  std::fprintf(stderr, "granary: %s: %s\n", what.c_str(), s.ToString().c_str());
  if (s.code() == granary::ErrorCode::OBJECT_NOT_FOUND) return kExitNotFound;
  return kExitFailure;
}

bool ReadAll(const std::string& path, std::string* out) {
  if (path.empty() || path == "-") {
    std::ostringstream buffer;
    buffer << std::cin.rdbuf();
    *out = buffer.str();
    return !std::cin.bad();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

granary::ByteSpan AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace granary;
  CLI::App app{"granary: command-line tool for a Granary store"};
  app.footer("Exit codes: 0 done, 1 key not found, 2 bad usage, 3 other failure.\n"
             "The master address may also come from $GRANARY_MASTER, the cluster id from "
             "$GRANARY_CLUSTER_ID, the secret file from $GRANARY_AUTH_TOKEN_FILE.");
  app.require_subcommand(1);
  std::string master = std::getenv("GRANARY_MASTER") ? std::getenv("GRANARY_MASTER")
                                                      : "127.0.0.1:50051";
  int timeout_ms = 10'000;
  app.add_option("--master", master,
                 "master address HOST:PORT, or etcd://HOST:PORT[;HOST:PORT...] for the leader of "
                 "an HA cluster")
      ->capture_default_str();
  std::string cluster_id = std::getenv("GRANARY_CLUSTER_ID") ? std::getenv("GRANARY_CLUSTER_ID")
                                                              : "granary";
  app.add_option("--cluster-id", cluster_id, "HA cluster name (with an etcd:// master)")
      ->capture_default_str();
  app.add_option("--timeout-ms", timeout_ms, "timeout of each call")->capture_default_str();
  std::string auth_token_file;  // empty: the client library reads $GRANARY_AUTH_TOKEN_FILE
  app.add_option("--auth-token-file", auth_token_file,
                 "file (mode 0600) holding the secret to present, if the master requires one: "
                 "the cluster's, the admin's or a tenant's token");
  std::string tls_ca, tls_cert, tls_key;  // empty: $GRANARY_TLS_CA, _CERT, _KEY
  app.add_option("--tls-ca", tls_ca,
                 "TLS: the CA (PEM) that signed the master's certificate (default "
                 "$GRANARY_TLS_CA; none: plain TCP)");
  app.add_option("--tls-cert", tls_cert,
                 "TLS: this client's certificate (PEM), for a master that requires one");
  app.add_option("--tls-key", tls_key, "TLS: the key of --tls-cert (PEM, mode 0600)");
  std::string etcd_auth_file;  // empty: $GRANARY_ETCD_AUTH_FILE
  app.add_option("--etcd-auth-file", etcd_auth_file,
                 "with an etcd:// master: file (mode 0600) holding USER:PASSWORD of an etcd user");

  std::string key, file = "-", out_path, pattern;
  bool force = false;
  uint32_t replicas = 1;
  bool upsert = false;
  auto* put = app.add_subcommand("put", "store FILE (or stdin) under KEY");
  put->add_option("key", key, "the key")->required();
  put->add_option("file", file, "file to store; - or nothing for stdin");
  put->add_option("--replicas", replicas, "memory replicas on distinct nodes")->capture_default_str();
  put->add_flag("--upsert", upsert, "replace the object if it exists");
  std::string persistence = "default";
  put->add_option("--persistence", persistence,
                  "copy to a node's disk tier: eager (soon after the put), lazy (under memory "
                  "pressure), none, or default (the master's --persistence)")
      ->capture_default_str()
      ->check(CLI::IsMember({"default", "eager", "lazy", "none"}));
  auto* get = app.add_subcommand("get", "print the object stored under KEY");
  get->add_option("key", key, "the key")->required();
  get->add_option("-o,--output", out_path, "write to this file instead of stdout");
  auto* rm = app.add_subcommand("rm", "remove KEY");
  rm->add_option("key", key, "the key")->required();
  rm->add_flag("--force", force, "remove even while it is being read");
  auto* ls = app.add_subcommand("ls", "list keys matching REGEX (all without one)");
  ls->add_option("regex", pattern, "RE2 pattern, searched anywhere in the key");
  auto* stat = app.add_subcommand("stat", "size, state, replicas, locks and pins of KEY");
  stat->add_option("key", key, "the key")->required();
  auto* nodes = app.add_subcommand("nodes", "segments with capacity and usage");
  uint32_t replica_num = 0;
  double wait_s = 0;
  auto* replicate = app.add_subcommand(
      "replicate", "set KEY's number of memory replicas (new ones are copied in the background)");
  replicate->add_option("key", key, "the key")->required();
  replicate->add_option("n", replica_num, "memory replicas, 1-64")->required()->check(
      CLI::Range(1, 64));
  replicate->add_option("--wait", wait_s,
                        "wait up to this many seconds for the count to be reached (exit 3 if not)");
  std::string segment_name;
  bool drop = false;
  auto* drain = app.add_subcommand(
      "drain", "stop placing objects on SEGMENT, copy what needs it elsewhere, then unmount it "
               "(progress: granary nodes)");
  drain->add_option("segment", segment_name, "the segment's name (granary nodes)")->required();
  drain->add_flag("--drop", drop, "copy nothing: unmount now (objects only it holds are lost)");
  auto* undrain = app.add_subcommand(
      "undrain", "revert a drain not finished yet, or let a drained segment mount again");
  undrain->add_option("segment", segment_name, "the segment's name")->required();
  auto* health = app.add_subcommand("health", "check that the master answers");
  auto* whoami = app.add_subcommand("whoami", "the role and tenant the master takes this "
                                              "caller for (from its secret)");
  auto* tenants = app.add_subcommand("tenants", "each tenant's bytes, objects and quota (a "
                                                "tenant's secret: its own)");
  top::TopOptions top_options;
  auto* top = app.add_subcommand(
      "top", "live view of nodes, usage, hit rate, throughput and re-replication backlog, "
             "refreshed like top ('q' or Ctrl-C quits)");
  top->add_option("-d,--delay", top_options.interval_s, "seconds between refreshes")
      ->capture_default_str();
  top->add_option("-n,--iterations", top_options.iterations,
                  "frames to show, then exit (0: until quit); exit 3 if a sample failed")
      ->capture_default_str();
  top->add_flag("-b,--batch", top_options.batch,
                "print plain frames one after another (also when stdout is not a terminal)");
  top->add_option("--http", top_options.http,
                  "the master's HTTP address HOST:PORT, for its /metrics counters (default: the "
                  "port the master reports, on its host; with an etcd:// master, the leader's)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }

  ClientOptions options;
  options.master_address = master;
  options.cluster_id = cluster_id;
  options.auth_token_file = auth_token_file;
  options.tls_ca_file = tls_ca;
  options.tls_cert_file = tls_cert;
  options.tls_key_file = tls_key;
  options.etcd_auth_file = etcd_auth_file;
  options.rpc_timeout_ms = timeout_ms;
  if (top->parsed()) {  // connects (again) by itself: a master down now may come back
    top_options.client = options;
    return top::RunTop(top_options);
  }
  auto connected = Client::Connect(options);
  if (!connected.ok()) return Fail("connect to " + master, connected.status());
  Client& client = **connected;

  if (put->parsed()) {
    std::string value;
    if (!ReadAll(file, &value)) {
      std::fprintf(stderr, "granary: cannot read %s\n", file.c_str());
      return kExitFailure;
    }
    ReplicateConfig config;
    config.replica_num = replicas;
    config.persistence = persistence == "eager" ? Persistence::kEager
                         : persistence == "lazy" ? Persistence::kLazy
                         : persistence == "none" ? Persistence::kNone
                                                 : Persistence::kDefault;
    Status s = upsert ? client.Upsert(key, AsBytes(value), config)
                      : client.Put(key, AsBytes(value), config);
    if (!s.ok()) return Fail("put " + key, s);
    return kExitOk;
  }
  if (get->parsed()) {
    auto value = client.Get(key);
    if (!value.ok()) return Fail(key, value.status());
    if (out_path.empty()) {
      if (std::fwrite(value->data(), 1, value->size(), stdout) != value->size()) return kExitFailure;
      return std::fflush(stdout) == 0 ? kExitOk : kExitFailure;
    }
    std::ofstream out(out_path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(value->data()), static_cast<std::streamsize>(value->size()));
    if (!out.good()) {
      std::fprintf(stderr, "granary: cannot write %s\n", out_path.c_str());
      return kExitFailure;
    }
    return kExitOk;
  }
  if (rm->parsed()) {
    Status s = client.Remove(key, force);
    return s.ok() ? kExitOk : Fail("rm " + key, s);
  }
  if (ls->parsed()) {
    auto objects = client.QueryByRegex(pattern.empty() ? "" : pattern);
    if (!objects.ok()) return Fail("ls", objects.status());
    for (const auto& o : *objects) std::printf("%s\t%llu\n", o.key.c_str(), static_cast<unsigned long long>(o.size));
    return kExitOk;
  }
  if (stat->parsed()) {
    auto st = client.Stat(key);
    if (!st.ok()) return Fail(key, st.status());
    std::printf("key: %s\nstate: %s\nsize: %llu (%s)\nchecksum: %016llx\nread_locks: %u\n"
                "hard_pinned: %s\nsoft_pinned: %s\nidle_ms: %llu\nreplicas: %zu\n",
                key.c_str(), st->state.c_str(), static_cast<unsigned long long>(st->size),
                FormatSize(st->size).c_str(), static_cast<unsigned long long>(st->checksum),
                st->read_locks, st->hard_pinned ? "yes" : "no", st->soft_pinned ? "yes" : "no",
                static_cast<unsigned long long>(st->idle_ms), st->replicas.size());
    for (const auto& r : st->replicas) {
      std::printf("  - segment %s at %s, offset %llu, length %llu\n", r.segment_name.c_str(),
                  r.endpoint.c_str(), static_cast<unsigned long long>(r.offset),
                  static_cast<unsigned long long>(r.length));
    }
    std::printf("disk_replicas: %zu\n", st->disk_replicas.size());
    for (const auto& d : st->disk_replicas) {
      std::printf("  - disk of node %s at %s, location %llu, length %llu\n", d.node_id.c_str(),
                  d.endpoint.empty() ? "-" : d.endpoint.c_str(),
                  static_cast<unsigned long long>(d.location),
                  static_cast<unsigned long long>(d.length));
    }
    std::printf("wanted_replicas: %u%s\n", st->want_replicas, st->copying ? " (copying)" : "");
    return kExitOk;
  }
  if (replicate->parsed()) {
    Status s = client.BatchReplicate({key}, replica_num)[0];
    if (!s.ok()) return Fail(key, s);
    if (wait_s <= 0) return kExitOk;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000));
    while (true) {  // bounded by the deadline
      auto st = client.Stat(key);
      if (!st.ok()) return Fail(key, st.status());
      if (st->replicas.size() == replica_num) {
        std::printf("replicas: %zu\n", st->replicas.size());
        return kExitOk;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        std::fprintf(stderr, "%s: %zu of %u replicas after %.1f s\n", key.c_str(),
                     st->replicas.size(), replica_num, wait_s);
        return kExitFailure;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (drain->parsed() || undrain->parsed()) {
    Status s = undrain->parsed() ? client.Undrain(segment_name) : client.Drain(segment_name, drop);
    if (!s.ok()) return Fail(segment_name, s);
    std::printf("%s: %s\n", segment_name.c_str(),
                undrain->parsed() ? "undrained" : (drop ? "dropped" : "draining"));
    return kExitOk;
  }
  if (nodes->parsed()) {
    auto segments = client.ListSegments();
    if (!segments.ok()) return Fail("nodes", segments.status());
    std::printf("%-28s %-22s %12s %12s %7s %9s %12s %12s\n", "SEGMENT", "ENDPOINT", "CAPACITY",
                "USED", "USED%", "REPLICAS", "DISK", "DISK-USED");
    for (const auto& s : *segments) {
      double pct = s.size ? 100.0 * s.used_bytes / s.size : 0;
      const bool disk = s.disk_capacity > 0;  // the node's disk tier, if it has one
      std::printf("%-28s %-22s %12s %12s %6.1f%% %9llu %12s %12s\n", s.name.c_str(),
                  s.endpoint.c_str(), FormatSize(s.size).c_str(), FormatSize(s.used_bytes).c_str(),
                  pct, static_cast<unsigned long long>(s.replicas),
                  disk ? FormatSize(s.disk_capacity).c_str() : "-",
                  disk ? FormatSize(s.disk_used).c_str() : "-");
    }
    for (const auto& s : *segments) {
      if (!s.draining) continue;
      std::printf("draining %s: %llu objects (%s) still to copy elsewhere\n", s.name.c_str(),
                  static_cast<unsigned long long>(s.drain_remaining_objects),
                  FormatSize(s.drain_remaining_bytes).c_str());
    }
    // Drains whose segment is not listed: done (unmounted), or under way after its node died.
    auto drains = client.ListDrains();
    if (!drains.ok()) return Fail("nodes", drains.status());
    for (const auto& d : *drains) {
      if (std::any_of(segments->begin(), segments->end(),
                      [&](const SegmentStatus& s) { return s.name == d.segment; })) {
        continue;
      }
      if (d.done) {
        std::printf("drained %s: unmounted; its name mounts again after 'granary undrain %s'\n",
                    d.segment.c_str(), d.segment.c_str());
      } else {
        std::printf("draining %s: not mounted (its node is gone); ends at the master's next look\n",
                    d.segment.c_str());
      }
    }
    return kExitOk;
  }
  if (whoami->parsed() || tenants->parsed()) {
    auto cluster = client.Cluster();
    if (!cluster.ok()) return Fail(whoami->parsed() ? "whoami" : "tenants", cluster.status());
    if (whoami->parsed()) {
      // "admin", "member", or "tenant NAME".
      std::printf("%s%s%s\n", cluster->caller_role.c_str(),
                  cluster->caller_tenant.empty() ? "" : " ", cluster->caller_tenant.c_str());
      return kExitOk;
    }
    std::printf("%-24s %12s %10s %12s %7s\n", "TENANT", "BYTES", "OBJECTS", "QUOTA", "USED%");
    for (const auto& t : cluster->tenants) {
      const bool quota = t.quota_bytes > 0;
      std::printf("%-24s %12s %10llu %12s", t.name.c_str(), FormatSize(t.bytes).c_str(),
                  static_cast<unsigned long long>(t.objects),
                  quota ? FormatSize(t.quota_bytes).c_str() : "-");
      if (quota) {
        std::printf(" %6.1f%%\n", 100.0 * static_cast<double>(t.bytes) /
                                      static_cast<double>(t.quota_bytes));
      } else {
        std::printf(" %7s\n", "-");
      }
    }
    return kExitOk;
  }
  if (health->parsed()) {
    Status s = client.Health();
    if (!s.ok()) return Fail("master " + master, s);
    auto segments = client.ListSegments();
    size_t count = segments.ok() ? segments->size() : 0;
    std::printf("OK: master %s answers; %zu segment(s) mounted\n", master.c_str(), count);
    auto cluster = client.Cluster();
    if (cluster.ok() && cluster->ha) {
      std::printf("HA cluster %s: leader %s at %s, term %llu, applied seq %llu%s\n",
                  cluster->cluster_id.c_str(), cluster->leader_id.c_str(),
                  cluster->leader_address.c_str(),
                  static_cast<unsigned long long>(cluster->term),
                  static_cast<unsigned long long>(cluster->applied_seq),
                  cluster->serving_alone ? " (serving alone: no synchronous standby)" : "");
      for (const auto& st : cluster->standbys) {
        std::printf("  standby %s at %s: %s%s, acked seq %llu, lag %llu\n", st.id.c_str(),
                    st.address.c_str(), st.connected ? "streaming" : "disconnected",
                    st.synchronous ? ", synchronous" : "",
                    static_cast<unsigned long long>(st.acked_seq),
                    static_cast<unsigned long long>(st.lag));
      }
    }
    return kExitOk;
  }
  return kExitUsage;
}
