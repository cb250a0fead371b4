#include "ha_fixture.h"

#include <algorithm>

namespace granary::it {

namespace {
constexpr Millis kLeaderTimeout(15'000);
constexpr Millis kNodeTimeout(10'000);

EtcdOptions FastEtcd() {
  EtcdOptions o;
  o.heartbeat_ms = 50;
  o.election_ms = 500;  // etcd then grants 1 s leases
  return o;
}
}  // namespace

const std::vector<std::string>& HaMasterFlags() {
  static const std::vector<std::string> flags = {
      "--client-ttl",      "3s",  "--lease-ttl",     "1s",    "--mount-quarantine", "1s",
      "--put-discard-timeout", "1s", "--put-release-timeout", "3s",
      "--leader-lease",    "1s",  "--lease-margin",  "300ms", "--standby-timeout",  "500ms",
      "--sync-timeout",    "2s",  "--fast-port",     "0",     "--log-level",        "info"};
  return flags;
}

HaCluster::HaCluster(std::string cluster_id, int etcd_members)
    : cluster_id_(cluster_id.empty() ? UniqueName("ha") : std::move(cluster_id)),
      dir_("granary-ha") {
  if (etcd_members <= 1) {
    single_ = std::make_unique<EtcdServer>(FastEtcd());
  } else {
    members_ = std::make_unique<EtcdCluster>(FastEtcd(), etcd_members);
  }
}

std::string HaCluster::endpoints() const {
  return single_ ? single_->endpoint() : members_->endpoints();
}

HaCluster::~HaCluster() {
  for (auto& n : nodes_) n->KillAndReap();
  for (auto& m : masters_) m->process().KillAndReap();
  for (auto& p : proxies_) p->Stop();
}

::testing::AssertionResult HaCluster::Start(int masters, size_t nodes, uint64_t segment_size,
                                            std::vector<std::string> extra_flags, bool proxied) {
  if (auto started = single_ ? single_->Start() : members_->Start(); !started) return started;
  if (etcd_setup_) {
    if (auto set_up = etcd_setup_(endpoints()); !set_up) return set_up;
  }
  for (int i = 0; i < masters; ++i) {
    std::vector<std::string> flags = extra_flags;
    if (proxied) {
      proxies_.push_back(std::make_unique<TcpProxy>(etcd().endpoint()));
      std::string error;
      if (!proxies_.back()->Start(&error)) {
        return ::testing::AssertionFailure() << "proxy to etcd: " << error;
      }
      flags.push_back("--etcd");
      flags.push_back(proxies_.back()->endpoint());
    }
    if (auto added = AddMaster(flags); !added) return added;
  }
  if (WaitForLeader(kLeaderTimeout) < 0) {
    return ::testing::AssertionFailure() << "no master serves as the leader\n" << Logs();
  }
  for (size_t i = 0; i < nodes; ++i) {
    if (auto added = AddNode(segment_size); !added) return added;
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult HaCluster::AddMaster(std::vector<std::string> extra_flags) {
  std::vector<std::string> flags = HaMasterFlags();
  flags.insert(flags.end(), {"--cluster-id", cluster_id_});
  // A flag given twice takes the later value: --etcd from extra_flags (a proxy) wins.
  flags.insert(flags.end(), {"--etcd", endpoints()});
  flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
  masters_.push_back(std::make_unique<MasterProcess>());
  return masters_.back()->Start(flags);
}

::testing::AssertionResult HaCluster::AddNode(uint64_t segment_size, std::vector<std::string> extra) {
  nodes_.push_back(std::make_unique<NodeProcess>(UniqueName("ha-node"), segment_size, dir_.path()));
  NodeProcess& n = *nodes_.back();
  extra.insert(extra.begin(), {"--cluster-id", cluster_id_});
  if (auto started = n.Start(address(), std::move(extra)); !started) return started;
  auto client = MakeClient();
  if (!client) return ::testing::AssertionFailure() << "no client";
  const std::string name = n.name();
  const bool listed = WaitUntil(
      [&] {
        auto segments = client->ListSegments();
        return segments.ok() && std::any_of(segments->begin(), segments->end(),
                                            [&](const auto& s) { return s.name == name; });
      },
      kNodeTimeout, Millis(50));
  if (!listed) {
    return ::testing::AssertionFailure() << "segment " << name << " not listed\n" << Logs();
  }
  return ::testing::AssertionSuccess();
}

std::optional<nlohmann::json> HaCluster::Status(int i, Millis timeout) {
  MasterProcess& m = master(i);
  if (!m.Running()) return std::nullopt;
  HttpResult r = HttpGet(m.http_port(), "/status", timeout);
  if (r.status != 200) return std::nullopt;
  nlohmann::json doc = nlohmann::json::parse(r.body, nullptr, false);
  if (!doc.is_object() || !doc.contains("ha")) return std::nullopt;
  return doc["ha"];
}

int HaCluster::LeaderIndex() {
  for (int i = 0; i < master_count(); ++i) {
    auto s = Status(i, Millis(500));
    if (s && (*s)["role"] == "leader") return i;
  }
  return -1;
}

int HaCluster::WaitForLeader(Millis timeout, int not_this) {
  int found = -1;
  WaitUntil(
      [&] {
        for (int i = 0; i < master_count(); ++i) {
          if (i == not_this) continue;
          auto s = Status(i, Millis(300));
          if (s && (*s)["role"] == "leader") {
            found = i;
            return true;
          }
        }
        return false;
      },
      timeout, Millis(20));
  return found;
}

bool HaCluster::WaitForRole(int i, const std::string& role, Millis timeout) {
  return WaitUntil(
      [&] {
        auto s = Status(i, Millis(300));
        return s && (*s)["role"] == role;
      },
      timeout, Millis(20));
}

bool HaCluster::WaitForStandbysCaughtUp(Millis timeout) {
  return WaitUntil(
      [&] {
        const int leader = LeaderIndex();
        if (leader < 0) return false;
        auto s = Status(leader);
        if (!s || !s->contains("standbys")) return false;
        int live = 0;
        for (int i = 0; i < master_count(); ++i) live += i != leader && master(i).Running();
        int caught_up = 0;
        for (const auto& st : (*s)["standbys"]) {
          caught_up += st["connected"].get<bool>() && st["lag"].get<uint64_t>() == 0;
        }
        return caught_up >= live;
      },
      timeout, Millis(20));
}

::testing::AssertionResult HaCluster::RestartMaster(int i) { return master(i).Restart(); }

::testing::AssertionResult HaCluster::RestartNode(size_t i) {
  NodeProcess& n = *nodes_.at(i);
  n.KillAndReap();
  return n.Start(address(), {"--cluster-id", cluster_id_});
}

bool HaCluster::WaitForAllNodesMounted(Millis timeout) {
  auto client = MakeClient();
  if (!client) return false;
  return WaitUntil(
      [&] {
        auto segments = client->ListSegments();
        if (!segments.ok()) return false;
        for (const auto& n : nodes_) {
          if (std::none_of(segments->begin(), segments->end(),
                           [&](const auto& s) { return s.name == n->name(); })) {
            return false;
          }
        }
        return true;
      },
      timeout, Millis(50));
}

std::unique_ptr<Client> HaCluster::MakeClient(bool use_shared_memory, ClientOptions options) {
  options.master_address = address();
  options.cluster_id = cluster_id_;
  options.use_shared_memory = use_shared_memory;
  return ConnectTestClient(std::move(options));
}

std::string HaCluster::Logs() {
  std::string out;
  for (int i = 0; i < master_count(); ++i) {
    out += "===== granary-master " + std::to_string(i) + " =====\n" + master(i).Log() + "\n";
  }
  for (const auto& n : nodes_) out += "===== granary-node " + n->name() + " =====\n" + n->AllLogs();
  out += "===== etcd =====\n" + (single_ ? single_->Log() : members_->Log());
  return out;
}

void HaTest::TearDown() {
  if (HasFailure()) std::fprintf(stderr, "%s\n", cluster_.Logs().c_str());
}

}  // namespace granary::it
