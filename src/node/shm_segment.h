// node/shm_segment.h - a node's DRAM segment, held in named POSIX shared memory.
//
// Promise: Create() makes /dev/shm/<name> (mode 0600: same-user clients only) holding a header
// page (transfer::ShmSegmentHeader: magic, layout version, sizes, the current mount's token) and
// then exactly `size` data bytes, and maps it read-write; clients on the same host attach it by
// name (transfer::ShmMapping) and memcpy object bytes in and out of the data area. data() and
// size() are the data area: what the master allocates in. PublishToken() writes the token of a
// mount into the header before the node tells the master, so a client holding a replica of
// another mount (or of an older node process of the same name) sees the mismatch before it
// copies. The node is the only process that ever unlinks it: the destructor unmaps it and unlinks
// the name (if the name still refers to this segment). A segment of the same name left behind by
// a crashed node is unlinked and recreated; one still held by a live node (it keeps an exclusive
// flock on its descriptor) is refused with SEGMENT_ALREADY_EXISTS, so two nodes configured with
// the same name cannot share memory by accident.
//
// One file per mount (Renew). A same-host client copies with memcpy, and nothing stops a client
// paused between its token check and the end of its copy: it may resume after any delay. So a
// remount never reuses memory an earlier mount handed out: Renew() retires this file (its header
// token becomes transfer::kShmRetiredToken for good and its data pages are punched out, freeing
// them at once even while clients still map it) and makes a new file of the same size under the
// same name (created under a temporary "granary-renew-*" name, then renamed over the old one, so
// the name always refers to a file this node holds locked). A late writer of an earlier mount
// then only touches the retired file, which nobody reads: readers check the token, and no mount
// will ever name it again. Its pages come back only where such a writer writes, until the last
// client unmaps it.
//
// /dev/shm is a tmpfs: its pages are allocated on first touch, and a touch that finds the tmpfs
// full raises SIGBUS in whichever process touched it (the node's data server, or a client
// writing a put). Create() therefore checks the free space first and fails with an actionable
// message. prefault=true goes further: it reserves every page at start (fallocate, which fails with
// ENOSPC instead of SIGBUS), so a full /dev/shm fails at start and never later; the price is that
// the whole segment is resident (and counted against the container's memory limit) from the
// start. Without it, the memory is used as objects fill the segment, and something else filling
// /dev/shm meanwhile can still SIGBUS the node or a client. Production nodes should prefault.
//
// Huge pages: a segment is mapped with MADV_HUGEPAGE, so where the tmpfs mount allows huge pages
// (`huge=advise`, `within_size` or `always`, an operator's choice; Debian's /dev/shm has none) a
// client's first write costs one fault per 2 MiB instead of per 4 KiB: it ran at memcpy speed
// instead of 15% of it (docs/store.md). Under `huge=advise` fallocate would reserve small pages,
// so prefault populates the mapping instead (MADV_POPULATE_WRITE: zeroes every page now, about
// 1.2 s per GiB, and fails with ENOMEM instead of SIGBUS like fallocate does); a kernel without
// it (before 5.14) gets fallocate's small pages rather than an unreserved segment.
//
// A node killed with -9 cannot unlink its file, and default names carry the pid, so nobody would
// ever start under that name again: ReclaimOrphans() unlinks every "granary-*" file of this user
// in /dev/shm whose flock is free (its owner is gone: a live node, even a stopped one, holds it)
// and that is older than min_age (a starting node creates its file, then locks it). Nodes call it
// at start and periodically.
//
// Ownership: ShmSegment owns the mapping, the descriptor and the name.
// Thread safety: immutable after Create except the header token (atomic); data(), token() and
// PublishToken() may be used from any thread (the bytes are coordinated by the master's
// protocol, not by this class). Retire and Renew: from the owner's thread, once nobody in this
// process still uses the bytes for a mount (the node fences its data server first).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "granary/status.h"

namespace granary::node {

// Space of the filesystem behind /dev/shm.
struct ShmSpace {
  uint64_t free_bytes = 0;   // available to us: f_bavail * f_frsize
  uint64_t total_bytes = 0;  // f_blocks * f_frsize
};
// The `huge=` option of the tmpfs mounted at `dir`, from /proc/self/mounts text ("never" when it
// has none, or when nothing is mounted exactly there).
std::string TmpfsHugeOption(std::string_view mounts, std::string_view dir);
// Answers the free-space question for a directory; tests inject a fake one.
using ShmSpaceProbe = std::function<Result<ShmSpace>(const std::string& dir)>;

struct ShmSegmentOptions {
  bool prefault = false;
  // Where the shm filesystem is mounted; used only for the free-space check, stat and messages
  // (shm_open itself always uses the system's /dev/shm).
  std::string shm_dir = "/dev/shm";
  ShmSpaceProbe space_probe;  // empty: statvfs(shm_dir)
  // Test hooks. huge_option: the mount's `huge=` value to act on (empty: read /proc/self/mounts).
  // populate: prefault of a mapping under huge=advise, returning 0 or an errno (empty:
  // MADV_POPULATE_WRITE). EINVAL (kernels before 5.14) falls back to reserving with fallocate.
  std::string huge_option;
  std::function<int(void* addr, size_t len)> populate;
};

class ShmSegment {
 public:
  using Options = ShmSegmentOptions;

  // Errors: INVALID_PARAMS for a bad name, a zero size, or a segment that does not fit in the
  // free space of /dev/shm (message: needed and free sizes, and the fixes); SEGMENT_ALREADY_EXISTS
  // when a live node holds the name; INTERNAL_ERROR for a failing system call (errno text).
  static Result<std::unique_ptr<ShmSegment>> Create(const std::string& name, uint64_t size,
                                                    bool prefault = false);
  static Result<std::unique_ptr<ShmSegment>> Create(const std::string& name, uint64_t size,
                                                    const Options& options);
  // statvfs(dir): the default probe.
  static Result<ShmSpace> StatSpace(const std::string& dir);
  // The prefix of every node's segment file ("granary-" + segment name).
  static constexpr std::string_view kNamePrefix = "granary-";
  // Where shm_open keeps its files (glibc): Renew renames in it.
  static constexpr std::string_view kShmDir = "/dev/shm";
  // Unlinks orphaned segment files (see above); returns how many. Never throws; errors on one
  // file skip that file. Any thread.
  static size_t ReclaimOrphans(const std::string& shm_dir = "/dev/shm",
                               std::chrono::seconds min_age = std::chrono::seconds(5));

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // The data area and its size (the file is transfer::kShmHeaderBytes larger).
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // The token in the header (0 until the first PublishToken).
  uint64_t token() const;
  // Stores `token` in the header (release): from now on, clients holding replicas with another
  // token refuse to copy through this segment. Not after Retire.
  void PublishToken(uint64_t token);
  // Marks this memory as no mount's (kShmRetiredToken, final) and punches its data pages out of
  // the file (they read as zeros afterwards). Idempotent.
  void Retire();
  bool retired() const { return retired_; }
  // Retires this file and returns its successor: a new file of the same size and options under
  // the same name (token 0, nothing in it). This object then keeps only the retired file (unmapped
  // when it is destroyed; its name is not touched). On error the name still refers to this
  // (retired) file and Renew may be called again. Errors: those of Create, and INTERNAL_ERROR if
  // the new file cannot take the name.
  Result<std::unique_ptr<ShmSegment>> Renew();

 private:
  ShmSegment(std::string name, int fd, uint8_t* base, uint64_t size, Options options);

  std::string name_;
  Options options_;  // what Renew makes the successor with
  bool retired_ = false;
  int fd_;  // kept open: its flock tells other nodes this segment is alive
  uint8_t* base_;  // the whole mapping: header + data
  uint8_t* data_;
  uint64_t size_;
};

}  // namespace granary::node
