#include "master/state/disk_garbage.h"

namespace granary::master {

void DiskGarbage::Add(uint64_t disk_id, std::string_view key, uint64_t location) {
  if (by_place_.contains(Place{disk_id, key, location})) return;
  const uint64_t id = next_id_++;
  auto [it, inserted] = by_id_.emplace(id, GarbageEntry{id, disk_id, std::string(key), location});
  by_disk_.emplace(disk_id, id);
  by_place_.emplace(Place{disk_id, it->second.key, location}, id);
  key_bytes_ += key.size();
  // Oldest first: the copies most likely deleted already, or of a disk that never came back.
  while (!by_id_.empty() && (by_id_.size() > max_entries_ || key_bytes_ > max_key_bytes_)) {
    Erase(by_id_.begin());
    dropped_++;
  }
}

bool DiskGarbage::Contains(uint64_t disk_id, std::string_view key, uint64_t location) const {
  return by_place_.contains(Place{disk_id, key, location});
}

void DiskGarbage::ForgetPlace(uint64_t disk_id, std::string_view key, uint64_t location) {
  auto place = by_place_.find(Place{disk_id, key, location});
  if (place != by_place_.end()) Erase(by_id_.find(place->second));
}

bool DiskGarbage::Ack(uint64_t disk_id, uint64_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.disk_id != disk_id) return false;
  Erase(it);
  return true;
}

std::vector<GarbageEntry> DiskGarbage::Oldest(uint64_t disk_id, size_t max_entries,
                                              size_t max_key_bytes) const {
  std::vector<GarbageEntry> out;
  size_t bytes = 0;
  for (auto it = by_disk_.lower_bound({disk_id, 0});
       it != by_disk_.end() && it->first == disk_id && out.size() < max_entries; ++it) {
    const GarbageEntry& e = by_id_.at(it->second);
    if (!out.empty() && bytes + e.key.size() > max_key_bytes) break;
    bytes += e.key.size();
    out.push_back(e);
  }
  return out;
}

void DiskGarbage::Erase(std::map<uint64_t, GarbageEntry>::iterator it) {
  const GarbageEntry& e = it->second;
  by_place_.erase(Place{e.disk_id, e.key, e.location});  // before the key it views goes
  by_disk_.erase({e.disk_id, e.id});
  key_bytes_ -= e.key.size();
  by_id_.erase(it);
}

void DiskGarbage::Encode(Encoder& out) const {
  uint64_t next = next_id_, dropped = dropped_, n = by_id_.size();
  out(next);
  out(dropped);
  out(n);
  for (const auto& [id, entry] : by_id_) {
    GarbageEntry e = entry;  // the Encoder takes references
    out(e.id);
    out(e.disk_id);
    out(e.key);
    out(e.location);
  }
}

bool DiskGarbage::Decode(Decoder& in) {
  DiskGarbage loaded(max_entries_, max_key_bytes_);
  uint64_t n = 0;
  in(loaded.next_id_);
  in(loaded.dropped_);
  in(n);
  uint64_t last_id = 0;
  for (uint64_t i = 0; i < n && in.ok(); ++i) {
    GarbageEntry e;
    in(e.id);
    in(e.disk_id);
    in(e.key);
    in(e.location);
    if (!in.ok() || e.key.empty() || e.id <= last_id || e.id >= loaded.next_id_ ||
        loaded.Contains(e.disk_id, e.key, e.location)) {
      return false;
    }
    last_id = e.id;
    auto it = loaded.by_id_.emplace(e.id, std::move(e)).first;
    loaded.by_disk_.emplace(it->second.disk_id, it->first);
    loaded.by_place_.emplace(Place{it->second.disk_id, it->second.key, it->second.location},
                             it->first);
    loaded.key_bytes_ += it->second.key.size();
  }
  if (!in.ok()) return false;
  *this = std::move(loaded);
  return true;
}

}  // namespace granary::master
