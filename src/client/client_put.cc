// The put paths of ClientImpl (client/client_impl.h): into reserved space (one copy, one commit
// call), and the two-call put (PutStart, the copies, PutEnd) for the rest.
#include "client/client_impl.h"

#include <google/protobuf/arena.h>

namespace granary::client {

std::vector<Status> ClientImpl::PutCore(const std::vector<std::string>& keys,
                                        const std::vector<std::vector<ByteSpan>>& parts,
                                        const ReplicateConfig& config, bool upsert,
                                        DeviceMemory* device) {
  // Before and after (LocationCache): no answer of a get begun before the put is cached.
  Forget(keys);
  std::vector<Status> results = PutOnce(keys, parts, config, upsert, device);
  Forget(keys);
  return results;
}

std::vector<Status> ClientImpl::PutOnce(const std::vector<std::string>& keys,
                                        const std::vector<std::vector<ByteSpan>>& parts,
                                        const ReplicateConfig& config, bool upsert,
                                        DeviceMemory* device) {
  const size_t n = keys.size();
  if (parts.size() != n) return Fill(n, Mismatch("values"));
  if (n == 0) return {};
  if (static_cast<uint8_t>(config.persistence) > static_cast<uint8_t>(Persistence::kNone)) {
    return Fill(n, Status(ErrorCode::INVALID_PARAMS, "persistence is none of the enum's values"));
  }
  if (config.replica_num > 1 || !config.preferred_segments.empty()) {
    return PutStartEnd(keys, parts, config, upsert, device);
  }
  std::vector<size_t> rest;
  std::vector<Status> results = PutReserved(keys, parts, config, upsert, rest, device);
  if (rest.size() == n) return PutStartEnd(keys, parts, config, upsert, device);
  if (rest.empty()) return results;
  std::vector<std::string> rest_keys;
  std::vector<std::vector<ByteSpan>> rest_parts;
  for (size_t i : rest) {
    rest_keys.push_back(keys[i]);
    rest_parts.push_back(parts[i]);
  }
  std::vector<Status> settled = PutStartEnd(rest_keys, rest_parts, config, upsert, device);
  for (size_t k = 0; k < rest.size(); ++k) results[rest[k]] = std::move(settled[k]);
  return results;
}

std::vector<Status> ClientImpl::PutReserved(const std::vector<std::string>& keys,
                                            const std::vector<std::vector<ByteSpan>>& parts,
                                            const ReplicateConfig& config, bool upsert,
                                            std::vector<size_t>& rest, DeviceMemory* device) {
  using Held = client::ReservationPool::Held;
  const size_t n = keys.size();
  std::vector<Status> results(n);
  // All of a batch or none of it: split between a commit and a two-call put, it would reach the
  // master as two operations, and the prefix eviction policy reads a put batch's shape (its
  // last key, its length) from the operation (object_meta.h PrefixQueueStamp). A split made a
  // false tail and two shorter batches: 5% of the trace's hits with a disk tier. A batch longer
  // than one size's whole stock (kMaxPerSize) is not tried: of one size, it is never covered.
  std::optional<std::vector<Held>> all;
  if (n <= client::ReservationPool::kMaxPerSize) {
    std::vector<uint64_t> sizes(n);
    for (size_t i = 0; i < n; ++i) sizes[i] = TotalSize(parts[i]);
    all = reservations_.TakeAll(sizes);
  }
  if (!all) {
    rest.resize(n);
    for (size_t i = 0; i < n; ++i) rest[i] = i;
    return results;
  }
  std::vector<Held>& held = *all;  // held[i]: key i's reservation
  // Each write hashes into a state on its own stack (576 bytes, in cache), not one of n states
  // allocated per batch: 4.7 MB to fault in and reset for 8,192 keys.
  std::vector<uint64_t> checksums(n, 0);
  std::vector<Status> wrote(n);
  std::vector<char> late(n, 0);  // not written: past its hand-out time when its turn came
  auto write = [&](size_t i) {
    // The lease is checked before each copy, not once per batch: a long batch's last copies
    // would otherwise start into reservations near the end of their lease.
    if (client::ReservationPool::Clock::now() >= held[i].good_until) {
      late[i] = 1;
      return;
    }
    // The object may be up to 1/8 smaller than its reservation (ReservationPool::ClassOf): it
    // is written at the reservation's start, and the commit trims the rest.
    proto::Replica replica = held[i].replica;
    replica.set_length(TotalSize(parts[i]));
    ChecksumStream sum;
    wrote[i] = io_.Write(replica, parts[i], &sum, device);
    checksums[i] = sum.Digest();
  };
  if (n == 1) {
    write(0);  // no hand-off to a worker for the common single put
  } else {
    pool_.ParallelFor(n, write);
  }
  proto::BatchPutCommitRequest commit;
  commit.set_client_id(client_id_);
  commit.set_upsert(upsert);
  *commit.mutable_config() = ToProto(config);
  std::vector<size_t> committing;
  for (size_t i = 0; i < n; ++i) {
    if (late[i]) {  // never written: the pool releases it as stale
      reservations_.Return(std::move(held[i]));
      rest.push_back(i);
      continue;
    }
    // A failed write may still have bytes on their way: the reservation is left to expire (the
    // master quarantines it then) and the key goes the two-call way.
    if (!wrote[i].ok()) {
      rest.push_back(i);
      continue;
    }
    commit.add_keys(keys[i]);
    commit.add_reservations(held[i].name);
    commit.add_sizes(TotalSize(parts[i]));
    commit.add_checksums(checksums[i]);
    commit.add_segment_ids(held[i].replica.segment_id());
    commit.add_offsets(held[i].replica.offset());
    committing.push_back(i);
  }
  if (!committing.empty()) {
    proto::BatchStatusResponse resp;
    Status s = link_.PutCommit(commit, &resp);
    if (s.ok()) Settle(resp.settle_ms());
    // Unknown outcome: each key may be committed in its reservation, which must then never be
    // written again; so the reservations are dropped and the keys report the call's error.
    std::vector<Status> statuses = Statuses(s, resp, committing.size());
    for (size_t j = 0; j < committing.size(); ++j) {
      const size_t i = committing[j];
      const Status& st = statuses[j];
      if (st.ok()) {
        reserved_puts_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (!s.ok() || resp.results_size() != static_cast<int>(committing.size())) {
        results[i] = st;
        continue;
      }
      switch (st.code()) {
        case ErrorCode::INVALID_PARAMS:
          // A master older than the trim at commit refuses a smaller object, in these words.
          if (TotalSize(parts[i]) < held[i].replica.length() &&
              st.message().find("is not the reservation's") != std::string::npos) {
            // Refused before anything was written there: still ours, for an exact-size put.
            reservations_.ExactSizesOnly();
            reservations_.Return(std::move(held[i]));
          }
          [[fallthrough]];
        case ErrorCode::INVALID_WRITE:   // not held (any more): expired, or its segment went
        case ErrorCode::ILLEGAL_CLIENT:
        case ErrorCode::LEASE_EXPIRED:
          rest.push_back(i);
          break;
        default:  // refused for the key's own reason: the reservation is still ours, unused
          reservations_.Return(std::move(held[i]));
          results[i] = st.code() == ErrorCode::OBJECT_ALREADY_EXISTS && !upsert ? Status::Ok() : st;
      }
    }
  }
  std::sort(rest.begin(), rest.end());
  return results;
}

std::vector<Status> ClientImpl::PutStartEnd(const std::vector<std::string>& keys,
                                            const std::vector<std::vector<ByteSpan>>& parts,
                                            const ReplicateConfig& config, bool upsert,
                                            DeviceMemory* device) {
  const size_t n = keys.size();
  // A message per key each way: on an arena, freed at once with it (for 8,192 keys the answer's
  // parse and free were a quarter of a batch put's client time).
  google::protobuf::Arena arena;
  proto::BatchPutStartRequest& start =
      *google::protobuf::Arena::CreateMessage<proto::BatchPutStartRequest>(&arena);
  start.set_client_id(client_id_);
  start.set_upsert(upsert);
  *start.mutable_config() = ToProto(config);
  for (size_t i = 0; i < n; ++i) {
    start.add_keys(keys[i]);
    start.add_sizes(TotalSize(parts[i]));
  }
  proto::BatchPutStartResponse& started =
      *google::protobuf::Arena::CreateMessage<proto::BatchPutStartResponse>(&arena);
  Status s = link_.PutStart(start, &started);
  if (!s.ok()) return Fill(n, s);
  if (started.results_size() != static_cast<int>(n)) return Fill(n, Malformed());

  std::vector<Status> results(n);
  std::vector<size_t> writing;  // keys whose bytes this call writes
  std::vector<std::pair<size_t, int>> transfers;  // (key, replica)
  for (size_t i = 0; i < n; ++i) {
    const auto& r = started.results(static_cast<int>(i));
    if (r.code() == static_cast<int32_t>(ErrorCode::OBJECT_ALREADY_EXISTS) && !upsert) {
      continue;  // write-once: the stored value stays, and that is success
    }
    results[i] = rpc::FromCode(r.code(), r.message());
    if (!results[i].ok()) continue;
    writing.push_back(i);
    for (int j = 0; j < r.replicas_size(); ++j) transfers.emplace_back(i, j);
  }
  if (writing.empty()) return results;

  // The first replica of each key is written with its checksum computed on the way; a key with
  // no first transfer (cannot happen: start gave >= 1 replica) would keep checksum 0.
  // (A hash state on each write's stack: see PutReserved.)
  std::vector<uint64_t> checksums(n, 0);
  std::vector<Status> transfer_status(transfers.size());
  pool_.ParallelFor(transfers.size(), [&](size_t t) {
    auto [i, j] = transfers[t];
    const auto& replica = started.results(static_cast<int>(i)).replicas(j);
    if (j != 0) {
      transfer_status[t] = io_.Write(replica, parts[i], nullptr, device);
      return;
    }
    ChecksumStream sum;
    transfer_status[t] = io_.Write(replica, parts[i], &sum, device);
    checksums[i] = sum.Digest();
  });
  for (size_t t = 0; t < transfers.size(); ++t) {
    size_t i = transfers[t].first;
    if (!transfer_status[t].ok() && results[i].ok()) results[i] = transfer_status[t];
  }

  proto::BatchPutEndRequest end;
  proto::BatchPutRevokeRequest revoke;
  end.set_client_id(client_id_);
  revoke.set_client_id(client_id_);
  // Every revoke here follows a failed transfer: the master quarantines that space.
  revoke.set_after_transfer_error(true);
  std::vector<size_t> ended;
  for (size_t i : writing) {
    const uint64_t gen = started.results(static_cast<int>(i)).put_gen();
    if (results[i].ok()) {
      end.add_keys(keys[i]);
      end.add_checksums(checksums[i]);
      end.add_put_gens(gen);
      ended.push_back(i);
    } else {
      revoke.add_keys(keys[i]);
      revoke.add_put_gens(gen);
    }
  }
  if (revoke.keys_size() > 0) {
    proto::BatchStatusResponse ignored;  // on failure the master's discard timeout cleans up
    (void)link_.PutRevoke(revoke, &ignored);
  }
  if (!ended.empty()) {
    proto::BatchStatusResponse resp;
    Status e = link_.PutEnd(end, &resp);
    if (e.ok()) Settle(resp.settle_ms());
    std::vector<Status> statuses = Statuses(e, resp, ended.size());
    for (size_t k = 0; k < ended.size(); ++k) {
      // Another put of the key took this one over (this client again, or a writer after the
      // discard timeout): write-once, as "already exists" at the start.
      const bool taken_over = statuses[k].code() == ErrorCode::ILLEGAL_CLIENT && !upsert;
      results[ended[k]] = taken_over ? Status::Ok() : statuses[k];
    }
  }
  return results;
}

// Reads under the master's read leases. A lease lasts lease_ttl_ms from when the master granted
// it, which is after this call sent its request, so the deadline is counted from just before the
// request, less a safety margin. A copy that ends after the deadline may have read space the
// master has since freed and handed out again: its bytes are abandoned, never returned, even with
// a matching checksum. Such keys are tried once more under a fresh lease (same buffers: the
// destination callback is asked once per key); a second miss of the deadline is LEASE_EXPIRED.

}  // namespace granary::client
