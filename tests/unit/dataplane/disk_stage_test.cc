// Same-host disk loads through the node's shared-memory staging region (DISK_STAGE,
// STAGE_RELEASE, STAGE_INFO; node/shm_staging.h, transfer/shm_staging.h): a real DiskStore in a
// temporary directory, a real DataServer on 127.0.0.1, the client's TcpTransport and
// StagingView, and raw sockets for hostile and half-finished conversations. Also built under
// ASan (dataplane_asan_tests).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "../disk_test_util.h"
#include "common/checksum.h"
#include "node/data_server.h"
#include "node/disk_read_service.h"
#include "node/shm_staging.h"
#include "raw_conn.h"
#include "transfer/protocol.h"
#include "transfer/shm_staging.h"
#include "transfer/tcp_transport.h"

namespace granary {
namespace {

using disk::testing::TempDir;
using disk::testing::ValueFor;
using node::DataServer;
using node::DiskReadService;
using node::ShmStaging;
using testing::RawConn;
using transfer::DiskReadBody;
using transfer::DiskReadEntry;
using transfer::DiskReadItem;
using transfer::Opcode;
using transfer::RequestHeader;
using transfer::ResponseHeader;
using transfer::SlotRef;
using transfer::StagedSlot;
using transfer::StagingView;

struct Stored {
  std::string key;
  std::vector<std::byte> value;
  disk::StoredObject copy;
};

// One DISK_STAGE answer entry, as a raw client sees it.
struct RawAnswer {
  ErrorCode code = ErrorCode::INTERNAL_ERROR;
  StagedSlot slot;
};

class DiskStageTest : public ::testing::Test {
 protected:
  void OpenStore(disk::DiskBackend backend = disk::DiskBackend::kBucket) {
    disk::DiskStoreOptions o;
    o.dir = dir_.path();
    o.backend = backend;
    o.disk_size = 64ull << 20;
    auto store = disk::DiskStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }
  void WriteObjects(const std::vector<size_t>& sizes) {
    std::vector<disk::ObjectWrite> writes;
    const size_t first = objects_.size();
    for (size_t size : sizes) {
      Stored s;
      s.key = "obj/" + std::to_string(objects_.size());
      s.value = ValueFor(s.key, 1, size);
      objects_.push_back(std::move(s));
    }
    for (size_t i = first; i < objects_.size(); ++i) {
      writes.push_back({objects_[i].key, 1, objects_[i].value, Checksum(objects_[i].value)});
    }
    auto written = store_->Write(writes);
    for (size_t i = 0; i < written.size(); ++i) {
      ASSERT_TRUE(written[i].ok()) << written[i].status().ToString();
      objects_[first + i].copy = *written[i];
    }
  }
  void StartServer(uint64_t region_bytes, int ttl_ms = 30000, int budget_wait_ms = 5000) {
    static std::atomic<int> n{0};
    ShmStaging::Options so;
    so.bytes = region_bytes;
    so.slot_ttl_ms = ttl_ms;
    auto staging = ShmStaging::Create(
        "granary-test-stage-" + std::to_string(getpid()) + "-" + std::to_string(n++), so);
    ASSERT_TRUE(staging.ok()) << staging.status().ToString();
    staging_ = std::move(*staging);
    DiskReadService::Options ro;
    ro.budget_wait_ms = budget_wait_ms;
    ro.on_lost = [this](std::string_view key, uint64_t location) {
      std::lock_guard lock(lost_mu_);
      lost_[std::string(key)] = location;
    };
    reads_ = std::make_unique<DiskReadService>(store_.get(), ro);
    DataServer::Options o;
    o.idle_timeout_ms = 5000;
    server_ = std::make_unique<DataServer>(segment_.data(), segment_.size(), 42, o);
    server_->SetDiskReads(reads_.get());
    server_->SetShmStaging(staging_.get());
    ASSERT_TRUE(server_->Start().ok());
    endpoint_ = "127.0.0.1:" + std::to_string(server_->port());
    auto view = StagingView::Attach(staging_->name(), staging_->token());
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    view_ = std::move(*view);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  std::vector<uint8_t> BodyFor(const std::vector<size_t>& which) {
    std::vector<uint8_t> body(sizeof(DiskReadBody));
    DiskReadBody head;
    head.count = static_cast<uint32_t>(which.size());
    std::memcpy(body.data(), &head, sizeof(head));
    for (size_t i : which) {
      const Stored& s = objects_[i];
      DiskReadEntry e;
      e.location = s.copy.location;
      e.checksum = s.copy.checksum;
      e.size = s.value.size();
      e.key_len = static_cast<uint32_t>(s.key.size());
      const size_t at = body.size();
      body.resize(at + sizeof(e) + s.key.size());
      std::memcpy(body.data() + at, &e, sizeof(e));
      std::memcpy(body.data() + at + sizeof(e), s.key.data(), s.key.size());
    }
    return body;
  }
  // A DISK_STAGE of objects_[which] on `conn`; nullopt when the answer is malformed or cut.
  std::optional<std::vector<RawAnswer>> Stage(RawConn& conn, const std::vector<size_t>& which) {
    std::vector<uint8_t> body = BodyFor(which);
    RequestHeader h;
    h.opcode = Opcode::kDiskStage;
    h.request_id = 7;
    h.length = body.size();
    if (!conn.SendHeader(h) || !conn.Send(body.data(), body.size())) return std::nullopt;
    auto head = conn.RecvResponse();
    if (!head || head->status != 0 || head->length != which.size()) return std::nullopt;
    std::vector<RawAnswer> out(which.size());
    for (size_t i = 0; i < which.size(); ++i) {
      auto eh = conn.RecvResponse();
      if (!eh || eh->request_id != i) return std::nullopt;
      out[i].code = ErrorCodeFromInt(eh->status);
      if (eh->status == 0) {
        if (eh->length != sizeof(StagedSlot) || !conn.Recv(&out[i].slot, sizeof(StagedSlot))) {
          return std::nullopt;
        }
      } else if (eh->length != 0) {
        return std::nullopt;
      }
    }
    return out;
  }
  // A STAGE_RELEASE of `refs`: the per-ref codes, or the request's refusal as a single code.
  std::vector<ErrorCode> Release(RawConn& conn, const std::vector<SlotRef>& refs,
                                 uint32_t claimed_count = UINT32_MAX) {
    transfer::StageReleaseBody rb;
    rb.count = claimed_count == UINT32_MAX ? static_cast<uint32_t>(refs.size()) : claimed_count;
    RequestHeader h;
    h.opcode = Opcode::kStageRelease;
    h.request_id = 9;
    h.length = sizeof(rb) + refs.size() * sizeof(SlotRef);
    EXPECT_TRUE(conn.SendHeader(h) && conn.Send(&rb, sizeof(rb)) &&
                conn.Send(refs.data(), refs.size() * sizeof(SlotRef)));
    auto rh = conn.RecvResponse();
    if (!rh) return {ErrorCode::TRANSFER_FAIL};
    if (rh->status != 0) return {ErrorCodeFromInt(rh->status)};
    std::vector<int32_t> codes(rh->length / sizeof(int32_t));
    EXPECT_TRUE(conn.Recv(codes.data(), rh->length));
    std::vector<ErrorCode> out;
    for (int32_t c : codes) out.push_back(ErrorCodeFromInt(c));
    return out;
  }
  static SlotRef RefOf(const StagedSlot& s) { return {s.slot, 0, s.generation}; }
  // Copies a staged object out through the client's view; the bytes, or the copy's error.
  Result<std::vector<std::byte>> CopyOut(const StagedSlot& s) {
    std::vector<std::byte> out(s.length);
    uint64_t sum = 0;
    Status st = view_->Copy(s, {std::span<std::byte>(out)}, &sum);
    if (!st.ok()) return st;
    EXPECT_EQ(sum, Checksum(out));
    return out;
  }
  // Waits (bounded) until the region has `n` slots in use.
  bool WaitSlotsInUse(uint64_t n) {
    for (int i = 0; i < 500; ++i) {
      if (staging_->stats().slots_in_use == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  TempDir dir_;
  std::unique_ptr<disk::DiskStore> store_;
  std::vector<Stored> objects_;
  std::vector<uint8_t> segment_ = std::vector<uint8_t>(1 << 16);
  std::unique_ptr<ShmStaging> staging_;
  std::unique_ptr<DiskReadService> reads_;
  std::unique_ptr<DataServer> server_;
  std::unique_ptr<StagingView> view_;
  std::string endpoint_;
  transfer::TcpTransport tcp_;
  std::mutex lost_mu_;
  std::map<std::string, uint64_t> lost_;
};

TEST_F(DiskStageTest, StagedAnswersCarryTheRightBytesAndReleaseEverySlot) {
  OpenStore();
  std::vector<size_t> sizes;
  for (int i = 0; i < 40; ++i) sizes.push_back(1 + (static_cast<size_t>(i) * 7919) % (300 << 10));
  WriteObjects(sizes);
  StartServer(8 << 20);
  auto info = tcp_.StageInfo(endpoint_);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->name, staging_->name());
  EXPECT_EQ(info->token, staging_->token());
  EXPECT_EQ(info->data_bytes, staging_->data_bytes());

  std::vector<std::vector<std::byte>> bufs(objects_.size());
  std::vector<DiskReadItem> items;
  for (size_t i = 0; i < objects_.size(); ++i) {
    bufs[i].assign(objects_[i].value.size(), std::byte{0});
    items.push_back({objects_[i].key, objects_[i].copy.location, objects_[i].copy.checksum,
                     objects_[i].value.size(), {std::span<std::byte>(bufs[i])}});
  }
  std::vector<uint64_t> sums(items.size());
  const uint64_t requests_before = server_->stats().requests;
  // 1 MiB per request: several DISK_STAGE + STAGE_RELEASE pairs on one connection.
  std::vector<Status> got = tcp_.ReadDiskStaged(
      endpoint_, items, 1 << 20, [&](size_t k, const StagedSlot& s) {
        EXPECT_EQ(s.offset % 4096, 0u) << "O_DIRECT needs 4 KiB-aligned staging";
        EXPECT_EQ(staging_->stats().slots_in_use > 0, true) << "a slot freed before its copy";
        return view_->Copy(s, items[k].dst, &sums[k]);
      });
  for (size_t i = 0; i < items.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << objects_[i].key << ": " << got[i].ToString();
    EXPECT_EQ(bufs[i], objects_[i].value) << objects_[i].key;
    EXPECT_EQ(sums[i], objects_[i].copy.checksum);
  }
  EXPECT_GT(server_->stats().requests - requests_before, 2u) << "cut by max_request_bytes";
  const auto st = staging_->stats();
  EXPECT_EQ(st.granted, objects_.size());
  EXPECT_EQ(st.released, objects_.size()) << "the client released every slot itself";
  EXPECT_EQ(st.slots_in_use, 0u);
  EXPECT_EQ(st.bytes_in_use, 0u);
  EXPECT_EQ(server_->stats().disk_bytes_read, 0u) << "no bytes went over the socket";
  uint64_t total = 0;
  for (const auto& s : objects_) total += s.value.size();
  EXPECT_EQ(server_->stats().disk_bytes_staged, total);
  // The connection stayed in sync: plain DISK_READ on the pooled connection still works.
  std::vector<Status> again = tcp_.ReadDisk(endpoint_, std::span(items).first(3));
  for (const Status& s : again) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(tcp_.IdleConnections(endpoint_), 1u);
}

TEST_F(DiskStageTest, AReleaseFreesBudgetForTheNextRequest) {
  OpenStore();
  WriteObjects({600 << 10, 600 << 10});
  StartServer(1 << 20, 30000, /*budget_wait_ms=*/200);  // room for one of them at a time
  RawConn a(server_->port()), b(server_->port());
  auto first = Stage(a, {0});
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ((*first)[0].code, ErrorCode::OK);
  auto bytes = CopyOut((*first)[0].slot);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(*bytes, objects_[0].value);
  // Held by `a`: `b` waits the bounded time and is told the region is busy.
  auto busy = Stage(b, {1});
  ASSERT_TRUE(busy.has_value());
  EXPECT_EQ((*busy)[0].code, ErrorCode::NO_AVAILABLE_HANDLE);
  EXPECT_EQ(Release(a, {RefOf((*first)[0].slot)}), std::vector<ErrorCode>{ErrorCode::OK});
  auto second = Stage(b, {1});
  ASSERT_TRUE(second.has_value());
  ASSERT_EQ((*second)[0].code, ErrorCode::OK);
  auto second_bytes = CopyOut((*second)[0].slot);
  ASSERT_TRUE(second_bytes.ok());
  EXPECT_EQ(*second_bytes, objects_[1].value);
  EXPECT_EQ(staging_->stats().released, 1u);
}

TEST_F(DiskStageTest, AClosedConnectionsSlotsAreReleased) {
  OpenStore();
  WriteObjects({600 << 10, 600 << 10});
  StartServer(1 << 20, 30000, 3000);
  StagedSlot held;
  {
    RawConn a(server_->port());
    auto first = Stage(a, {0});
    ASSERT_TRUE(first.has_value());
    ASSERT_EQ((*first)[0].code, ErrorCode::OK);
    held = (*first)[0].slot;
    EXPECT_EQ(staging_->stats().slots_in_use, 1u);
  }  // closed without a release: the client died
  ASSERT_TRUE(WaitSlotsInUse(0)) << "the closed connection's slot was kept";
  EXPECT_EQ(staging_->stats().closed, 1u);
  EXPECT_NE(staging_->generation(held.slot), held.generation) << "freed without a new generation";
  EXPECT_EQ(CopyOut(held).status().code(), ErrorCode::SEGMENT_NOT_FOUND);
  RawConn b(server_->port());
  const auto t0 = std::chrono::steady_clock::now();
  auto second = Stage(b, {1});
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ((*second)[0].code, ErrorCode::OK);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2000))
      << "waited for budget a closed connection held";
}

TEST_F(DiskStageTest, TheTtlReclaimsAnUnreleasedSlotAndALateCopyIsDetected) {
  OpenStore();
  WriteObjects({600 << 10, 600 << 10});
  StartServer(1 << 20, /*ttl_ms=*/200, /*budget_wait_ms=*/3000);
  RawConn a(server_->port()), b(server_->port());
  auto first = Stage(a, {0});  // `a` stays open but never releases: a stopped client
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ((*first)[0].code, ErrorCode::OK);
  const StagedSlot late = (*first)[0].slot;
  // `b` needs the space: it waits until the TTL frees `a`'s slot, then reuses it.
  auto second = Stage(b, {1});
  ASSERT_TRUE(second.has_value());
  ASSERT_EQ((*second)[0].code, ErrorCode::OK);
  EXPECT_EQ(staging_->stats().reclaimed, 1u);
  EXPECT_EQ((*second)[0].slot.offset, late.offset) << "the test wants the space reused";
  EXPECT_GT(staging_->generation(late.slot), late.generation);
  // `a` resumes and copies: its range now holds obj/1's bytes, and the copy must say so.
  auto copied = CopyOut(late);
  EXPECT_EQ(copied.status().code(), ErrorCode::SEGMENT_NOT_FOUND) << "a late copy was accepted";
  // Its release comes too late as well and frees nothing of `b`'s.
  EXPECT_EQ(Release(a, {RefOf(late)}), std::vector<ErrorCode>{ErrorCode::OBJECT_NOT_FOUND});
  auto fresh = CopyOut((*second)[0].slot);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(*fresh, objects_[1].value);
  EXPECT_EQ(Release(b, {RefOf((*second)[0].slot)}), std::vector<ErrorCode>{ErrorCode::OK});
}

TEST_F(DiskStageTest, HostileReleasesAreRefusedAndFreeNobodysSlot) {
  OpenStore();
  WriteObjects({100 << 10, 100 << 10});
  StartServer(4 << 20);
  RawConn a(server_->port()), b(server_->port());
  auto sa = Stage(a, {0});
  auto sb = Stage(b, {1});
  ASSERT_TRUE(sa && sb);
  ASSERT_EQ((*sa)[0].code, ErrorCode::OK);
  ASSERT_EQ((*sb)[0].code, ErrorCode::OK);
  const StagedSlot mine = (*sa)[0].slot, theirs = (*sb)[0].slot;
  // Another connection's slot, an unknown id, a made-up generation, a reserved field.
  SlotRef bad_reserved = RefOf(mine);
  bad_reserved.reserved = 1;
  EXPECT_EQ(Release(a, {RefOf(theirs), {staging_->slot_count(), 0, 1},
                        {mine.slot, 0, mine.generation + 5}, bad_reserved}),
            (std::vector<ErrorCode>{ErrorCode::ILLEGAL_CLIENT, ErrorCode::INVALID_PARAMS,
                                    ErrorCode::OBJECT_NOT_FOUND, ErrorCode::INVALID_PARAMS}));
  EXPECT_EQ(staging_->stats().slots_in_use, 2u) << "a hostile release freed a slot";
  EXPECT_EQ(staging_->generation(theirs.slot), theirs.generation);
  // A count the body does not hold, a zero count, a count over the limit: the whole request.
  EXPECT_EQ(Release(a, {RefOf(mine)}, 1u << 30), std::vector<ErrorCode>{ErrorCode::INVALID_PARAMS});
  EXPECT_EQ(Release(a, {}, 0), std::vector<ErrorCode>{ErrorCode::INVALID_PARAMS});
  EXPECT_EQ(Release(a, {RefOf(mine)}, 2), std::vector<ErrorCode>{ErrorCode::INVALID_PARAMS});
  EXPECT_EQ(staging_->stats().slots_in_use, 2u);
  // The owner's release works once; a double release frees nothing.
  EXPECT_EQ(Release(a, {RefOf(mine)}), std::vector<ErrorCode>{ErrorCode::OK});
  EXPECT_EQ(Release(a, {RefOf(mine)}), std::vector<ErrorCode>{ErrorCode::OBJECT_NOT_FOUND});
  EXPECT_EQ(staging_->stats().slots_in_use, 1u);
  auto still = CopyOut(theirs);
  ASSERT_TRUE(still.ok()) << "another connection's slot was disturbed";
  EXPECT_EQ(*still, objects_[1].value);
  EXPECT_EQ(Release(b, {RefOf(theirs)}), std::vector<ErrorCode>{ErrorCode::OK});
  // A body longer than any release can be: a malformed header, the connection is closed.
  RequestHeader huge;
  huge.opcode = Opcode::kStageRelease;
  huge.length = transfer::kMaxStageReleaseBody + 16;
  ASSERT_TRUE(a.SendHeader(huge));
  EXPECT_TRUE(a.ClosedByPeer());
  // STAGE_INFO carries no body.
  RequestHeader info;
  info.opcode = Opcode::kStageInfo;
  info.length = 8;
  ASSERT_TRUE(b.SendHeader(info));
  EXPECT_TRUE(b.ClosedByPeer());
}

TEST_F(DiskStageTest, ACorruptedRecordIsStillAMissAndHoldsNoSlot) {
  OpenStore(disk::DiskBackend::kFilePerKey);
  WriteObjects({5000, 70000, 3000});
  StartServer(4 << 20);
  const auto at = disk::testing::FindValue(dir_.path(), objects_[1].value);
  ASSERT_TRUE(at) << "obj/1's value is not on disk";
  disk::testing::FlipByte(*at, 100);
  RawConn a(server_->port());
  auto got = Stage(a, {0, 1, 2});
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ((*got)[0].code, ErrorCode::OK);
  EXPECT_EQ((*got)[1].code, ErrorCode::CHECKSUM_MISMATCH);
  EXPECT_EQ((*got)[2].code, ErrorCode::OK);
  EXPECT_TRUE(WaitSlotsInUse(2)) << "the refused entry kept its slot";
  std::lock_guard lock(lost_mu_);
  EXPECT_EQ(lost_.count("obj/1"), 1u);
  EXPECT_FALSE(store_->Lookup("obj/1").has_value());
}

TEST_F(DiskStageTest, ANodeWithoutARegionRefusesStagingAndDiskReadStillWorks) {
  OpenStore();
  WriteObjects({1000});
  DiskReadService reads(store_.get(), {});
  DataServer server(segment_.data(), segment_.size(), 42, {});
  server.SetDiskReads(&reads);
  ASSERT_TRUE(server.Start().ok());
  const std::string endpoint = "127.0.0.1:" + std::to_string(server.port());
  EXPECT_EQ(tcp_.StageInfo(endpoint).status().code(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  RawConn a(server.port());
  std::vector<uint8_t> body = BodyFor({0});
  RequestHeader h;
  h.opcode = Opcode::kDiskStage;
  h.length = body.size();
  ASSERT_TRUE(a.SendHeader(h) && a.Send(body.data(), body.size()));
  auto rh = a.RecvResponse();
  ASSERT_TRUE(rh.has_value());
  EXPECT_EQ(ErrorCodeFromInt(rh->status), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  EXPECT_EQ(rh->length, 0u);
  std::vector<std::byte> buf(1000);
  std::vector<DiskReadItem> items = {{objects_[0].key, objects_[0].copy.location,
                                      objects_[0].copy.checksum, 1000, {std::span<std::byte>(buf)}}};
  EXPECT_TRUE(tcp_.ReadDisk(endpoint, items)[0].ok());
  EXPECT_EQ(buf, objects_[0].value);
  server.Stop();
}

}  // namespace
}  // namespace granary
