#include "disk/record_format.h"

#ifndef XXH_STATIC_LINKING_ONLY
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#endif
#include <xxhash.h>

#include <bit>
#include <cstring>

#include "disk/disk_io.h"

namespace granary::disk {

static_assert(std::endian::native == std::endian::little,
              "the on-disk formats are little-endian and written with memcpy");

namespace {

template <typename T>
void Put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

template <typename T>
T Get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

uint64_t Hash(const void* p, size_t n, uint64_t salt) { return XXH3_64bits_withSeed(p, n, salt); }

}  // namespace

uint64_t RecordPrefixBytes(uint32_t key_len) { return AlignUp(kRecordHeaderBytes + key_len); }

std::string EncodeRecordPrefix(const RecordHeader& h, std::string_view key, uint64_t salt) {
  std::string out;
  out.reserve(kRecordHeaderBytes + key.size());
  Put<uint32_t>(out, static_cast<uint32_t>(key.size()));
  Put<uint32_t>(out, h.value_len);
  Put<uint32_t>(out, kRecordMagic);
  Put<uint16_t>(out, 1);  // version
  Put<uint16_t>(out, 0);  // flags
  Put<uint64_t>(out, h.gen);
  Put<uint64_t>(out, h.value_checksum);
  Put<uint64_t>(out, h.unit_id);
  Put<uint64_t>(out, 0);
  Put<uint64_t>(out, 0);
  // The checksum covers the 56 bytes before it and the key.
  XXH3_state_t state;
  XXH3_64bits_reset_withSeed(&state, salt);
  XXH3_64bits_update(&state, out.data(), out.size());
  XXH3_64bits_update(&state, key.data(), key.size());
  Put<uint64_t>(out, XXH3_64bits_digest(&state));
  out.append(key);
  return out;
}

std::optional<RecordHeader> DecodeRecordPrefix(std::span<const std::byte> bytes, uint64_t salt,
                                               std::string* key) {
  if (bytes.size() < kRecordHeaderBytes) return std::nullopt;
  const std::byte* p = bytes.data();
  RecordHeader h;
  h.key_len = Get<uint32_t>(p);
  h.value_len = Get<uint32_t>(p + 4);
  if (Get<uint32_t>(p + 8) != kRecordMagic || Get<uint16_t>(p + 12) != 1) return std::nullopt;
  if (h.key_len == 0 || h.key_len > 4096 || kRecordHeaderBytes + h.key_len > bytes.size()) {
    return std::nullopt;
  }
  h.gen = Get<uint64_t>(p + 16);
  h.value_checksum = Get<uint64_t>(p + 24);
  h.unit_id = Get<uint64_t>(p + 32);
  XXH3_state_t state;
  XXH3_64bits_reset_withSeed(&state, salt);
  XXH3_64bits_update(&state, p, 56);
  XXH3_64bits_update(&state, p + kRecordHeaderBytes, h.key_len);
  if (XXH3_64bits_digest(&state) != Get<uint64_t>(p + 56)) return std::nullopt;
  key->assign(reinterpret_cast<const char*>(p + kRecordHeaderBytes), h.key_len);
  return h;
}

std::string EncodeBucketMeta(const BucketMeta& meta, uint64_t salt) {
  std::string body;
  for (const auto& e : meta.entries) {
    Put<uint32_t>(body, static_cast<uint32_t>(e.key.size()));
    Put<uint32_t>(body, 0);
    Put<uint64_t>(body, e.gen);
    Put<uint64_t>(body, e.offset);
    Put<uint64_t>(body, e.size);
    Put<uint64_t>(body, e.checksum);
    body.append(e.key);
  }
  std::string out;
  out.reserve(kBucketMetaHeaderBytes + body.size());
  Put<uint32_t>(out, kBucketMetaMagic);
  Put<uint16_t>(out, 1);
  Put<uint16_t>(out, 0);
  Put<uint32_t>(out, static_cast<uint32_t>(meta.entries.size()));
  Put<uint32_t>(out, 0);
  Put<uint64_t>(out, meta.bucket_id);
  Put<uint64_t>(out, meta.data_bytes);
  Put<uint64_t>(out, body.size());
  Put<uint64_t>(out, Hash(body.data(), body.size(), salt));
  Put<uint64_t>(out, 0);  // reserved
  Put<uint64_t>(out, Hash(out.data(), out.size(), salt));  // over the 56 bytes before it
  out += body;
  return out;
}

Result<BucketMeta> DecodeBucketMeta(std::span<const std::byte> bytes, uint64_t salt) {
  auto bad = [](std::string why) {
    return Result<BucketMeta>(ErrorCode::INVALID_READ, "bucket metadata: " + why);
  };
  if (bytes.size() < kBucketMetaHeaderBytes) return bad("shorter than its header");
  const std::byte* p = bytes.data();
  if (Get<uint32_t>(p) != kBucketMetaMagic || Get<uint16_t>(p + 4) != 1) return bad("bad magic or version");
  if (Hash(p, 56, salt) != Get<uint64_t>(p + 56)) return bad("header checksum mismatch");
  BucketMeta meta;
  uint32_t count = Get<uint32_t>(p + 8);
  meta.bucket_id = Get<uint64_t>(p + 16);
  meta.data_bytes = Get<uint64_t>(p + 24);
  uint64_t body_bytes = Get<uint64_t>(p + 32);
  if (body_bytes > bytes.size() - kBucketMetaHeaderBytes) return bad("torn: body shorter than recorded");
  const std::byte* body = p + kBucketMetaHeaderBytes;
  if (Hash(body, body_bytes, salt) != Get<uint64_t>(p + 40)) return bad("body checksum mismatch");
  if (count > body_bytes / kBucketEntryBytes) return bad("entry count exceeds the body");
  uint64_t pos = 0;
  uint64_t next_free = 0;  // entries are in offset order and never overlap
  meta.entries.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    if (body_bytes - pos < kBucketEntryBytes) return bad("entry past the body");
    BucketEntry e;
    uint32_t key_len = Get<uint32_t>(body + pos);
    e.gen = Get<uint64_t>(body + pos + 8);
    e.offset = Get<uint64_t>(body + pos + 16);
    e.size = Get<uint64_t>(body + pos + 24);
    e.checksum = Get<uint64_t>(body + pos + 32);
    pos += kBucketEntryBytes;
    if (key_len == 0 || key_len > 4096 || body_bytes - pos < key_len) return bad("bad key length");
    e.key.assign(reinterpret_cast<const char*>(body + pos), key_len);
    pos += key_len;
    if (!IsAligned(e.offset) || e.offset < next_free || e.size > meta.data_bytes ||
        e.offset > meta.data_bytes - AlignUp(e.size)) {
      return bad("entry outside the data file or overlapping");
    }
    next_free = e.offset + AlignUp(e.size);
    meta.entries.push_back(std::move(e));
  }
  return meta;
}

uint64_t TombstoneKeyHash(std::string_view key, uint64_t salt) { return Hash(key.data(), key.size(), salt); }

std::string EncodeTombstone(const Tombstone& t, uint64_t salt) {
  std::string out;
  out.reserve(kTombstoneBytes);
  Put<uint32_t>(out, kTombstoneMagic);
  Put<uint16_t>(out, 1);  // version
  Put<uint16_t>(out, 0);
  Put<uint32_t>(out, t.slot);
  Put<uint32_t>(out, 0);
  Put<uint64_t>(out, t.bucket_id);
  Put<uint64_t>(out, t.gen);
  Put<uint64_t>(out, t.key_hash);
  Put<uint64_t>(out, Hash(out.data(), out.size(), salt));
  return out;
}

std::optional<Tombstone> DecodeTombstone(std::span<const std::byte> bytes, uint64_t salt) {
  if (bytes.size() < kTombstoneBytes) return std::nullopt;
  const std::byte* p = bytes.data();
  if (Get<uint32_t>(p) != kTombstoneMagic || Get<uint16_t>(p + 4) != 1) return std::nullopt;
  if (Hash(p, kTombstoneBytes - 8, salt) != Get<uint64_t>(p + kTombstoneBytes - 8)) return std::nullopt;
  Tombstone t;
  t.slot = Get<uint32_t>(p + 8);
  t.bucket_id = Get<uint64_t>(p + 16);
  t.gen = Get<uint64_t>(p + 24);
  t.key_hash = Get<uint64_t>(p + 32);
  return t;
}

std::string EncodeOffsetIndex(const OffsetIndex& index, uint64_t salt) {
  std::string body;
  for (size_t i = 0; i < index.records.size(); ++i) {
    const auto& [h, key] = index.records[i];
    Put<uint32_t>(body, static_cast<uint32_t>(key.size()));
    Put<uint32_t>(body, h.value_len);
    Put<uint64_t>(body, h.gen);
    Put<uint64_t>(body, h.value_checksum);
    Put<uint64_t>(body, h.unit_id);
    Put<uint64_t>(body, index.offsets[i]);
    body.append(key);
  }
  std::string out;
  Put<uint32_t>(out, kOffsetIndexMagic);
  Put<uint16_t>(out, 1);
  Put<uint16_t>(out, 0);
  Put<uint32_t>(out, static_cast<uint32_t>(index.records.size()));
  Put<uint32_t>(out, 0);
  Put<uint64_t>(out, index.capacity);
  Put<uint64_t>(out, index.next_unit_id);
  Put<uint64_t>(out, body.size());
  Put<uint64_t>(out, Hash(body.data(), body.size(), salt));
  Put<uint64_t>(out, index.file_inode);
  Put<uint64_t>(out, Hash(out.data(), out.size(), salt));
  out += body;
  return out;
}

Result<OffsetIndex> DecodeOffsetIndex(std::span<const std::byte> bytes, uint64_t salt) {
  auto bad = [](std::string why) {
    return Result<OffsetIndex>(ErrorCode::INVALID_READ, "offset index: " + why);
  };
  if (bytes.size() < 64) return bad("shorter than its header");
  const std::byte* p = bytes.data();
  if (Get<uint32_t>(p) != kOffsetIndexMagic || Get<uint16_t>(p + 4) != 1) return bad("bad magic or version");
  if (Hash(p, 56, salt) != Get<uint64_t>(p + 56)) return bad("header checksum mismatch");
  OffsetIndex index;
  const uint32_t count = Get<uint32_t>(p + 8);
  index.capacity = Get<uint64_t>(p + 16);
  index.next_unit_id = Get<uint64_t>(p + 24);
  index.file_inode = Get<uint64_t>(p + 48);
  const uint64_t body_bytes = Get<uint64_t>(p + 32);
  if (body_bytes > bytes.size() - 64) return bad("torn: body shorter than recorded");
  const std::byte* body = p + 64;
  if (Hash(body, body_bytes, salt) != Get<uint64_t>(p + 40)) return bad("body checksum mismatch");
  if (count > body_bytes / kOffsetIndexEntryBytes) return bad("entry count exceeds the body");
  uint64_t pos = 0;
  for (uint32_t i = 0; i < count; ++i) {
    if (body_bytes - pos < kOffsetIndexEntryBytes) return bad("entry past the body");
    RecordHeader h;
    h.key_len = Get<uint32_t>(body + pos);
    h.value_len = Get<uint32_t>(body + pos + 4);
    h.gen = Get<uint64_t>(body + pos + 8);
    h.value_checksum = Get<uint64_t>(body + pos + 16);
    h.unit_id = Get<uint64_t>(body + pos + 24);
    const uint64_t offset = Get<uint64_t>(body + pos + 32);
    pos += kOffsetIndexEntryBytes;
    if (h.key_len == 0 || h.key_len > 4096 || body_bytes - pos < h.key_len) return bad("bad key length");
    index.records.emplace_back(h, std::string(reinterpret_cast<const char*>(body + pos), h.key_len));
    index.offsets.push_back(offset);
    pos += h.key_len;
  }
  return index;
}

}  // namespace granary::disk
