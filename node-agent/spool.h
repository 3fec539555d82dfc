#pragma once
// The agent's on-disk spool: every batch is written here before it is sent
// and stays until the collector acknowledges it, so that neither a collector
// away for hours nor a restart of the agent loses what was traced.
//
// A folder of append-only segment files (`<16 hex digits>.seg`, numbered in
// order). A segment is a run of records: a fixed header (magic, kind, length,
// CRC-32 of the payload, instance id, batch seq) then, for a batch, its bytes
// as sent (the Cap'n Proto message with its original instance id and seq, so
// that the collector's duplicate check still works after a restart). An ack
// is a header-only record: it may sit in a later segment than its batch.
//
// Durability: each record is written with write(2) as it comes (it survives
// a crash or SIGKILL of the agent); fdatasync runs at most once per
// `sync_interval_ns` (a power loss loses at most that much). A segment is
// deleted once every batch in it is acknowledged; past `max_bytes` the oldest
// segment is deleted and the caller told which batches went with it.
// A record that is cut short or fails its CRC at open ends that segment's
// reading: the rest of the file is skipped and counted, never trusted.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace rankscope::agent {

// Where a batch lies on disk.
struct SpoolRef {
  uint64_t segment = 0;  // 0: not on disk
  uint64_t offset = 0;   // of the payload
  uint32_t size = 0;
};

class Spool {
 public:
  struct Limits {
    uint64_t max_bytes = 1ull << 30;        // all segments together
    uint64_t segment_bytes = 4ull << 20;    // a new segment is started past this
    uint64_t sync_interval_ns = 1'000'000'000ull;
  };
  // A batch found at open, not acknowledged by an earlier run: where it
  // lies (its bytes are read when it is sent; a spool of a long outage can
  // be far larger than the agent's memory).
  struct Recovered {
    uint64_t instance = 0, seq = 0;
    SpoolRef ref;
  };
  // What open found wrong (counted, logged, never fatal).
  struct Damage {
    uint64_t bad_tails = 0;      // segments whose end was cut short or corrupt
    uint64_t skipped_bytes = 0;  // bytes of those tails, not read
  };

  // Creates `dir` if needed, takes its lock (one agent per spool), reads
  // every segment. Fails with a message to act on (not writable, locked,
  // or writable by anyone but the agent's own user: whoever can write
  // there can make the agent send batches in its node's name).
  static Result<std::unique_ptr<Spool>> open(const std::string& dir, const Limits& limits);
  ~Spool();
  Spool(const Spool&) = delete;

  // The unacknowledged batches the previous runs left, oldest first (once;
  // later calls return nothing).
  std::vector<Recovered> take_recovered();
  const Damage& damage() const { return damage_; }

  // Writes a batch; the ref is what read() and acked() take.
  Result<SpoolRef> append(uint64_t instance, uint64_t seq, const std::string& bytes);
  // The collector has it: the batch's segment may go.
  void acked(uint64_t instance, uint64_t seq, const SpoolRef& ref);
  // The batch's bytes, its record's checksum checked again (the disk may
  // have changed them since they were written or read at open).
  Result<std::string> read(const SpoolRef& ref) const;
  // While over max_bytes: the oldest segment that still holds batches, which
  // the caller should forget (then call drop_segment). nullopt: within bounds.
  std::optional<uint64_t> segment_to_drop() const;
  void drop_segment(uint64_t segment);
  // fdatasync when the interval passed since the last (cheap otherwise).
  void maybe_sync(uint64_t now_ns);

  uint64_t bytes() const { return total_bytes_; }
  size_t segments() const { return segments_.size(); }
  const std::string& dir() const { return dir_; }

 private:
  struct Segment {
    uint64_t size = 0;
    uint64_t live = 0;  // batches not yet acknowledged
  };
  Spool(std::string dir, const Limits& limits, int lock_fd);
  Result<void> load();
  Result<void> start_segment();
  Result<void> write_record(uint8_t kind, uint64_t instance, uint64_t seq, const std::string& payload,
                            uint64_t* payload_offset);
  std::string path(uint64_t segment) const;
  void remove_segment(uint64_t segment);

  std::string dir_;
  Limits limits_;
  int lock_fd_ = -1;
  int active_fd_ = -1;
  uint64_t active_ = 0;  // segment being written (0: none yet)
  std::map<uint64_t, Segment> segments_;
  uint64_t total_bytes_ = 0;
  bool unsynced_ = false;
  uint64_t last_sync_ns_ = 0;
  std::vector<Recovered> recovered_;
  Damage damage_;
};

}  // namespace rankscope::agent
