// The read paths of ClientImpl (client/client_impl.h): replica lists, copies from memory replicas
// (this host's shared memory first), and disk replicas when no memory copy serves.
#include "client/client_impl.h"

#include <google/protobuf/arena.h>

namespace granary::client {
namespace {

using Destination = std::function<Result<std::vector<MutableByteSpan>>(size_t, uint64_t)>;

// Where key `i`'s `size` bytes go, as the caller's BufferProvider says: a provider that throws
// fails that key alone.
Result<std::vector<MutableByteSpan>> AskDestination(const Destination& destination, size_t i,
                                                    uint64_t size) {
  try {
    return destination(i, size);
  } catch (const std::exception& e) {
    return Status(ErrorCode::INTERNAL_ERROR, std::string("buffer provider failed: ") + e.what());
  } catch (...) {
    return Status(ErrorCode::INTERNAL_ERROR, "buffer provider failed");
  }
}

// The end of a lease of `ms` the master granted after `sent`, less a safety margin (a tenth,
// at least 100 ms or half of it); 0 ms: no end (a master that does not say).
std::chrono::steady_clock::time_point LeaseDeadline(std::chrono::steady_clock::time_point sent,
                                                    uint64_t ms) {
  const int64_t ttl = static_cast<int64_t>(std::min<uint64_t>(ms, uint64_t{1} << 40));
  if (ttl == 0) return std::chrono::steady_clock::time_point::max();
  const int64_t margin = std::max<int64_t>(ttl / 10, std::min<int64_t>(100, ttl / 2));
  return sent + std::chrono::milliseconds(ttl - margin);
}

}  // namespace

std::vector<Result<uint64_t>> ClientImpl::GetCore(
    const std::vector<std::string>& keys,
    const std::function<Result<std::vector<MutableByteSpan>>(size_t, uint64_t)>& destination,
    DeviceMemory* device) {
  using Clock = std::chrono::steady_clock;
  const size_t n = keys.size();
  if (n == 0) return {};
  std::vector<Result<uint64_t>> results(n, Result<uint64_t>(Status(ErrorCode::INTERNAL_ERROR, "")));
  std::vector<std::vector<MutableByteSpan>> dst(n);
  std::vector<uint64_t> dst_size(n, 0);
  std::vector<bool> has_dst(n, false);
  std::vector<size_t> todo(n);  // indices into keys still to read
  for (size_t i = 0; i < n; ++i) todo[i] = i;

  // Gets into device memory always ask the master: a failed device copy is then the key's
  // answer, where a cached read would retry it through the master and hide it.
  const bool caching = options_.location_cache_ms > 0 && options_.location_cache_entries > 0 &&
                       device == nullptr;
  if (caching) {
    GetCached(keys, destination, device, todo, results, dst, dst_size, has_dst);
    if (todo.empty()) return results;
  }

  constexpr int kAttempts = 2;
  for (int attempt = 0; attempt < kAttempts && !todo.empty(); ++attempt) {
    // A message per key each way: on an arena, freed at once with it (PutStartEnd says why).
    google::protobuf::Arena arena;
    proto::BatchGetReplicaListRequest& req =
        *google::protobuf::Arena::CreateMessage<proto::BatchGetReplicaListRequest>(&arena);
    req.set_client_id(client_id_);
    for (size_t i : todo) req.add_keys(keys[i]);
    std::vector<uint64_t> stamps;  // LocationCache: a put of ours since keeps the answer out
    if (caching) {
      req.set_cache_ms(static_cast<uint64_t>(options_.location_cache_ms));
      stamps.reserve(todo.size());
      for (size_t i : todo) stamps.push_back(cache_.Stamp(keys[i]));
    }
    proto::BatchGetReplicaListResponse& replicas =
        *google::protobuf::Arena::CreateMessage<proto::BatchGetReplicaListResponse>(&arena);
    const Clock::time_point sent = Clock::now();
    Status s = link_.GetReplicaList(req, &replicas);
    if (!s.ok() || replicas.results_size() != static_cast<int>(todo.size())) {
      for (size_t i : todo) results[i] = s.ok() ? Status(Malformed()) : s;
      break;
    }
    // 0 (a master that does not say) leaves the reads unbounded, as before leases were known.
    const Clock::time_point deadline = LeaseDeadline(sent, replicas.lease_ttl_ms());

    std::vector<size_t> reading;      // positions in todo
    std::vector<std::string> locked;  // released in the background once read (ReadReleaser)
    for (size_t k = 0; k < todo.size(); ++k) {
      const size_t i = todo[k];
      const auto& r = replicas.results(static_cast<int>(k));
      if (r.code() != 0) {
        results[i] = rpc::FromCode(r.code(), r.message());
        continue;
      }
      locked.push_back(keys[i]);  // locked: must be released whatever happens next
      if (has_dst[i]) {  // a retry: the buffers were sized for the first attempt's object
        if (r.size() != dst_size[i]) {
          results[i] = Status(ErrorCode::LEASE_EXPIRED,
                              "read lease of '" + keys[i] + "' expired mid-copy and the object " +
                                  "changed size before the retry");
          continue;
        }
        reading.push_back(k);
        continue;
      }
      // A provider that fails fails that key; the locks are still released.
      Result<std::vector<MutableByteSpan>> d = AskDestination(destination, i, r.size());
      if (!d.ok()) {
        results[i] = d.status();
        continue;
      }
      dst[i] = std::move(*d);
      dst_size[i] = r.size();
      has_dst[i] = true;
      reading.push_back(k);
    }

    std::vector<char> late(todo.size(), 0);
    if (device != nullptr) {
      ReadMemoryToDevice(replicas, todo, reading, dst, deadline, *device, results, late);
    } else {
      pool_.ParallelFor(reading.size(), [&](size_t x) {
        const size_t k = reading[x];
        ReadKey(replicas.results(static_cast<int>(k)), dst[todo[k]], deadline, nullptr,
                results[todo[k]], late[k]);
      });
    }
    if (caching && replicas.cache_lease_ms() > 0) {
      // The cache lease counted as the read lease is, from before the request, less its margin.
      const Clock::time_point cached_until = LeaseDeadline(sent, replicas.cache_lease_ms());
      for (size_t k : reading) {
        const size_t i = todo[k];
        const auto& r = replicas.results(static_cast<int>(k));
        if (!late[k] && results[i].ok() && r.replicas_size() > 0) {
          cache_.Insert(keys[i], stamps[k], r, cached_until);
        }
      }
    }
    // Whatever memory did not give (no memory replica, or every one failed) comes from disk.
    std::vector<size_t> from_disk;  // positions in todo
    for (size_t k : reading) {
      const size_t i = todo[k];
      if (!late[k] && !results[i].ok() &&
          replicas.results(static_cast<int>(k)).disk_replicas_size() > 0) {
        from_disk.push_back(k);
      }
    }
    if (!from_disk.empty()) {
      if (device != nullptr) {
        LoadFromDiskToDevice(keys, replicas, todo, from_disk, dst, results, *device);
      } else {
        LoadFromDisk(keys, replicas, todo, from_disk, dst, results);
      }
    }
    releaser_.Add(std::move(locked));

    std::vector<size_t> retry;
    for (size_t k = 0; k < todo.size(); ++k) {
      if (!late[k]) continue;
      const size_t i = todo[k];
      results[i] = Status(ErrorCode::LEASE_EXPIRED,
                          "read lease of '" + keys[i] + "' (" +
                              std::to_string(replicas.lease_ttl_ms()) +
                              " ms) expired before its copy finished; the bytes were discarded");
      retry.push_back(i);
    }
    todo = std::move(retry);
  }
  return results;
}

void ClientImpl::ReadMemoryToDevice(const proto::BatchGetReplicaListResponse& replicas,
                                    const std::vector<size_t>& todo,
                                    const std::vector<size_t>& reading,
                                    std::vector<std::vector<MutableByteSpan>>& dst,
                                    std::chrono::steady_clock::time_point deadline,
                                    DeviceMemory& device, std::vector<Result<uint64_t>>& results,
                                    std::vector<char>& late) {
  using Clock = std::chrono::steady_clock;
  const size_t shares = std::min(reading.size(), pool_.threads() + 1);
  pool_.ParallelFor(shares, [&](size_t w) {
    struct Started {
      size_t x;     // position in reading
      int replica;  // which of the key's replicas
      ReplicaIo::DeviceRead read;
    };
    std::vector<Started> started;
    std::vector<size_t> one_by_one;  // positions in reading
    for (size_t x = reading.size() * w / shares; x < reading.size() * (w + 1) / shares; ++x) {
      const auto& r = replicas.results(static_cast<int>(reading[x]));
      std::optional<ReplicaIo::DeviceRead> read;
      int j = 0;
      if (Clock::now() < deadline) {
        for (; j < r.replicas_size() && !read; ++j) {
          read = io_.StartDeviceRead(r.replicas(j), dst[todo[reading[x]]], device);
        }
      }
      if (read) {
        started.push_back({x, j - 1, std::move(*read)});
      } else {
        one_by_one.push_back(x);
      }
    }
    const Status waited = started.empty() ? Status::Ok() : device.Wait();
    const bool over = Clock::now() >= deadline;  // the copies ran past the lease: abandoned
    for (const Started& s : started) {
      const size_t k = reading[s.x];
      const auto& r = replicas.results(static_cast<int>(k));
      if (over) {
        late[k] = 1;
        continue;
      }
      auto got = io_.FinishDeviceRead(s.read, r.replicas(s.replica), waited);
      if (got.ok() && *got == r.checksum()) {
        results[todo[k]] = r.size();
      } else {
        one_by_one.push_back(s.x);  // every replica again, with the reason it reports
      }
    }
    for (size_t x : one_by_one) {
      const size_t k = reading[x];
      ReadKey(replicas.results(static_cast<int>(k)), dst[todo[k]], deadline, &device,
              results[todo[k]], late[k]);
    }
  });
}

void ClientImpl::ReadKey(const proto::GetReplicaResult& r, std::vector<MutableByteSpan>& dst,
                         std::chrono::steady_clock::time_point deadline, DeviceMemory* device,
                         Result<uint64_t>& result, char& late) {
  if (r.replicas_size() == 0) {
    result = Status(ErrorCode::OBJECT_NOT_FOUND, "no memory replica");
    return;  // on disk only: LoadFromDisk
  }
  bool was_late = false;
  Status got = ReadMemory(r, dst, deadline, device, &was_late);
  if (was_late) {
    late = 1;
  } else if (got.ok()) {
    result = r.size();
  } else {
    result = got;
  }
}

Status ClientImpl::ReadMemory(const proto::GetReplicaResult& r, std::vector<MutableByteSpan>& dst,
                              std::chrono::steady_clock::time_point deadline,
                              DeviceMemory* device, bool* late) {
  using Clock = std::chrono::steady_clock;
  *late = false;
  // Local replicas first: a memcpy beats any socket.
  std::vector<int> order(r.replicas_size());
  for (int j = 0; j < r.replicas_size(); ++j) order[j] = j;
  if (order.size() > 1) {
    std::stable_partition(order.begin(), order.end(),
                          [&](int j) { return io_.IsLocal(r.replicas(j)); });
  }
  Status last(ErrorCode::OBJECT_NOT_FOUND, "no replica");
  for (int j : order) {
    if (Clock::now() >= deadline) {
      *late = true;
      return last;
    }
    auto got = io_.Read(r.replicas(j), dst, device);
    if (Clock::now() >= deadline) {  // whatever was read, the lease no longer covered it
      *late = true;
      return last;
    }
    if (!got.ok()) {
      last = got.status();
      continue;
    }
    if (*got != r.checksum()) {
      last = Status(ErrorCode::CHECKSUM_MISMATCH,
                    "replica on " + r.replicas(j).segment_name() + " failed its checksum");
      continue;
    }
    return Status::Ok();
  }
  return last;
}

void ClientImpl::GetCached(
    const std::vector<std::string>& keys,
    const std::function<Result<std::vector<MutableByteSpan>>(size_t, uint64_t)>& destination,
    DeviceMemory* device, std::vector<size_t>& todo, std::vector<Result<uint64_t>>& results,
    std::vector<std::vector<MutableByteSpan>>& dst, std::vector<uint64_t>& dst_size,
    std::vector<bool>& has_dst) {
  const auto now = std::chrono::steady_clock::now();
  // All of a batch or none of it: the destinations are asked in key order before any byte
  // moves (BufferProvider), and a key's size is known only from its entry or the master.
  std::vector<std::shared_ptr<const LocationCache::Entry>> entries;
  entries.reserve(todo.size());
  for (size_t i : todo) {
    entries.push_back(cache_.Lookup(keys[i], now));
    if (!entries.back()) return;
  }
  std::vector<std::shared_ptr<const LocationCache::Entry>> hits;
  std::vector<size_t> hit_keys, rest;
  for (size_t k = 0; k < todo.size(); ++k) {
    const size_t i = todo[k];
    auto& entry = entries[k];
    Result<std::vector<MutableByteSpan>> d = AskDestination(destination, i, entry->where.size());
    if (!d.ok()) {
      results[i] = d.status();  // the caller's answer; the master would not change it
      continue;
    }
    dst[i] = std::move(*d);
    dst_size[i] = entry->where.size();
    has_dst[i] = true;
    hits.push_back(std::move(entry));
    hit_keys.push_back(i);
  }
  std::vector<char> served(hits.size(), 0);
  auto read = [&](size_t x) {
    const size_t i = hit_keys[x];
    bool late = false;
    Status got = ReadMemory(hits[x]->where, dst[i], hits[x]->deadline, device, &late);
    if (got.ok() && !late) {
      results[i] = hits[x]->where.size();
      served[x] = 1;
    }
  };
  if (hits.size() == 1) {
    read(0);  // no hand-off to a worker for the common single get
  } else {
    pool_.ParallelFor(hits.size(), read);
  }
  for (size_t x = 0; x < hits.size(); ++x) {
    if (served[x]) continue;
    // Whatever failed (the lease ran out, the node restarted or died, the bytes were not the
    // object's), the master says where the key is now: other replicas, a disk copy, or none.
    cache_.Invalidate(keys[hit_keys[x]]);
    rest.push_back(hit_keys[x]);
  }
  cached_gets_.fetch_add(hits.size() - std::count(served.begin(), served.end(), 0),
                         std::memory_order_relaxed);
  std::sort(rest.begin(), rest.end());
  todo = std::move(rest);
}

// Disk loads: one DISK_READ batch per node, the nodes in parallel; a key whose copy fails on
// one node tries its next disk replica in the following pass. The master's read lock guards
// memory only; a disk copy is guarded by the node (it serves exactly the copy named, or nothing).
void ClientImpl::LoadFromDiskToDevice(const std::vector<std::string>& names,
                                      const proto::BatchGetReplicaListResponse& replicas,
                                      const std::vector<size_t>& todo,
                                      const std::vector<size_t>& keys,
                                      std::vector<std::vector<MutableByteSpan>>& dst,
                                      std::vector<Result<uint64_t>>& results,
                                      DeviceMemory& device) {
  std::vector<std::vector<MutableByteSpan>> host = dst;
  std::deque<std::vector<std::byte>> bounce;
  for (size_t k : keys) {
    for (auto& part : host[todo[k]]) {
      if (!part.empty() && device.Holds(part.data(), part.size())) {
        part = MutableByteSpan(bounce.emplace_back(part.size()).data(), part.size());
      }
    }
  }
  LoadFromDisk(names, replicas, todo, keys, host, results);
  for (size_t k : keys) {
    const size_t i = todo[k];
    if (!results[i].ok()) continue;
    Status copied;
    for (size_t j = 0; j < dst[i].size() && copied.ok(); ++j) {
      if (host[i][j].data() != dst[i][j].data()) {
        copied = device.CopyIn(dst[i][j].data(), host[i][j].data(), host[i][j].size());
      }
    }
    Status waited = device.Wait();
    if (!copied.ok() || !waited.ok()) results[i] = !copied.ok() ? copied : waited;
  }
}

void ClientImpl::LoadFromDisk(const std::vector<std::string>& names,
                              const proto::BatchGetReplicaListResponse& replicas,
                              const std::vector<size_t>& todo, std::vector<size_t> keys,
                              std::vector<std::vector<MutableByteSpan>>& dst,
                              std::vector<Result<uint64_t>>& results) {
  std::vector<int> next_replica(keys.size(), 0);
  std::vector<int> busy(keys.size(), 0);  // times the node's staging memory was busy
  for (int pass = 0; pass < 8 && !keys.empty(); ++pass) {
    std::map<std::string, std::vector<size_t>> by_node;  // endpoint -> positions in keys
    std::map<std::string, std::string> node_of;          // endpoint -> node id
    for (size_t x = 0; x < keys.size(); ++x) {
      const auto& r = replicas.results(static_cast<int>(keys[x]));
      while (next_replica[x] < r.disk_replicas_size() &&
             r.disk_replicas(next_replica[x]).endpoint().empty()) {
        ++next_replica[x];
      }
      if (next_replica[x] < r.disk_replicas_size()) {
        const auto& d = r.disk_replicas(next_replica[x]);
        by_node[d.endpoint()].push_back(x);
        node_of.emplace(d.endpoint(), d.node_id());
      }
    }
    if (by_node.empty()) break;
    std::vector<std::pair<std::string, std::vector<size_t>>> nodes(by_node.begin(), by_node.end());
    pool_.ParallelFor(nodes.size(), [&](size_t g) {
      const auto& [endpoint, members] = nodes[g];
      // A node on this host stages into shared memory (the same host test as memory replicas).
      const bool same_host =
          options_.use_shared_memory && directory_.NodeIsLocal(node_of.at(endpoint));
      std::vector<transfer::DiskReadItem> items;
      items.reserve(members.size());
      for (size_t x : members) {
        const size_t k = keys[x];
        const auto& r = replicas.results(static_cast<int>(k));
        const auto& d = r.disk_replicas(next_replica[x]);
        items.push_back({d.stored_key().empty() ? names[todo[k]] : d.stored_key(), d.location(),
                         r.checksum(), r.size(),
                         {dst[todo[k]].begin(), dst[todo[k]].end()}});
      }
      std::vector<Status> got = io_.ReadDisk(endpoint, items, same_host);
      for (size_t m = 0; m < members.size(); ++m) {
        const size_t i = todo[keys[members[m]]];
        if (got[m].ok()) {
          results[i] = replicas.results(static_cast<int>(keys[members[m]])).size();
        } else {
          results[i] = got[m];
        }
      }
    });
    std::vector<size_t> again;
    std::vector<int> again_next, again_busy;
    bool wait = false;
    for (size_t x = 0; x < keys.size(); ++x) {
      const Result<uint64_t>& r = results[todo[keys[x]]];
      if (r.ok()) continue;
      // A busy node (staging budget) is asked again a little later, twice; anything else moves
      // on to the next disk replica.
      const bool retry_here = r.status().code() == ErrorCode::NO_AVAILABLE_HANDLE && busy[x] < 2;
      wait |= retry_here;
      again.push_back(keys[x]);
      again_next.push_back(next_replica[x] + (retry_here ? 0 : 1));
      again_busy.push_back(busy[x] + (retry_here ? 1 : 0));
    }
    keys = std::move(again);
    next_replica = std::move(again_next);
    busy = std::move(again_busy);
    if (wait) std::this_thread::sleep_for(std::chrono::milliseconds(50 << std::min(pass, 3)));
  }
}

}  // namespace granary::client
