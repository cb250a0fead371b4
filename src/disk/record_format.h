// disk/record_format.h - the bytes the disk tier puts on disk besides values: the record header
// (file-per-key and offset backends), the bucket metadata file, the bucket backend's tombstones
// and the offset backend's shutdown index. docs/disk.md draws them.
//
// Promise: Encode* produce what Decode* accept; Decode* accept nothing else - wrong magic or
// version, a checksum that does not hold, sizes out of range or pointing outside the bytes given
// are refused, never trusted, so a torn or hostile file cannot make the reader overrun or allocate
// without bound. Every checksum is XXH3 seeded with the store's salt (a random number kept in the
// store's FORMAT file), so record images copied from another store, or stored as a value, do not
// pass for records of this one. Integers are little-endian.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "granary/status.h"

namespace granary::disk {

// --- record: [key_len u32 | value_len u32 | magic u32 | version u16 | flags u16 | gen u64 |
//              value_checksum u64 | unit_id u64 | reserved u64 x2 | header_checksum u64 | key |
//              zeros to 4 KiB | value | zeros to 4 KiB]
inline constexpr uint32_t kRecordMagic = 0x31445247;  // "GRD1"
inline constexpr size_t kRecordHeaderBytes = 64;

struct RecordHeader {
  uint32_t key_len = 0;
  uint32_t value_len = 0;
  uint64_t gen = 0;
  uint64_t value_checksum = 0;
  uint64_t unit_id = 0;  // the record's creation sequence number
};

// Bytes before the value: header and key, rounded up to 4 KiB so the value starts aligned.
uint64_t RecordPrefixBytes(uint32_t key_len);
// Header and key (kRecordHeaderBytes + key.size() bytes; the writer pads).
std::string EncodeRecordPrefix(const RecordHeader& header, std::string_view key, uint64_t salt);
// nullopt unless `bytes` start with a valid header whose key fits in `bytes`; sets *key.
std::optional<RecordHeader> DecodeRecordPrefix(std::span<const std::byte> bytes, uint64_t salt,
                                               std::string* key);

// --- bucket metadata file: a 64-byte header [magic u32 "GRBM" | version u16 | pad u16 |
// count u32 | pad u32 | bucket_id u64 | data_bytes u64 | body_bytes u64 | body_checksum u64 |
// reserved u64 | header_checksum u64], then `count` entries [key_len u32 | pad u32 | gen u64 | offset u64 |
// size u64 | checksum u64 | key].
inline constexpr uint32_t kBucketMetaMagic = 0x4d425247;  // "GRBM"
inline constexpr size_t kBucketMetaHeaderBytes = 64;
inline constexpr size_t kBucketEntryBytes = 40;  // before the key

struct BucketEntry {
  std::string key;
  uint64_t gen = 0;
  uint64_t offset = 0;    // of the value in the data file (4 KiB-aligned)
  uint64_t size = 0;      // value bytes (the data file holds them padded to 4 KiB)
  uint64_t checksum = 0;  // of the value
};

struct BucketMeta {
  uint64_t bucket_id = 0;
  uint64_t data_bytes = 0;  // the data file's length when complete
  std::vector<BucketEntry> entries;
};

std::string EncodeBucketMeta(const BucketMeta& meta, uint64_t salt);
// INVALID_READ naming what is wrong. Entries must lie inside data_bytes and not overlap.
Result<BucketMeta> DecodeBucketMeta(std::span<const std::byte> bytes, uint64_t salt);

// --- bucket tombstone: one fixed-size record per copy removed from a bucket that stays on disk,
// appended to <dir>/buckets/tombstones. [magic u32 "GRTB" | version u16 | pad u16 | slot u32 |
// pad u32 | bucket_id u64 | gen u64 | key_hash u64 | checksum u64 (of the 40 bytes before it)].
// It names the copy by (bucket, slot) and also by (gen, key hash), so that a tombstone outliving
// its bucket can never hide another copy should that bucket id ever be used again.
inline constexpr uint32_t kTombstoneMagic = 0x42545247;  // "GRTB"
inline constexpr size_t kTombstoneBytes = 48;

struct Tombstone {
  uint64_t bucket_id = 0;
  uint32_t slot = 0;  // the copy's index in the bucket's metadata
  uint64_t gen = 0;
  uint64_t key_hash = 0;  // TombstoneKeyHash(key)
};

uint64_t TombstoneKeyHash(std::string_view key, uint64_t salt);
std::string EncodeTombstone(const Tombstone& tombstone, uint64_t salt);  // kTombstoneBytes bytes
// nullopt unless `bytes` (at least kTombstoneBytes) start with a valid tombstone.
std::optional<Tombstone> DecodeTombstone(std::span<const std::byte> bytes, uint64_t salt);

// --- offset backend's shutdown index (<dir>/offset.index): the record table as it was at a clean
// close, so the next open need not scan the file. A 64-byte header [magic u32 "GROI" |
// version u16 | pad u16 | count u32 | pad u32 | capacity u64 | next_unit_id u64 | body_bytes u64 |
// body_checksum u64 | file_inode u64 | header_checksum u64], then `count` entries [key_len u32 |
// value_len u32 | gen u64 | value_checksum u64 | unit_id u64 | offset u64 | key].
inline constexpr uint32_t kOffsetIndexMagic = 0x494f5247;  // "GROI"
inline constexpr size_t kOffsetIndexEntryBytes = 40;       // before the key

struct OffsetIndex {
  uint64_t capacity = 0;      // the offset file's size when written
  uint64_t next_unit_id = 0;  // the record sequence's next value
  uint64_t file_inode = 0;    // of the offset file it describes (a recreated file is not it)
  std::vector<std::pair<RecordHeader, std::string>> records;  // header (unit_id set) and key
  std::vector<uint64_t> offsets;                               // of each record, same order
};

std::string EncodeOffsetIndex(const OffsetIndex& index, uint64_t salt);
// INVALID_READ naming what is wrong; checks checksums and sizes only (the layout checks that the
// records fit its file and do not overlap).
Result<OffsetIndex> DecodeOffsetIndex(std::span<const std::byte> bytes, uint64_t salt);

}  // namespace granary::disk
