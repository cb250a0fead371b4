// master/state/disk_garbage.h - disk copies the master stopped naming that their disk must delete.
//
// A copy on a node's disk is named by (disk id, key, location). When a record lets one go for any
// reason but the node's own DiskDrop (a remove, an upsert's commit, a refused registration or
// offload), it becomes garbage here until the node says it deleted it (by the entry's id).
// Promise:
//   - Add records a copy at most once, under a new id. Ids only grow, so an acknowledgement of an
//     old entry can never remove a later entry for the same place (a reused location).
//   - Bounded: beyond `max_entries` entries or `max_key_bytes` of keys the oldest entries are
//     dropped and counted (dropped()). That only leaks disk space: MasterState refuses to
//     register a copy of a key it does not hold from a disk it knows, garbage or not.
//   - Deterministic: it is part of the master's state (snapshot, digest); everything is ordered
//     by id, disk or key, never by a hash map.
// Thread safety: none; MasterState guards it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "master/codec/binary_codec.h"

namespace granary::master {

struct GarbageEntry {
  uint64_t id = 0;
  uint64_t disk_id = 0;
  std::string key;
  uint64_t location = 0;
};

class DiskGarbage {
 public:
  DiskGarbage(uint64_t max_entries, uint64_t max_key_bytes)
      : max_entries_(max_entries), max_key_bytes_(max_key_bytes) {}
  DiskGarbage(const DiskGarbage&) = delete;
  DiskGarbage& operator=(const DiskGarbage&) = delete;
  // Moving keeps the map nodes, so the views into them stay valid.
  DiskGarbage(DiskGarbage&&) = default;
  DiskGarbage& operator=(DiskGarbage&&) = default;

  void Add(uint64_t disk_id, std::string_view key, uint64_t location);
  bool Contains(uint64_t disk_id, std::string_view key, uint64_t location) const;
  // Forgets the entry for this place, if any (a new copy was written there: the old one is gone).
  void ForgetPlace(uint64_t disk_id, std::string_view key, uint64_t location);
  // The disk deleted entry `id`; false if it is not one of that disk's entries.
  bool Ack(uint64_t disk_id, uint64_t id);
  // The disk's oldest entries: at most `max_entries`, and keys of about `max_key_bytes` at most
  // (always at least one entry if the disk has any).
  std::vector<GarbageEntry> Oldest(uint64_t disk_id, size_t max_entries,
                                   size_t max_key_bytes) const;

  size_t size() const { return by_id_.size(); }
  uint64_t dropped() const { return dropped_; }

  void Encode(Encoder& out) const;
  // False for malformed bytes (duplicate places, ids out of order, empty keys); `this` unchanged.
  bool Decode(Decoder& in);

 private:
  using Place = std::tuple<uint64_t, std::string_view, uint64_t>;  // disk, key, location
  void Erase(std::map<uint64_t, GarbageEntry>::iterator it);

  uint64_t max_entries_;
  uint64_t max_key_bytes_;
  std::map<uint64_t, GarbageEntry> by_id_;         // oldest first
  std::set<std::pair<uint64_t, uint64_t>> by_disk_;  // (disk, id)
  std::map<Place, uint64_t> by_place_;              // key views into by_id_'s entries -> id
  uint64_t next_id_ = 1;
  uint64_t key_bytes_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace granary::master
