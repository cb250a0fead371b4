// MasterService behind a ServingGate (master/service/serving_gate.h), with a fake gate: a refused
// Enter() answers every RPC with a coded non-OK status and applies nothing; Commit(seq) is asked
// with the seq of the operation the call applied, only for calls that change the state and did;
// replies that carry a term carry the gate's; a failed Commit is an error reply that does not
// claim nothing was applied; Exit() pairs with every successful Enter(). The fast port answers a
// refused call with an error frame that the FastChannel maps back to the code, and the
// connection stays usable.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "client/fast_channel.h"
#include "common/socket_io.h"
#include "master/policy/evictor.h"
#include "master/service/fast_server.h"
#include "master/service/master_service.h"
#include "master/service/serving_gate.h"
#include "master/state/master_state.h"
#include "proto/fast_frame.h"
#include "proto/rpc_util.h"

namespace granary::master {
namespace {

using namespace std::chrono_literals;

class FakeGate final : public ServingGate {
 public:
  Status Enter(bool update) override {
    std::lock_guard lock(mu_);
    enters_.push_back(update);
    if (!enter_.ok()) return enter_;
    inside_++;
    return Status::Ok();
  }
  void Exit() override {
    std::lock_guard lock(mu_);
    exits_++;
    inside_--;
  }
  Status Commit(uint64_t seq) override {
    std::lock_guard lock(mu_);
    commits_.push_back(seq);
    return commit_;
  }
  uint64_t term() const override { return term_; }

  void set_enter(Status s) {
    std::lock_guard lock(mu_);
    enter_ = std::move(s);
  }
  void set_commit(Status s) {
    std::lock_guard lock(mu_);
    commit_ = std::move(s);
  }
  void set_term(uint64_t t) { term_ = t; }
  std::vector<uint64_t> commits() const {
    std::lock_guard lock(mu_);
    return commits_;
  }
  std::vector<bool> enters() const {
    std::lock_guard lock(mu_);
    return enters_;
  }
  int exits() const {
    std::lock_guard lock(mu_);
    return exits_;
  }
  int inside() const {
    std::lock_guard lock(mu_);
    return inside_;
  }
  void Clear() {
    std::lock_guard lock(mu_);
    commits_.clear();
    enters_.clear();
    exits_ = 0;
  }

 private:
  mutable std::mutex mu_;
  Status enter_;
  Status commit_;
  std::atomic<uint64_t> term_{0};
  std::vector<uint64_t> commits_;
  std::vector<bool> enters_;
  int exits_ = 0;
  int inside_ = 0;
};

proto::SegmentSpec SegmentProto(const std::string& name) {
  proto::SegmentSpec s;
  s.set_name(name);
  s.set_size(16 << 20);
  s.set_endpoint("127.0.0.1:1");
  s.set_shm_name("granary-" + name);
  s.set_host_id("host/boot");
  s.set_token(7);
  s.set_fresh(true);
  return s;
}

class ServingGateTest : public ::testing::Test {
 protected:
  ServingGateTest()
      : state_(Policy(), WallClock::Instance()), evictor_(&state_),
        service_(&state_, &evictor_, &metrics_) {
    service_.set_gate(&gate_);
  }
  static MasterPolicy Policy() {
    MasterPolicy p;
    p.shard_count = 16;
    return p;
  }

  // Every RPC of the service, each with a request that would change the state (or read it).
  std::vector<std::pair<std::string, std::function<grpc::Status()>>> EveryCall() {
    std::vector<std::pair<std::string, std::function<grpc::Status()>>> calls;
    auto add = [&](std::string name, std::function<grpc::Status()> fn) {
      calls.emplace_back(std::move(name), std::move(fn));
    };
    add("MountSegment", [this] {
      proto::MountSegmentRequest req;
      req.set_client_id("node-9");
      *req.mutable_segment() = SegmentProto("seg-9");
      proto::MountSegmentResponse resp;
      return service_.MountSegment(nullptr, &req, &resp);
    });
    add("UnmountSegment", [this] {
      proto::UnmountSegmentRequest req;
      req.set_client_id("node");
      req.set_name("seg");
      proto::UnmountSegmentResponse resp;
      return service_.UnmountSegment(nullptr, &req, &resp);
    });
    add("ReMountSegment", [this] {
      proto::ReMountSegmentRequest req;
      req.set_client_id("node-8");
      *req.add_segments() = SegmentProto("seg-8");
      proto::ReMountSegmentResponse resp;
      return service_.ReMountSegment(nullptr, &req, &resp);
    });
    add("ListSegments", [this] {
      proto::ListSegmentsRequest req;
      proto::ListSegmentsResponse resp;
      return service_.ListSegments(nullptr, &req, &resp);
    });
    add("Ping", [this] {
      proto::PingRequest req;
      req.set_client_id("pinger");
      proto::PingResponse resp;
      return service_.Ping(nullptr, &req, &resp);
    });
    add("BatchPutStart", [this] {
      proto::BatchPutStartRequest req;
      req.set_client_id("c");
      req.add_keys("new-key");
      req.add_sizes(4096);
      proto::BatchPutStartResponse resp;
      return service_.BatchPutStart(nullptr, &req, &resp);
    });
    add("BatchPutEnd", [this] {
      proto::BatchPutEndRequest req;
      req.set_client_id("c");
      req.add_keys("pending");
      req.add_checksums(1);
      req.add_put_gens(pending_gen_);
      proto::BatchStatusResponse resp;
      return service_.BatchPutEnd(nullptr, &req, &resp);
    });
    add("BatchPutRevoke", [this] {
      proto::BatchPutRevokeRequest req;
      req.set_client_id("c");
      req.add_keys("pending");
      req.add_put_gens(pending_gen_);
      proto::BatchStatusResponse resp;
      return service_.BatchPutRevoke(nullptr, &req, &resp);
    });
    add("Reserve", [this] {
      proto::ReserveRequest req;
      req.set_client_id("c");
      req.set_size(4096);
      req.set_count(2);
      proto::ReserveResponse resp;
      return service_.Reserve(nullptr, &req, &resp);
    });
    add("BatchPutCommit", [this] {
      proto::BatchPutCommitRequest req;
      req.set_client_id("c");
      req.add_keys("committed");
      req.add_reservations(reservation_.gen);
      req.add_sizes(4096);
      req.add_checksums(3);
      req.add_segment_ids(reservation_.extent.segment_id);
      req.add_offsets(reservation_.extent.offset);
      proto::BatchStatusResponse resp;
      return service_.BatchPutCommit(nullptr, &req, &resp);
    });
    add("ReleaseReservations", [this] {
      proto::ReleaseReservationsRequest req;
      req.set_client_id("c");
      req.add_reservations(reservation_.gen);
      req.add_segment_ids(reservation_.extent.segment_id);
      req.add_offsets(reservation_.extent.offset);
      proto::BatchStatusResponse resp;
      return service_.ReleaseReservations(nullptr, &req, &resp);
    });
    add("BatchGetReplicaList", [this] {
      proto::BatchGetReplicaListRequest req;
      req.set_client_id("reader");
      req.add_keys("complete");
      proto::BatchGetReplicaListResponse resp;
      return service_.BatchGetReplicaList(nullptr, &req, &resp);
    });
    add("BatchFinishRead", [this] {
      proto::BatchFinishReadRequest req;
      req.set_client_id("locker");
      req.add_keys("complete");
      proto::BatchStatusResponse resp;
      return service_.BatchFinishRead(nullptr, &req, &resp);
    });
    add("BatchExist", [this] {
      proto::BatchExistRequest req;
      req.add_keys("complete");
      proto::BatchExistResponse resp;
      return service_.BatchExist(nullptr, &req, &resp);
    });
    add("BatchGetSize", [this] {
      proto::BatchGetSizeRequest req;
      req.add_keys("complete");
      proto::BatchGetSizeResponse resp;
      return service_.BatchGetSize(nullptr, &req, &resp);
    });
    add("BatchPrefixMatch", [this] {
      proto::BatchPrefixMatchRequest req;
      req.add_keys("complete");
      proto::BatchPrefixMatchResponse resp;
      return service_.BatchPrefixMatch(nullptr, &req, &resp);
    });
    add("StatObject", [this] {
      proto::StatObjectRequest req;
      req.set_key("complete");
      proto::StatObjectResponse resp;
      return service_.StatObject(nullptr, &req, &resp);
    });
    add("BatchRemove", [this] {
      proto::BatchRemoveRequest req;
      req.add_keys("complete");
      req.set_force(true);
      proto::BatchStatusResponse resp;
      return service_.BatchRemove(nullptr, &req, &resp);
    });
    add("RemoveByRegex", [this] {
      proto::RegexRequest req;
      req.set_pattern(".*");
      req.set_force(true);
      proto::RemoveCountResponse resp;
      return service_.RemoveByRegex(nullptr, &req, &resp);
    });
    add("QueryByRegex", [this] {
      proto::RegexRequest req;
      req.set_pattern(".*");
      proto::QueryByRegexResponse resp;
      return service_.QueryByRegex(nullptr, &req, &resp);
    });
    add("RemoveAll", [this] {
      proto::RemoveAllRequest req;
      req.set_force(true);
      proto::RemoveCountResponse resp;
      return service_.RemoveAll(nullptr, &req, &resp);
    });
    add("DiskRegister", [this] {
      proto::DiskRegisterRequest req;
      req.set_client_id("node");
      req.set_disk_id(77);
      req.set_complete(true);
      proto::BatchStatusResponse resp;
      return service_.DiskRegister(nullptr, &req, &resp);
    });
    add("DiskDrop", [this] {
      proto::DiskDropRequest req;
      req.set_client_id("node");
      req.add_keys("complete");
      req.add_locations(1);
      proto::BatchStatusResponse resp;
      return service_.DiskDrop(nullptr, &req, &resp);
    });
    add("OffloadStart", [this] {
      proto::OffloadStartRequest req;
      req.set_client_id("node");
      req.set_disk_id(77);
      req.set_max_keys(10);
      req.set_max_bytes(1 << 20);
      req.add_deleted_ids(1);
      req.set_round(1);
      proto::OffloadStartResponse resp;
      return service_.OffloadStart(nullptr, &req, &resp);
    });
    add("OffloadEnd", [this] {
      proto::OffloadEndRequest req;
      req.set_client_id("node");
      req.add_keys("complete");
      req.add_version_gens(1);
      req.add_locations(1);
      req.add_written(false);
      proto::BatchStatusResponse resp;
      return service_.OffloadEnd(nullptr, &req, &resp);
    });
    add("PromoteEnd", [this] {
      proto::PromoteEndRequest req;
      req.set_client_id("node");
      req.set_round(1);
      req.add_keys("complete");
      req.add_version_gens(1);
      req.add_copied(false);
      proto::BatchStatusResponse resp;
      return service_.PromoteEnd(nullptr, &req, &resp);
    });
    add("ClusterStatus", [this] {
      proto::ClusterStatusRequest req;
      proto::ClusterStatusResponse resp;
      return service_.ClusterStatus(nullptr, &req, &resp);
    });
    return calls;
  }

  // A state worth changing: a node's segment, a complete object with a read lock, a pending put
  // and a reservation.
  void Populate() {
    ASSERT_TRUE(state_.Mount({"node", {"seg", 16 << 20, "127.0.0.1:1", "granary-seg",
                                       "host/boot", 7, true}})
                    .status.ok());
    auto started = state_.PutStart({"c", {"complete", "pending"}, {4096, 4096}, {}, false});
    ASSERT_TRUE(started[0].status.ok());
    ASSERT_TRUE(started[1].status.ok());
    ASSERT_TRUE(state_.PutEnd({"c", {"complete"}, {9}, {started[0].put_gen}})[0].ok());
    pending_gen_ = started[1].put_gen;
    (void)state_.GetReplicaList({"locker", {"complete"}});
    ReserveResult r = state_.Reserve({"c", 4096, 1, {}});
    ASSERT_EQ(r.granted.size(), 1u);
    reservation_ = r.granted[0];
  }

  FakeGate gate_;
  MasterState state_;
  Evictor evictor_;
  MetricsRegistry metrics_;
  MasterService service_;
  uint64_t pending_gen_ = 0;
  Reservation reservation_;
};

TEST_F(ServingGateTest, ARefusedEnterAnswersEveryCallWithItsCodeAndAppliesNothing) {
  Populate();
  gate_.set_enter(Status(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, "this master is not the leader"));
  const MasterState::Fingerprint before = state_.StateFingerprint();
  auto calls = EveryCall();
  ASSERT_GE(calls.size(), 27u);
  for (auto& [name, call] : calls) {
    const grpc::Status g = call();
    EXPECT_FALSE(g.ok()) << name;
    EXPECT_EQ(g.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << name << ": a refusal";
    auto coded = rpc::ParseCodedMessage(g.error_message());
    ASSERT_TRUE(coded.has_value()) << name << ": " << g.error_message();
    EXPECT_EQ(coded->code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE) << name;
    EXPECT_EQ(g.error_message().rfind("granary:", 0), 0u) << name;
    EXPECT_NE(g.error_message().find("not the leader"), std::string::npos) << name;
    EXPECT_EQ(rpc::FromGrpc(g, name).code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE) << name;
  }
  const MasterState::Fingerprint after = state_.StateFingerprint();
  EXPECT_EQ(after.seq, before.seq) << "a refused call applied an operation";
  EXPECT_EQ(after.digest, before.digest);
  EXPECT_TRUE(gate_.commits().empty());
  EXPECT_EQ(gate_.exits(), 0) << "Exit pairs only with a successful Enter";
  EXPECT_EQ(gate_.enters().size(), calls.size()) << "every call asked the gate";

  // Another refusal code (a leader with no synchronous standby) comes back as itself.
  gate_.set_enter(Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, "no synchronous standby"));
  for (auto& [name, call] : calls) {
    const grpc::Status g = call();
    auto coded = rpc::ParseCodedMessage(g.error_message());
    ASSERT_TRUE(coded.has_value()) << name;
    EXPECT_EQ(coded->code(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS) << name;
  }
  EXPECT_EQ(state_.last_seq(), before.seq);
}

// Updates ask the gate with update=true and Commit the seq they applied; queries ask with false
// and never Commit; soft calls (Ping, BatchFinishRead) change the state but need no synchronous
// standby and do not wait (a failover may lose them).
TEST_F(ServingGateTest, CommitIsAskedForTheSeqAnUpdateApplied) {
  Populate();
  gate_.set_term(77);
  struct Expect {
    const char* name;
    bool update;        // Enter(update)
    bool commits;       // Commit(last seq) asked
  };
  const Expect table[] = {
      {"MountSegment", true, true},       {"ReMountSegment", true, true},
      {"ListSegments", false, false},     {"Ping", false, false},
      {"BatchPutStart", true, true},      {"BatchPutEnd", true, true},
      {"Reserve", true, true},            {"BatchPutCommit", true, true},
      {"BatchGetReplicaList", true, true}, {"BatchFinishRead", false, false},
      {"BatchExist", false, false},       {"BatchGetSize", false, false},
      {"BatchPrefixMatch", false, false}, {"StatObject", false, false},
      {"QueryByRegex", false, false},     {"DiskRegister", true, true},
      {"ClusterStatus", false, false},    {"BatchRemove", true, true},
      {"RemoveAll", true, true},
  };
  auto calls = EveryCall();
  for (const Expect& e : table) {
    auto it = std::find_if(calls.begin(), calls.end(), [&](auto& c) { return c.first == e.name; });
    ASSERT_NE(it, calls.end()) << e.name;
    gate_.Clear();
    const uint64_t before = state_.last_seq();
    const grpc::Status g = it->second();
    ASSERT_TRUE(g.ok()) << e.name << ": " << g.error_message();
    ASSERT_EQ(gate_.enters().size(), 1u) << e.name;
    EXPECT_EQ(gate_.enters()[0], e.update) << e.name;
    EXPECT_EQ(gate_.exits(), 1) << e.name;
    EXPECT_EQ(gate_.inside(), 0) << e.name;
    if (e.commits) {
      EXPECT_GT(state_.last_seq(), before) << e.name << " applied nothing";
      EXPECT_EQ(gate_.commits(), std::vector<uint64_t>{state_.last_seq()}) << e.name;
    } else {
      EXPECT_TRUE(gate_.commits().empty()) << e.name;
    }
  }
  // An update that applies nothing has nothing to wait for.
  gate_.Clear();
  proto::UnmountSegmentRequest bad;  // no client id: refused before any operation
  proto::UnmountSegmentResponse bad_resp;
  const uint64_t before = state_.last_seq();
  ASSERT_TRUE(service_.UnmountSegment(nullptr, &bad, &bad_resp).ok());
  EXPECT_NE(bad_resp.code(), 0);
  EXPECT_EQ(state_.last_seq(), before);
  EXPECT_TRUE(gate_.commits().empty());
  EXPECT_EQ(gate_.exits(), 1);
}

TEST_F(ServingGateTest, RepliesCarryTheGatesTerm) {
  Populate();
  gate_.set_term(123456789);
  proto::BatchPutStartRequest put;
  put.set_client_id("c");
  put.add_keys("termed");
  put.add_sizes(4096);
  proto::BatchPutStartResponse started;
  ASSERT_TRUE(service_.BatchPutStart(nullptr, &put, &started).ok());
  EXPECT_EQ(started.term(), 123456789u);
  ASSERT_EQ(started.results_size(), 1);
  EXPECT_EQ(started.results(0).code(), 0);

  proto::BatchGetReplicaListRequest get;
  get.set_client_id("r");
  get.add_keys("complete");
  proto::BatchGetReplicaListResponse got;
  ASSERT_TRUE(service_.BatchGetReplicaList(nullptr, &get, &got).ok());
  EXPECT_EQ(got.term(), 123456789u);

  proto::ReserveRequest reserve;
  reserve.set_client_id("c");
  reserve.set_size(4096);
  reserve.set_count(1);
  proto::ReserveResponse reserved;
  ASSERT_TRUE(service_.Reserve(nullptr, &reserve, &reserved).ok());
  EXPECT_EQ(reserved.term(), 123456789u);

  proto::PingRequest ping;
  ping.set_client_id("p");
  proto::PingResponse pong;
  ASSERT_TRUE(service_.Ping(nullptr, &ping, &pong).ok());
  EXPECT_EQ(pong.term(), 123456789u);

  proto::ListSegmentsRequest list;
  proto::ListSegmentsResponse listed;
  ASSERT_TRUE(service_.ListSegments(nullptr, &list, &listed).ok());
  EXPECT_EQ(listed.term(), 123456789u);

  proto::MountSegmentRequest mount;
  mount.set_client_id("node-t");
  *mount.mutable_segment() = SegmentProto("seg-t");
  proto::MountSegmentResponse mounted;
  ASSERT_TRUE(service_.MountSegment(nullptr, &mount, &mounted).ok());
  EXPECT_EQ(mounted.term(), 123456789u);

  // Without a gate: term 0 (a master running alone).
  service_.set_gate(nullptr);
  proto::BatchPutStartResponse alone;
  put.set_keys(0, "alone");
  ASSERT_TRUE(service_.BatchPutStart(nullptr, &put, &alone).ok());
  EXPECT_EQ(alone.term(), 0u);
}

// A failed Commit: the operation happened here but may not survive a failover. The reply is an
// error, and never one that tells the client nothing was applied (which a client takes as a
// refusal and sends again to the next leader).
TEST_F(ServingGateTest, AFailedCommitIsAnErrorThatIsNotARefusal) {
  Populate();
  for (ErrorCode code : {ErrorCode::RPC_TIMEOUT, ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                         ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS}) {
    gate_.set_commit(Status(code, "no synchronous standby acknowledged it; outcome unknown"));
    const uint64_t before = state_.last_seq();
    proto::BatchPutStartRequest put;
    put.set_client_id("c");
    put.add_keys("unsure-" + std::to_string(static_cast<int>(code)));
    put.add_sizes(4096);
    proto::BatchPutStartResponse resp;
    const grpc::Status g = service_.BatchPutStart(nullptr, &put, &resp);
    EXPECT_FALSE(g.ok()) << ErrorCodeName(code);
    EXPECT_GT(state_.last_seq(), before) << "the operation happened";
    EXPECT_NE(g.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
        << ErrorCodeName(code) << ": a failed Commit must not read as 'nothing applied'";
    auto coded = rpc::ParseCodedMessage(g.error_message());
    ASSERT_TRUE(coded.has_value()) << g.error_message();
    const Status client_side = rpc::FromGrpc(g, "put start");
    EXPECT_NE(client_side.code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE)
        << ErrorCodeName(code) << ": the client would retry an applied call elsewhere";
    EXPECT_NE(client_side.code(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS) << ErrorCodeName(code);
    EXPECT_NE(client_side.message().find("outcome unknown"), std::string::npos)
        << client_side.ToString();
    EXPECT_EQ(gate_.inside(), 0);
  }
}

// Commit must follow the operation this call applied even when the thread's previous call
// applied an operation with the same seq number (the state went back to an earlier seq in
// between: a deposed leader that loaded the new leader's snapshot and leads again).
TEST_F(ServingGateTest, CommitFollowsTheCallEvenWhenTheStateWentBack) {
  Populate();
  const std::string snapshot = state_.EncodeSnapshot();
  const uint64_t base_seq = state_.last_seq();
  proto::BatchPutStartRequest put;
  put.set_client_id("c");
  put.add_keys("first-life");
  put.add_sizes(4096);
  proto::BatchPutStartResponse resp;
  ASSERT_TRUE(service_.BatchPutStart(nullptr, &put, &resp).ok());
  ASSERT_EQ(gate_.commits(), std::vector<uint64_t>{base_seq + 1});
  // The state goes back to before that put (it was never replicated) ...
  ASSERT_TRUE(state_.LoadSnapshot(snapshot).ok());
  ASSERT_EQ(state_.last_seq(), base_seq);
  gate_.Clear();
  // ... and the same thread's next update applies an operation with the same seq.
  put.set_keys(0, "second-life");
  ASSERT_TRUE(service_.BatchPutStart(nullptr, &put, &resp).ok());
  ASSERT_EQ(state_.last_seq(), base_seq + 1);
  EXPECT_EQ(gate_.commits(), std::vector<uint64_t>{base_seq + 1})
      << "the reply went out without waiting for its operation's replication";
}

// ---- the fast port ----

std::string FastRequest(fast::Method method, uint32_t id, const google::protobuf::Message& m) {
  const std::string body = m.SerializeAsString();
  std::string out(fast::kHeaderSize, '\0');
  fast::EncodeHeader({static_cast<uint8_t>(method), 0, id, static_cast<uint32_t>(body.size())},
                     reinterpret_cast<unsigned char*>(out.data()));
  return out + body;
}

// One reply frame: its header and body.
std::pair<fast::Header, std::string> ReadReply(int fd) {
  unsigned char h[fast::kHeaderSize];
  fast::Header header;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  if (!net::RecvExact(fd, reinterpret_cast<char*>(h), sizeof(h), deadline).ok() ||
      fast::DecodeHeader(h, &header, fast::kMaxFastReply) != fast::HeaderError::kNone) {
    ADD_FAILURE() << "no reply frame";
    return {};
  }
  std::string body(header.body_size, '\0');
  if (!net::RecvExact(fd, body.data(), body.size(), deadline).ok()) ADD_FAILURE() << "short body";
  return {header, body};
}

TEST_F(ServingGateTest, TheFastPortAnswersARefusalWithItsCodeAndKeepsTheConnection) {
  Populate();
  FastServer server(&service_, &metrics_);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  gate_.set_enter(Status(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, "this master is not the leader"));
  const uint64_t before = state_.last_seq();

  proto::BatchPutStartRequest put;
  put.set_client_id("c");
  put.add_keys("fast-key");
  put.add_sizes(4096);
  proto::BatchPutStartResponse started;
  client::FastChannel channel("127.0.0.1", server.port(), 5000);
  bool sent = false;
  Status s = channel.Call(fast::Method::kPutStart, put, &started, false, &sent);
  EXPECT_EQ(s.code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE) << s.ToString();
  EXPECT_EQ(state_.last_seq(), before);
  proto::BatchExistRequest exist;
  exist.add_keys("complete");
  proto::BatchExistResponse exists;
  s = channel.Call(fast::Method::kExist, exist, &exists, true, &sent);
  EXPECT_EQ(s.code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE) << s.ToString();

  // The gate opens: the same channel serves.
  gate_.set_enter(Status::Ok());
  s = channel.Call(fast::Method::kPutStart, put, &started, false, &sent);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(started.results_size(), 1);
  EXPECT_EQ(started.results(0).code(), 0);
  EXPECT_EQ(state_.last_seq(), before + 1);

  // On one raw connection: a refused call, then a served one, answered in order by request id.
  auto fd = net::ConnectTcp("127.0.0.1", server.port(), std::chrono::steady_clock::now() + 5s);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  gate_.set_enter(Status(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, "this master is not the leader"));
  ASSERT_TRUE(net::SendAll(*fd, FastRequest(fast::Method::kExist, 41, exist),
                           std::chrono::steady_clock::now() + 5s)
                  .ok());
  auto [h1, b1] = ReadReply(*fd);
  EXPECT_EQ(h1.request_id, 41u);
  EXPECT_NE(h1.flags & fast::kError, 0);
  auto coded = rpc::ParseCodedMessage(b1);
  ASSERT_TRUE(coded.has_value()) << b1;
  EXPECT_EQ(coded->code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE);
  gate_.set_enter(Status::Ok());
  ASSERT_TRUE(net::SendAll(*fd, FastRequest(fast::Method::kExist, 42, exist),
                           std::chrono::steady_clock::now() + 5s)
                  .ok());
  auto [h2, b2] = ReadReply(*fd);
  EXPECT_EQ(h2.request_id, 42u);
  EXPECT_EQ(h2.flags & fast::kError, 0) << b2;
  proto::BatchExistResponse reply;
  ASSERT_TRUE(reply.ParseFromString(b2));
  ASSERT_EQ(reply.results_size(), 1);
  EXPECT_EQ(reply.results(0), 1);
  ::close(*fd);
  server.Stop();
}

}  // namespace
}  // namespace granary::master
