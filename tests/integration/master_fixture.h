// tests/integration/master_fixture.h - a real granary-master child process and a typed client.
//
// Promise: MasterProcess::Start() returns only once the master answers /health and its gRPC
// channel is connected (bounded: 10 s), or fails with the master's log in the message. Every RPC
// made through MasterClient carries a deadline (10 s unless changed), so a hung master fails the
// test instead of hanging it; a transport error is reported as a test failure (with the master's
// log) and the wrapper returns an empty response.
// Ownership: MasterProcess owns the child, its temp dir and the channel. A MasterClient borrows a
// MasterProcess (which must outlive it) and asks it for the stub on every call, so clients keep
// working across Restart().
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "granary/proto/master.grpc.pb.h"
#include "process_harness.h"

namespace granary::it {

namespace pb = ::granary::proto;

// Error codes as the wire carries them (include/granary/status.h; shared/MOONCAKE-API.md).
namespace code {
inline constexpr int32_t kOk = 0;
inline constexpr int32_t kSegmentNotFound = -101;
inline constexpr int32_t kSegmentAlreadyExists = -102;
inline constexpr int32_t kNoAvailableHandle = -200;
inline constexpr int32_t kInvalidKey = -400;
inline constexpr int32_t kInvalidParams = -600;
inline constexpr int32_t kIllegalClient = -601;
inline constexpr int32_t kInvalidWrite = -700;
inline constexpr int32_t kReplicaIsNotReady = -703;
inline constexpr int32_t kObjectNotFound = -704;
inline constexpr int32_t kObjectAlreadyExists = -705;
inline constexpr int32_t kObjectHasLease = -706;
inline constexpr int32_t kLeaseExpired = -707;
}  // namespace code

inline constexpr uint64_t KiB = 1024;
inline constexpr uint64_t MiB = 1024 * 1024;

class MasterProcess {
 public:
  MasterProcess();
  ~MasterProcess();
  MasterProcess(const MasterProcess&) = delete;
  MasterProcess& operator=(const MasterProcess&) = delete;

  // Picks two free ports (first call only) and starts
  //   granary-master --host 127.0.0.1 --port P --http-port H --log-level warn <extra_flags>
  // then waits until it serves. With --tls-cert (and --tls-key, --tls-ca) among the flags, the
  // stub calls over TLS presenting that same certificate.
  ::testing::AssertionResult Start(std::vector<std::string> extra_flags = {});
  // SIGKILL, then start again on the same ports with the same flags; a new channel and stub.
  ::testing::AssertionResult Restart();
  // Sends `sig` and waits (bounded) for the exit; nullopt if it did not exit in `timeout`.
  std::optional<ExitStatus> Stop(int sig, Millis timeout);

  pb::Master::Stub* stub() { return stub_.get(); }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  // A channel of its own (MakeChannel), over TLS as the stub's.
  std::shared_ptr<grpc::Channel> NewChannel() const;
  // The CA that verifies a master started with --tls-cert but no --tls-ca. Before Start.
  void set_tls_ca(std::string path) { tls_ca_ = std::move(path); }
  uint16_t grpc_port() const { return grpc_port_; }
  uint16_t http_port() const { return http_port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  ChildProcess& process() { return child_; }
  TempDir& dir() { return dir_; }
  bool Running() { return child_.Running(); }
  // The master's log so far (its stdout and stderr), for failure messages.
  std::string Log() const;

 private:
  ::testing::AssertionResult Launch();
  void Connect();

  TempDir dir_;
  ChildProcess child_;
  std::vector<std::string> extra_flags_;
  std::string tls_ca_;
  uint16_t grpc_port_ = 0;
  uint16_t http_port_ = 0;
  int launches_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Master::Stub> stub_;
};

// A fresh channel to `address` that reconnects quickly (no shared subchannel, short backoff) and
// accepts large replies; TLS with `credentials` (null: plain TCP).
std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// ReplicateConfig shorthand.
pb::ReplicateConfig Replicas(uint32_t n);

// One logical client of the master (a node, a writer, a reader), named by its client id.
class MasterClient {
 public:
  MasterClient(MasterProcess* master, std::string client_id)
      : master_(master), id_(std::move(client_id)) {}

  const std::string& id() const { return id_; }
  // Deadline of every call made from now on.
  void set_deadline(Millis d) { deadline_ = d; }

  // ---- segments and liveness ----
  pb::MountSegmentResponse Mount(const std::string& name, uint64_t size,
                                 const std::string& endpoint = "127.0.0.1:1");
  pb::UnmountSegmentResponse Unmount(const std::string& name);
  pb::ReMountSegmentResponse ReMount(const std::vector<pb::SegmentSpec>& segments);
  pb::ListSegmentsResponse ListSegments();
  pb::PingResponse Ping();

  // ---- writes ----
  pb::BatchPutStartResponse PutStart(const std::vector<std::string>& keys,
                                     const std::vector<uint64_t>& sizes,
                                     const pb::ReplicateConfig& config = Replicas(1),
                                     bool upsert = false);
  pb::PutStartResult PutStartOne(const std::string& key, uint64_t size,
                                 const pb::ReplicateConfig& config = Replicas(1),
                                 bool upsert = false);
  pb::BatchStatusResponse PutEnd(const std::vector<std::string>& keys,
                                 const std::vector<uint64_t>& checksums);
  int32_t PutEndOne(const std::string& key, uint64_t checksum);
  pb::BatchStatusResponse PutRevoke(const std::vector<std::string>& keys);
  int32_t PutRevokeOne(const std::string& key);
  // PutStart + PutEnd of one key; the first non-zero code, or 0.
  int32_t Put(const std::string& key, uint64_t size, uint64_t checksum = 0x5eed,
              const pb::ReplicateConfig& config = Replicas(1), bool upsert = false);
  // Puts every key (start then end, one batch each); ADD_FAILUREs any key that fails.
  void PutMany(const std::vector<std::string>& keys, uint64_t size,
               const pb::ReplicateConfig& config = Replicas(1));

  // ---- reads ----
  pb::BatchGetReplicaListResponse Get(const std::vector<std::string>& keys);
  pb::GetReplicaResult GetOne(const std::string& key);
  pb::BatchStatusResponse FinishRead(const std::vector<std::string>& keys);
  int32_t FinishReadOne(const std::string& key);
  // GetOne + FinishReadOne: touches the key's recency without keeping a lock. Returns the code of
  // the get.
  int32_t Touch(const std::string& key);
  std::vector<int32_t> Exist(const std::vector<std::string>& keys);
  int32_t ExistOne(const std::string& key);
  std::vector<int64_t> GetSize(const std::vector<std::string>& keys);
  pb::BatchPrefixMatchResponse PrefixMatch(const std::vector<std::string>& keys);
  pb::StatObjectResponse Stat(const std::string& key);

  // ---- removal and queries ----
  pb::BatchStatusResponse Remove(const std::vector<std::string>& keys, bool force = false);
  int32_t RemoveOne(const std::string& key, bool force = false);
  pb::RemoveCountResponse RemoveByRegex(const std::string& pattern, bool force = false);
  pb::QueryByRegexResponse QueryByRegex(const std::string& pattern, uint32_t limit = 0);
  pb::RemoveCountResponse RemoveAll(bool force = false);

  // The segment named `name` as ListSegments shows it; false if it is not mounted.
  bool FindSegment(const std::string& name, pb::SegmentInfo* out);

  // The status of the last call (OK unless the transport failed or the deadline passed).
  const grpc::Status& last_status() const { return last_status_; }
  // The generation of this client's last started put of `key` (0 if none); PutEnd and PutRevoke
  // quote it. Tests may overwrite it to play a stale writer.
  uint64_t PutGen(const std::string& key) const {
    auto it = put_gens_.find(key);
    return it == put_gens_.end() ? 0 : it->second;
  }
  void SetPutGen(const std::string& key, uint64_t gen) { put_gens_[key] = gen; }

 private:
  template <typename Resp, typename Fn>
  Resp Call(const char* method, Fn&& fn);

  std::unordered_map<std::string, uint64_t> put_gens_;
  MasterProcess* master_;
  std::string id_;
  Millis deadline_{10'000};
  grpc::Status last_status_;
};

// Base of the master test suites: owns a MasterProcess (not started: each test starts it with
// the flags it needs) and prints the master's log when a test failed.
class MasterTest : public ::testing::Test {
 protected:
  void TearDown() override;
  // master_.Start(flags).
  ::testing::AssertionResult StartMaster(std::vector<std::string> extra_flags = {});
  MasterClient Client(const std::string& id) { return MasterClient(&master_, id); }
  // A Ping and a BatchExist both answer: the master survived what the test did to it.
  void ExpectServing();

  MasterProcess master_;
};

}  // namespace granary::it
