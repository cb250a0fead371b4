#include "master_fixture.h"

#include <chrono>
#include <cstdlib>

#include "security/tls.h"

namespace granary::it {

namespace {
constexpr Millis kReadyTimeout{10'000};
constexpr int kMaxMessageBytes = 256 << 20;
}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                          std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  // A private subchannel pool: a channel made after a restart must not inherit a subchannel that
  // is still backing off from the dead master.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 250);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(
      address, credentials ? credentials : grpc::InsecureChannelCredentials(), args);
}

pb::ReplicateConfig Replicas(uint32_t n) {
  pb::ReplicateConfig c;
  c.set_replica_num(n);
  return c;
}

// ---- MasterProcess ----

MasterProcess::MasterProcess() : dir_("granary-it-master") {}

MasterProcess::~MasterProcess() {
  stub_.reset();
  channel_.reset();
  child_.KillAndReap();
}

std::string MasterProcess::Log() const {
  std::string out;
  for (int i = 1; i <= launches_; ++i) {
    std::string path = dir_.File("master-" + std::to_string(i) + ".log");
    out += "----- " + path + " -----\n" + ReadFile(path);
  }
  if (out.size() > 64 * 1024) out = "[...]\n" + out.substr(out.size() - 64 * 1024);
  return out;
}

::testing::AssertionResult MasterProcess::Start(std::vector<std::string> extra_flags) {
  extra_flags_ = std::move(extra_flags);
  if (grpc_port_ == 0) {
    grpc_port_ = PickFreePort();
    do {
      http_port_ = PickFreePort();
    } while (http_port_ == grpc_port_);
  }
  return Launch();
}

::testing::AssertionResult MasterProcess::Restart() {
  stub_.reset();
  channel_.reset();
  child_.KillAndReap();
  return Launch();
}

std::optional<ExitStatus> MasterProcess::Stop(int sig, Millis timeout) {
  if (!child_.Kill(sig)) return child_.exit_status();
  return child_.Wait(timeout);
}

::testing::AssertionResult MasterProcess::Launch() {
  // GRANARY_IT_MASTER_LOG_LEVEL=debug makes the masters of a failing test talk more.
  const char* level = std::getenv("GRANARY_IT_MASTER_LOG_LEVEL");
  std::vector<std::string> args = {"--host",      "127.0.0.1",
                                   "--port",      std::to_string(grpc_port_),
                                   "--http-port", std::to_string(http_port_),
                                   "--log-level", level != nullptr && *level ? level : "warn"};
  args.insert(args.end(), extra_flags_.begin(), extra_flags_.end());
  ++launches_;
  const std::string log = dir_.File("master-" + std::to_string(launches_) + ".log");
  std::string error;
  const std::string binary = BinaryPath("granary-master");
  if (!child_.Start(binary, args, log, &error)) {
    return ::testing::AssertionFailure() << "cannot start " << binary << ": " << error;
  }
  const auto started = std::chrono::steady_clock::now();
  bool healthy = WaitUntil(
      [&] {
        if (!child_.Running()) return true;  // stop waiting: it died
        return HttpGet(http_port_, "/health", Millis(1000)).status == 200;
      },
      kReadyTimeout, Millis(25));
  if (!child_.Running()) {
    return ::testing::AssertionFailure()
           << "granary-master " << child_.exit_status()->ToString() << " during start-up\n"
           << Log();
  }
  if (!healthy) {
    return ::testing::AssertionFailure() << "granary-master did not answer /health within "
                                         << kReadyTimeout.count() << " ms\n"
                                         << Log();
  }
  Connect();
  const auto left = kReadyTimeout - (std::chrono::steady_clock::now() - started);
  if (!channel_->WaitForConnected(std::chrono::system_clock::now() +
                                  std::max<std::chrono::steady_clock::duration>(
                                      left, std::chrono::seconds(1)))) {
    return ::testing::AssertionFailure() << "gRPC channel to " << address()
                                         << " did not connect\n"
                                         << Log();
  }
  return ::testing::AssertionSuccess();
}

void MasterProcess::Connect() {
  channel_ = NewChannel();
  stub_ = pb::Master::NewStub(channel_);
}

std::shared_ptr<grpc::Channel> MasterProcess::NewChannel() const {
  // A master serving TLS is called with its own certificate (the tests' pairs are good for both
  // sides): the flags name the files.
  security::TlsFiles tls{"", "", tls_ca_};
  for (size_t i = 0; i + 1 < extra_flags_.size(); ++i) {
    if (extra_flags_[i] == "--tls-cert") tls.cert = extra_flags_[i + 1];
    if (extra_flags_[i] == "--tls-key") tls.key = extra_flags_[i + 1];
    if (extra_flags_[i] == "--tls-ca") tls.ca = extra_flags_[i + 1];
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (tls.any()) {
    auto loaded = security::TlsContext::Load(tls, security::TlsContext::Side::kClient);
    EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
    if (loaded.ok()) credentials = (*loaded)->ChannelCredentials();
  }
  return MakeChannel(address(), credentials);
}

// ---- MasterClient ----

template <typename Resp, typename Fn>
Resp MasterClient::Call(const char* method, Fn&& fn) {
  Resp resp;
  pb::Master::Stub* stub = master_->stub();
  if (stub == nullptr) {
    last_status_ = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "master not started");
    ADD_FAILURE() << method << ": the master is not running";
    return resp;
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline_);
  last_status_ = fn(stub, &ctx, &resp);
  if (!last_status_.ok()) {
    ADD_FAILURE() << method << " (client " << id_ << ") failed at the transport: gRPC code "
                  << last_status_.error_code() << " " << last_status_.error_message();
  }
  return resp;
}

pb::MountSegmentResponse MasterClient::Mount(const std::string& name, uint64_t size,
                                             const std::string& endpoint) {
  pb::MountSegmentRequest req;
  req.set_client_id(id_);
  req.mutable_segment()->set_name(name);
  req.mutable_segment()->set_size(size);
  req.mutable_segment()->set_endpoint(endpoint);
  req.mutable_segment()->set_fresh(true);  // test segments are new memory: no quarantine
  return Call<pb::MountSegmentResponse>("MountSegment", [&](auto* s, auto* c, auto* r) {
    return s->MountSegment(c, req, r);
  });
}

pb::UnmountSegmentResponse MasterClient::Unmount(const std::string& name) {
  pb::UnmountSegmentRequest req;
  req.set_client_id(id_);
  req.set_name(name);
  return Call<pb::UnmountSegmentResponse>("UnmountSegment", [&](auto* s, auto* c, auto* r) {
    return s->UnmountSegment(c, req, r);
  });
}

pb::ReMountSegmentResponse MasterClient::ReMount(const std::vector<pb::SegmentSpec>& segments) {
  pb::ReMountSegmentRequest req;
  req.set_client_id(id_);
  for (const auto& s : segments) *req.add_segments() = s;
  return Call<pb::ReMountSegmentResponse>("ReMountSegment", [&](auto* s, auto* c, auto* r) {
    return s->ReMountSegment(c, req, r);
  });
}

pb::ListSegmentsResponse MasterClient::ListSegments() {
  pb::ListSegmentsRequest req;
  return Call<pb::ListSegmentsResponse>("ListSegments", [&](auto* s, auto* c, auto* r) {
    return s->ListSegments(c, req, r);
  });
}

pb::PingResponse MasterClient::Ping() {
  pb::PingRequest req;
  req.set_client_id(id_);
  return Call<pb::PingResponse>("Ping", [&](auto* s, auto* c, auto* r) {
    return s->Ping(c, req, r);
  });
}

pb::BatchPutStartResponse MasterClient::PutStart(const std::vector<std::string>& keys,
                                                 const std::vector<uint64_t>& sizes,
                                                 const pb::ReplicateConfig& config, bool upsert) {
  pb::BatchPutStartRequest req;
  req.set_client_id(id_);
  for (const auto& k : keys) req.add_keys(k);
  for (uint64_t s : sizes) req.add_sizes(s);
  *req.mutable_config() = config;
  req.set_upsert(upsert);
  auto resp = Call<pb::BatchPutStartResponse>("BatchPutStart", [&](auto* s, auto* c, auto* r) {
    return s->BatchPutStart(c, req, r);
  });
  // Remember each started put's generation, so PutEnd/PutRevoke quote it like a real client.
  for (int i = 0; i < resp.results_size() && i < static_cast<int>(keys.size()); ++i) {
    if (resp.results(i).code() == code::kOk) put_gens_[keys[i]] = resp.results(i).put_gen();
  }
  return resp;
}

pb::PutStartResult MasterClient::PutStartOne(const std::string& key, uint64_t size,
                                             const pb::ReplicateConfig& config, bool upsert) {
  auto resp = PutStart({key}, {size}, config, upsert);
  if (resp.results_size() != 1) {
    ADD_FAILURE() << "BatchPutStart of one key answered " << resp.results_size() << " results";
    pb::PutStartResult failed;
    failed.set_code(-1);
    return failed;
  }
  return resp.results(0);
}

pb::BatchStatusResponse MasterClient::PutEnd(const std::vector<std::string>& keys,
                                             const std::vector<uint64_t>& checksums) {
  pb::BatchPutEndRequest req;
  req.set_client_id(id_);
  for (const auto& k : keys) req.add_keys(k);
  for (uint64_t c : checksums) req.add_checksums(c);
  for (const auto& k : keys) req.add_put_gens(PutGen(k));
  return Call<pb::BatchStatusResponse>("BatchPutEnd", [&](auto* s, auto* c, auto* r) {
    return s->BatchPutEnd(c, req, r);
  });
}

namespace {
int32_t Single(const pb::BatchStatusResponse& resp, const char* method) {
  if (resp.results_size() != 1) {
    ADD_FAILURE() << method << " of one key answered " << resp.results_size() << " results";
    return -1;
  }
  return resp.results(0).code();
}
}  // namespace

int32_t MasterClient::PutEndOne(const std::string& key, uint64_t checksum) {
  return Single(PutEnd({key}, {checksum}), "BatchPutEnd");
}

pb::BatchStatusResponse MasterClient::PutRevoke(const std::vector<std::string>& keys) {
  pb::BatchPutRevokeRequest req;
  req.set_client_id(id_);
  for (const auto& k : keys) req.add_keys(k);
  for (const auto& k : keys) req.add_put_gens(PutGen(k));
  return Call<pb::BatchStatusResponse>("BatchPutRevoke", [&](auto* s, auto* c, auto* r) {
    return s->BatchPutRevoke(c, req, r);
  });
}

int32_t MasterClient::PutRevokeOne(const std::string& key) {
  return Single(PutRevoke({key}), "BatchPutRevoke");
}

int32_t MasterClient::Put(const std::string& key, uint64_t size, uint64_t checksum,
                          const pb::ReplicateConfig& config, bool upsert) {
  pb::PutStartResult started = PutStartOne(key, size, config, upsert);
  if (started.code() != code::kOk) return started.code();
  return PutEndOne(key, checksum);
}

void MasterClient::PutMany(const std::vector<std::string>& keys, uint64_t size,
                           const pb::ReplicateConfig& config) {
  auto started = PutStart(keys, std::vector<uint64_t>(keys.size(), size), config);
  ASSERT_EQ(started.results_size(), static_cast<int>(keys.size()));
  std::vector<std::string> ok;
  std::vector<uint64_t> checksums;
  size_t failures = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (started.results(static_cast<int>(i)).code() == code::kOk) {
      ok.push_back(keys[i]);
      checksums.push_back(i + 1);
    } else if (failures++ == 0) {
      ADD_FAILURE() << "put-start of '" << keys[i].substr(0, 64) << "' answered "
                    << started.results(static_cast<int>(i)).code() << " "
                    << started.results(static_cast<int>(i)).message();
    }
  }
  EXPECT_EQ(failures, 0u) << "put-start failures in a batch of " << keys.size();
  if (ok.empty()) return;
  auto ended = PutEnd(ok, checksums);
  ASSERT_EQ(ended.results_size(), static_cast<int>(ok.size()));
  for (int i = 0; i < ended.results_size(); ++i) {
    if (ended.results(i).code() != code::kOk) {
      ADD_FAILURE() << "put-end of '" << ok[static_cast<size_t>(i)].substr(0, 64) << "' answered "
                    << ended.results(i).code() << " " << ended.results(i).message();
      break;
    }
  }
}

pb::BatchGetReplicaListResponse MasterClient::Get(const std::vector<std::string>& keys) {
  pb::BatchGetReplicaListRequest req;
  req.set_client_id(id_);
  for (const auto& k : keys) req.add_keys(k);
  return Call<pb::BatchGetReplicaListResponse>(
      "BatchGetReplicaList",
      [&](auto* s, auto* c, auto* r) { return s->BatchGetReplicaList(c, req, r); });
}

pb::GetReplicaResult MasterClient::GetOne(const std::string& key) {
  auto resp = Get({key});
  if (resp.results_size() != 1) {
    ADD_FAILURE() << "BatchGetReplicaList of one key answered " << resp.results_size()
                  << " results";
    pb::GetReplicaResult failed;
    failed.set_code(-1);
    return failed;
  }
  return resp.results(0);
}

pb::BatchStatusResponse MasterClient::FinishRead(const std::vector<std::string>& keys) {
  pb::BatchFinishReadRequest req;
  req.set_client_id(id_);
  for (const auto& k : keys) req.add_keys(k);
  return Call<pb::BatchStatusResponse>("BatchFinishRead", [&](auto* s, auto* c, auto* r) {
    return s->BatchFinishRead(c, req, r);
  });
}

int32_t MasterClient::FinishReadOne(const std::string& key) {
  return Single(FinishRead({key}), "BatchFinishRead");
}

int32_t MasterClient::Touch(const std::string& key) {
  int32_t got = GetOne(key).code();
  if (got == code::kOk) {
    EXPECT_EQ(FinishReadOne(key), code::kOk) << "finish-read of " << key;
  }
  return got;
}

std::vector<int32_t> MasterClient::Exist(const std::vector<std::string>& keys) {
  pb::BatchExistRequest req;
  for (const auto& k : keys) req.add_keys(k);
  auto resp = Call<pb::BatchExistResponse>("BatchExist", [&](auto* s, auto* c, auto* r) {
    return s->BatchExist(c, req, r);
  });
  return std::vector<int32_t>(resp.results().begin(), resp.results().end());
}

int32_t MasterClient::ExistOne(const std::string& key) {
  auto r = Exist({key});
  if (r.size() != 1) {
    ADD_FAILURE() << "BatchExist of one key answered " << r.size() << " results";
    return -1;
  }
  return r[0];
}

std::vector<int64_t> MasterClient::GetSize(const std::vector<std::string>& keys) {
  pb::BatchGetSizeRequest req;
  for (const auto& k : keys) req.add_keys(k);
  auto resp = Call<pb::BatchGetSizeResponse>("BatchGetSize", [&](auto* s, auto* c, auto* r) {
    return s->BatchGetSize(c, req, r);
  });
  return std::vector<int64_t>(resp.results().begin(), resp.results().end());
}

pb::BatchPrefixMatchResponse MasterClient::PrefixMatch(const std::vector<std::string>& keys) {
  pb::BatchPrefixMatchRequest req;
  for (const auto& k : keys) req.add_keys(k);
  return Call<pb::BatchPrefixMatchResponse>("BatchPrefixMatch", [&](auto* s, auto* c, auto* r) {
    return s->BatchPrefixMatch(c, req, r);
  });
}

pb::StatObjectResponse MasterClient::Stat(const std::string& key) {
  pb::StatObjectRequest req;
  req.set_key(key);
  return Call<pb::StatObjectResponse>("StatObject", [&](auto* s, auto* c, auto* r) {
    return s->StatObject(c, req, r);
  });
}

pb::BatchStatusResponse MasterClient::Remove(const std::vector<std::string>& keys, bool force) {
  pb::BatchRemoveRequest req;
  req.set_client_id(id_);
  for (const auto& k : keys) req.add_keys(k);
  req.set_force(force);
  return Call<pb::BatchStatusResponse>("BatchRemove", [&](auto* s, auto* c, auto* r) {
    return s->BatchRemove(c, req, r);
  });
}

int32_t MasterClient::RemoveOne(const std::string& key, bool force) {
  return Single(Remove({key}, force), "BatchRemove");
}

pb::RemoveCountResponse MasterClient::RemoveByRegex(const std::string& pattern, bool force) {
  pb::RegexRequest req;
  req.set_pattern(pattern);
  req.set_force(force);
  return Call<pb::RemoveCountResponse>("RemoveByRegex", [&](auto* s, auto* c, auto* r) {
    return s->RemoveByRegex(c, req, r);
  });
}

pb::QueryByRegexResponse MasterClient::QueryByRegex(const std::string& pattern, uint32_t limit) {
  pb::RegexRequest req;
  req.set_pattern(pattern);
  req.set_limit(limit);
  return Call<pb::QueryByRegexResponse>("QueryByRegex", [&](auto* s, auto* c, auto* r) {
    return s->QueryByRegex(c, req, r);
  });
}

pb::RemoveCountResponse MasterClient::RemoveAll(bool force) {
  pb::RemoveAllRequest req;
  req.set_force(force);
  return Call<pb::RemoveCountResponse>("RemoveAll", [&](auto* s, auto* c, auto* r) {
    return s->RemoveAll(c, req, r);
  });
}

bool MasterClient::FindSegment(const std::string& name, pb::SegmentInfo* out) {
  const pb::ListSegmentsResponse listed = ListSegments();  // outlives the loop
  for (const auto& s : listed.segments()) {
    if (s.name() == name) {
      if (out != nullptr) *out = s;
      return true;
    }
  }
  return false;
}

// ---- MasterTest ----

void MasterTest::TearDown() {
  if (HasFailure()) {
    std::fprintf(stderr, "===== granary-master log (ports %u/%u) =====\n%s\n=====\n",
                 master_.grpc_port(), master_.http_port(), master_.Log().c_str());
  }
}

::testing::AssertionResult MasterTest::StartMaster(std::vector<std::string> extra_flags) {
  return master_.Start(std::move(extra_flags));
}

void MasterTest::ExpectServing() {
  MasterClient probe = Client("serving-probe");
  probe.set_deadline(Millis(5000));
  pb::PingResponse ping = probe.Ping();
  EXPECT_TRUE(probe.last_status().ok()) << "the master no longer answers Ping";
  EXPECT_EQ(ping.code(), code::kOk);
  std::vector<int32_t> exist = probe.Exist({"serving-probe-key"});
  EXPECT_TRUE(probe.last_status().ok()) << "the master no longer answers BatchExist";
  EXPECT_EQ(exist, std::vector<int32_t>{0});
  EXPECT_TRUE(master_.Running()) << "the master process is gone";
}

}  // namespace granary::it
