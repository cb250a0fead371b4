// The TCP transport's disk requests: DISK_READ and DISK_STAGE rounds, and STAGE_INFO
// (transfer/tcp_transport.h). The connection pool and the request loop are in tcp_transport.cc.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "transfer/tcp_transport.h"
#include "transfer/tcp_transport_internal.h"

namespace granary::transfer {

using namespace tcp_internal;

namespace {

// The body of one DISK_READ for items[0, n).
std::vector<uint8_t> DiskReadBodyOf(std::span<const DiskReadItem> items) {
  size_t bytes = sizeof(DiskReadBody);
  for (const auto& item : items) bytes += sizeof(DiskReadEntry) + item.key.size();
  std::vector<uint8_t> body(bytes);
  DiskReadBody head;
  head.count = static_cast<uint32_t>(items.size());
  std::memcpy(body.data(), &head, sizeof(head));
  size_t at = sizeof(head);
  for (const auto& item : items) {
    DiskReadEntry e;
    e.location = item.location;
    e.checksum = item.checksum;
    e.size = item.size;
    e.key_len = static_cast<uint32_t>(item.key.size());
    std::memcpy(body.data() + at, &e, sizeof(e));
    at += sizeof(e);
    std::memcpy(body.data() + at, item.key.data(), item.key.size());
    at += item.key.size();
  }
  return body;
}

}  // namespace

bool TcpTransport::DiskReadRound(Endpoint& ep, Conn& conn, std::span<DiskReadItem> items,
                                 std::vector<Status>& out, bool* answered,
                                 const StagedCopy* copy) {
  const int timeout = options_.io_timeout_ms;
  const Opcode op = copy != nullptr ? Opcode::kDiskStage : Opcode::kDiskRead;
  auto broken = [&](size_t from, int err, const std::string& what) {
    for (size_t i = from; i < items.size(); ++i) {
      out[i] = Status(ErrorCode::TRANSFER_FAIL,
                      std::string(OpName(op)) + " at " + ep.name + ": " + what + ErrnoText(err));
    }
    return false;
  };
  std::vector<SlotRef> staged;  // released once every entry is answered
  std::vector<uint8_t> body = DiskReadBodyOf(items);
  RequestHeader req;
  req.opcode = op;
  req.request_id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
  req.length = body.size();
  iovec iov[2] = {{&req, sizeof(req)}, {body.data(), body.size()}};
  if (int err = SendFully(conn.fd, iov, 2, timeout); err != 0) {
    if (err != kEof && err != ECONNRESET && err != EPIPE) *answered = true;
    return broken(0, err, "send failed: ");
  }
  ResponseHeader head;
  if (int err = RecvFully(conn.fd, &head, sizeof(head), timeout); err != 0) {
    // Only a connection the node had closed is worth a second try; a silent node is not.
    if (err != kEof && err != ECONNRESET && err != EPIPE) *answered = true;
    return broken(0, err, "no response: ");
  }
  *answered = true;
  if (head.magic != kResponseMagic || head.request_id != req.request_id) {
    return broken(0, kEof, "malformed response (magic or request id); ");
  }
  if (head.status != 0) {
    for (auto& st : out) {
      st = Status(ErrorCodeFromInt(head.status),
                  "node " + ep.name + " refused a DISK_READ of " + std::to_string(items.size()) +
                      " objects: " + std::string(ErrorCodeName(ErrorCodeFromInt(head.status))));
    }
    return head.length == 0;
  }
  if (head.length != items.size()) {
    return broken(0, kEof, "malformed response (entry count); ");
  }
  for (size_t i = 0; i < items.size(); ++i) {
    ResponseHeader eh;
    if (int err = RecvFully(conn.fd, &eh, sizeof(eh), timeout); err != 0) {
      return broken(i, err, "connection lost: ");
    }
    if (eh.magic != kResponseMagic || eh.request_id != i) {
      return broken(i, kEof, "malformed entry response; ");
    }
    if (eh.status != 0) {
      if (eh.length != 0) return broken(i, kEof, "an entry's error with a payload; ");
      const ErrorCode code = ErrorCodeFromInt(eh.status);
      out[i] = Status(code, "node " + ep.name + " has no intact disk copy of the object: " +
                                std::string(ErrorCodeName(code)));
      continue;
    }
    if (copy != nullptr) {
      StagedSlot slot;
      if (eh.length != sizeof(slot)) return broken(i, kEof, "a staged entry of another size; ");
      if (int err = RecvFully(conn.fd, &slot, sizeof(slot), timeout); err != 0) {
        return broken(i, err, "connection lost: ");
      }
      staged.push_back({slot.slot, 0, slot.generation});
      // Copied now, while the node reads the next window: copies and disk overlap.
      out[i] = slot.length == items[i].size
                   ? (*copy)(i, slot)
                   : Status(ErrorCode::TRANSFER_FAIL, "a staged entry of another length");
      continue;
    }
    if (eh.length != items[i].size) {
      return broken(i, kEof, "an entry of " + std::to_string(eh.length) + " bytes, expected " +
                                 std::to_string(items[i].size) + "; ");
    }
    for (auto part : items[i].dst) {
      if (int err = RecvFully(conn.fd, part.data(), part.size(), timeout); err != 0) {
        return broken(i, err, "connection lost mid-object: ");
      }
    }
    out[i] = Status::Ok();
  }
  // Every slot back in one STAGE_RELEASE (a request has at most kMaxDiskReadEntries entries,
  // the release limit too). The copies stand whatever happens here: each checked its slot's
  // generation. A failed release closes the connection, which releases them on the node.
  static_assert(kMaxDiskReadEntries <= kMaxStageRelease);
  if (!staged.empty()) {
    StageReleaseBody rb;
    rb.count = static_cast<uint32_t>(staged.size());
    RequestHeader rel;
    rel.opcode = Opcode::kStageRelease;
    rel.request_id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
    rel.length = sizeof(rb) + staged.size() * sizeof(SlotRef);
    iovec riov[3] = {{&rel, sizeof(rel)}, {&rb, sizeof(rb)},
                     {staged.data(), staged.size() * sizeof(SlotRef)}};
    if (SendFully(conn.fd, riov, 3, timeout) != 0) return false;
    ResponseHeader rh;
    if (RecvFully(conn.fd, &rh, sizeof(rh), timeout) != 0) return false;
    if (rh.magic != kResponseMagic || rh.request_id != rel.request_id || rh.status != 0 ||
        rh.length != staged.size() * sizeof(int32_t)) {
      return false;
    }
    std::vector<int32_t> codes(staged.size());
    if (RecvFully(conn.fd, codes.data(), rh.length, timeout) != 0) return false;
  }
  return true;
}

std::vector<Status> TcpTransport::ReadDisk(const std::string& endpoint,
                                           std::span<DiskReadItem> items) {
  return ReadDiskRounds(endpoint, items, UINT64_MAX, nullptr);
}

std::vector<Status> TcpTransport::ReadDiskStaged(const std::string& endpoint,
                                                 std::span<DiskReadItem> items,
                                                 uint64_t max_request_bytes,
                                                 const StagedCopy& copy) {
  return ReadDiskRounds(endpoint, items, max_request_bytes, &copy);
}

std::vector<Status> TcpTransport::ReadDiskRounds(const std::string& endpoint,
                                                 std::span<DiskReadItem> items,
                                                 uint64_t max_request_bytes,
                                                 const StagedCopy* copy) {
  std::vector<Status> out(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    uint64_t total = 0;
    for (const auto& part : items[i].dst) total += part.size();
    if (total != items[i].size || items[i].key.empty() ||
        items[i].key.size() > kMaxDiskReadKey || items[i].location == 0 ||
        items[i].size > kMaxDiskReadObject) {
      // Checked here, one item at a time: the node refuses a whole body for one bad entry.
      out[i] = Status(ErrorCode::INVALID_PARAMS,
                      "disk read of '" + items[i].key.substr(0, 64) +
                          "': empty or oversized key, no location, an object over " +
                          std::to_string(kMaxDiskReadObject) + " bytes, or buffers of another size");
    }
  }
  auto ep = GetEndpoint(endpoint);
  if (!ep.ok()) {
    for (auto& st : out) {
      if (st.ok()) st = ep.status();
    }
    return out;
  }
  // The valid items, cut into requests within the protocol's limits.
  std::vector<size_t> valid;
  for (size_t i = 0; i < items.size(); ++i) {
    if (out[i].ok()) valid.push_back(i);
  }
  std::vector<DiskReadItem> round;
  std::vector<size_t> round_index;
  auto run = [&]() {
    if (round.empty()) return;
    std::vector<Status> got(round.size());
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto conn = Checkout(**ep, /*probe_all=*/attempt > 0);
      if (!conn.ok()) {
        std::fill(got.begin(), got.end(), conn.status());
        break;
      }
      bool answered = false;
      // The caller's copy is told the item's index in `items`, not in the round.
      StagedCopy round_copy = [&](size_t k, const StagedSlot& slot) {
        return (*copy)(round_index[k], slot);
      };
      if (DiskReadRound(**ep, *conn, round, got, &answered,
                        copy != nullptr ? &round_copy : nullptr)) {
        Return(**ep, *conn);
        break;
      }
      close(conn->fd);
      // A pooled connection the node had closed (restart, idle timeout): once more on a new one.
      if (answered || !conn->from_pool) break;
    }
    for (size_t k = 0; k < round.size(); ++k) out[round_index[k]] = std::move(got[k]);
    round.clear();
    round_index.clear();
  };
  uint64_t body = sizeof(DiskReadBody);
  uint64_t staging = 0;  // what the round makes the node stage, roughly (its block padding)
  for (size_t i : valid) {
    const uint64_t entry = sizeof(DiskReadEntry) + items[i].key.size();
    const uint64_t stage = items[i].size + 8192;
    if (round.size() == kMaxDiskReadEntries || body + entry > kMaxDiskReadBody ||
        (!round.empty() && staging + stage > max_request_bytes)) {
      run();
      body = sizeof(DiskReadBody);
      staging = 0;
    }
    round.push_back(items[i]);  // spans and a key copy: cheap next to the disk read
    round_index.push_back(i);
    body += entry;
    staging += stage;
  }
  run();
  return out;
}

Result<StageRegionInfo> TcpTransport::StageInfo(const std::string& endpoint) {
  auto ep = GetEndpoint(endpoint);
  if (!ep.ok()) return ep.status();
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto conn = Checkout(**ep, /*probe_all=*/attempt > 0);
    if (!conn.ok()) return conn.status();
    const int timeout = options_.io_timeout_ms;
    RequestHeader req;
    req.opcode = Opcode::kStageInfo;
    req.request_id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
    iovec iov{&req, sizeof(req)};
    ResponseHeader rh;
    int err = SendFully(conn->fd, &iov, 1, timeout);
    if (err == 0) err = RecvFully(conn->fd, &rh, sizeof(rh), timeout);
    if (err != 0) {
      close(conn->fd);
      if (conn->from_pool && (err == kEof || err == ECONNRESET || err == EPIPE)) continue;
      return Status(ErrorCode::TRANSFER_FAIL, "STAGE_INFO at " + ep.value()->name + ": " +
                                                  ErrnoText(err));
    }
    constexpr uint64_t kMaxInfo = sizeof(transfer::StageInfo) + 256;
    if (rh.magic != kResponseMagic || rh.request_id != req.request_id ||
        (rh.status != 0 && rh.length != 0) ||
        (rh.status == 0 && (rh.length < sizeof(transfer::StageInfo) || rh.length > kMaxInfo))) {
      close(conn->fd);
      return Status(ErrorCode::TRANSFER_FAIL, "STAGE_INFO at " + ep.value()->name +
                                                  ": malformed response");
    }
    if (rh.status != 0) {
      Return(**ep, *conn);
      const ErrorCode code = ErrorCodeFromInt(rh.status);
      return Status(code, "node " + ep.value()->name + " has no staging region: " +
                              std::string(ErrorCodeName(code)));
    }
    std::vector<uint8_t> payload(rh.length);
    if (int e = RecvFully(conn->fd, payload.data(), payload.size(), timeout); e != 0) {
      close(conn->fd);
      return Status(ErrorCode::TRANSFER_FAIL, "STAGE_INFO at " + ep.value()->name + ": " +
                                                  ErrnoText(e));
    }
    Return(**ep, *conn);
    transfer::StageInfo info;
    std::memcpy(&info, payload.data(), sizeof(info));
    if (info.name_len != payload.size() - sizeof(info)) {
      return Status(ErrorCode::TRANSFER_FAIL, "STAGE_INFO at " + ep.value()->name +
                                                  ": malformed name");
    }
    StageRegionInfo out;
    out.name.assign(reinterpret_cast<const char*>(payload.data() + sizeof(info)), info.name_len);
    out.token = info.region_token;
    out.data_bytes = info.data_bytes;
    out.slot_count = info.slot_count;
    return out;
  }
  return Status(ErrorCode::TRANSFER_FAIL, "STAGE_INFO at " + endpoint + ": connection lost");
}

}  // namespace granary::transfer
