#include "node-agent/spool.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "common/log.h"

namespace rankscope::agent {

namespace {
constexpr uint32_t kMagic = 0x52535350;  // "RSSP"
constexpr uint8_t kBatch = 1, kAck = 2;
// Far above any batch the agent makes (the collector takes 64 MiB frames):
// a larger length can only be damage.
constexpr uint32_t kMaxRecord = 64u << 20;

// On disk, little-endian (the machines that run the agent), packed by hand.
struct Header {
  uint32_t magic;
  uint8_t kind;
  uint8_t pad[3];
  uint32_t length;  // payload bytes
  uint32_t crc;     // CRC-32 of the payload and of instance + seq
  uint64_t instance;
  uint64_t seq;
};
static_assert(sizeof(Header) == 32, "spool record header is 32 bytes on disk");

uint32_t record_crc(const Header& h, const char* payload, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(&h.kind), 1);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(&h.instance), sizeof h.instance);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(&h.seq), sizeof h.seq);
  if (size) crc = crc32(crc, reinterpret_cast<const Bytef*>(payload), static_cast<uInt>(size));
  return static_cast<uint32_t>(crc);
}

std::string errno_text() { return std::strerror(errno); }

bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool read_at(int fd, char* data, size_t size, uint64_t offset) {
  while (size > 0) {
    ssize_t n = ::pread(fd, data, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

Result<void> make_dirs(const std::string& dir) {
  for (size_t slash = 1; slash <= dir.size(); ++slash) {
    if (slash != dir.size() && dir[slash] != '/') continue;
    std::string part = dir.substr(0, slash);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST)
      return make_error(Errc::io, "cannot create spool folder " + part + ": " + errno_text());
  }
  return {};
}

// A file created in or removed from the spool folder is durable once the
// folder itself is synced.
void sync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  if (::fsync(fd) != 0) RS_LOG(warn, "spool %s: fsync of the folder failed: %s", dir.c_str(), errno_text().c_str());
  ::close(fd);
}

// The spool folder must be the agent's own: a directory owned by its user
// and writable by nobody else.
Result<void> check_owner(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return make_error(Errc::io, "cannot stat spool folder " + dir + ": " + errno_text());
  if (!S_ISDIR(st.st_mode)) return make_error(Errc::invalid_argument, "spool folder " + dir + " is not a directory");
  if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return make_error(Errc::refused, "spool folder " + dir + " is owned by uid " + std::to_string(st.st_uid) +
                                         " with mode " + mode + ": whoever can write there can make this agent send "
                                         "batches in its node's name; make it the agent's own (chown " +
                                         std::to_string(::geteuid()) + " " + dir + "; chmod 0700 " + dir + ")");
  }
  return {};
}

// "0000000000000001.seg" -> 1; 0 for any other name.
uint64_t segment_number(const char* name) {
  std::string text(name);
  if (text.size() != 20 || text.substr(16) != ".seg") return 0;
  uint64_t n = 0;
  for (size_t i = 0; i < 16; ++i) {
    char c = text[i];
    int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return 0;
    n = n * 16 + static_cast<uint64_t>(digit);
  }
  return n;
}
// Reads and checks the record at `offset` of a segment of `size` bytes
// into `h`; "" if it is whole and its checksum matches, else what is wrong.
std::string read_record(int fd, uint64_t size, uint64_t offset, Header& h) {
  if (size - offset < sizeof h) return "a record header cut short";
  if (!read_at(fd, reinterpret_cast<char*>(&h), sizeof h, offset)) return "unreadable: " + errno_text();
  if (h.magic != kMagic || (h.kind != kBatch && h.kind != kAck) || h.length > kMaxRecord) return "not a spool record";
  if (size - offset - sizeof h < h.length) return "a record cut short";
  std::string payload(h.length, '\0');
  if (h.length && !read_at(fd, payload.data(), h.length, offset + sizeof h)) return "unreadable: " + errno_text();
  if (record_crc(h, payload.data(), payload.size()) != h.crc) return "a record whose checksum does not match";
  return {};
}

}  // namespace

Spool::Spool(std::string dir, const Limits& limits, int lock_fd)
    : dir_(std::move(dir)), limits_(limits), lock_fd_(lock_fd) {}

Spool::~Spool() {
  if (active_fd_ >= 0) {
    if (unsynced_) ::fdatasync(active_fd_);
    ::close(active_fd_);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

std::string Spool::path(uint64_t segment) const {
  char name[32];
  std::snprintf(name, sizeof name, "/%016llx.seg", static_cast<unsigned long long>(segment));
  return dir_ + name;
}

Result<std::unique_ptr<Spool>> Spool::open(const std::string& dir, const Limits& limits) {
  if (dir.empty() || dir[0] != '/') return make_error(Errc::invalid_argument, "spool folder must be an absolute path");
  if (auto made = make_dirs(dir); !made) return made.error();
  if (auto owned = check_owner(dir); !owned) return owned.error();
  std::string lock_path = dir + "/lock";
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock_fd < 0) return make_error(Errc::io, "cannot open " + lock_path + ": " + errno_text());
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd);
    return make_error(Errc::refused, "spool " + dir + " is in use by another rankscope-agent (lock " + lock_path +
                                         "); give each agent its own --spool-dir or --node");
  }
  std::unique_ptr<Spool> spool(new Spool(dir, limits, lock_fd));
  if (auto loaded = spool->load(); !loaded) return loaded.error();
  return spool;
}

Result<void> Spool::load() {
  DIR* d = ::opendir(dir_.c_str());
  if (!d) return make_error(Errc::io, "cannot read spool folder " + dir_ + ": " + errno_text());
  std::set<uint64_t> numbers;
  while (dirent* entry = ::readdir(d))
    if (uint64_t n = segment_number(entry->d_name)) numbers.insert(n);
  ::closedir(d);

  struct Found {
    Recovered batch;
    bool acked = false;
  };
  std::vector<Found> found;
  std::map<std::pair<uint64_t, uint64_t>, size_t> index;  // (instance, seq) -> found
  for (uint64_t number : numbers) {
    std::string file = path(number);
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return make_error(Errc::io, "cannot read spool segment " + file + ": " + errno_text());
    struct stat st {};
    ::fstat(fd, &st);
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
      ::close(fd);
      return make_error(Errc::refused, "spool segment " + file + " is not a file of the agent's own user");
    }
    uint64_t size = static_cast<uint64_t>(st.st_size), offset = 0;
    std::string why;
    while (offset < size) {
      Header h{};
      why = read_record(fd, size, offset, h);
      if (!why.empty()) break;
      auto key = std::make_pair(h.instance, h.seq);
      if (h.kind == kBatch) {
        Found f;
        f.batch = Recovered{h.instance, h.seq, SpoolRef{number, offset + sizeof h, h.length}};
        index[key] = found.size();
        found.push_back(std::move(f));
      } else if (auto it = index.find(key); it != index.end()) {
        found[it->second].acked = true;
      }
      offset += sizeof h + h.length;
    }
    ::close(fd);
    if (offset < size) {
      ++damage_.bad_tails;
      damage_.skipped_bytes += size - offset;
      RS_LOG(error, "spool segment %s: %s at byte %llu; its last %llu byte(s) are skipped", file.c_str(), why.c_str(),
             static_cast<unsigned long long>(offset), static_cast<unsigned long long>(size - offset));
    }
    segments_[number] = Segment{size, 0};
    total_bytes_ += size;
  }
  for (auto& f : found) {
    if (f.acked) continue;
    ++segments_[f.batch.ref.segment].live;
    recovered_.push_back(std::move(f.batch));
  }
  // Segments with nothing left to send go now.
  for (auto it = segments_.begin(); it != segments_.end();) {
    auto next = std::next(it);
    if (it->second.live == 0) remove_segment(it->first);
    it = next;
  }
  if (!recovered_.empty())
    RS_LOG(info, "spool %s: %zu batch(es) of an earlier run not acknowledged; they go first", dir_.c_str(),
           recovered_.size());
  // Never append to a segment written by an earlier run (its tail may be bad).
  return start_segment();
}

std::vector<Spool::Recovered> Spool::take_recovered() {
  std::vector<Recovered> out;
  out.swap(recovered_);
  return out;
}

Result<void> Spool::start_segment() {
  if (active_fd_ >= 0) {
    if (unsynced_) ::fdatasync(active_fd_);
    unsynced_ = false;
    ::close(active_fd_);
    active_fd_ = -1;
    uint64_t old = active_;
    if (auto it = segments_.find(old); it != segments_.end() && it->second.live == 0) remove_segment(old);
  }
  uint64_t next = segments_.empty() ? 1 : segments_.rbegin()->first + 1;
  if (next <= active_) next = active_ + 1;
  std::string file = path(next);
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(Errc::io, "cannot create spool segment " + file + ": " + errno_text());
  sync_dir(dir_);
  active_fd_ = fd;
  active_ = next;
  segments_[next] = Segment{};
  return {};
}

Result<void> Spool::write_record(uint8_t kind, uint64_t instance, uint64_t seq, const std::string& payload,
                                 uint64_t* payload_offset) {
  if (active_fd_ < 0 || segments_[active_].size >= limits_.segment_bytes)
    if (auto started = start_segment(); !started) return started;
  Header h{};
  h.magic = kMagic;
  h.kind = kind;
  h.length = static_cast<uint32_t>(payload.size());
  h.instance = instance;
  h.seq = seq;
  h.crc = record_crc(h, payload.data(), payload.size());
  std::string record(reinterpret_cast<const char*>(&h), sizeof h);
  record += payload;
  Segment& segment = segments_[active_];
  if (!write_all(active_fd_, record.data(), record.size())) {
    std::string why = errno_text();
    // A partial record would hide what follows: cut the file back, then start anew.
    if (::ftruncate(active_fd_, static_cast<off_t>(segment.size)) != 0) {
      ::close(active_fd_);
      active_fd_ = -1;
    }
    return make_error(Errc::io, "cannot write spool segment " + path(active_) + ": " + why);
  }
  if (payload_offset) *payload_offset = segment.size + sizeof h;
  segment.size += record.size();
  total_bytes_ += record.size();
  unsynced_ = true;
  return {};
}

Result<SpoolRef> Spool::append(uint64_t instance, uint64_t seq, const std::string& bytes) {
  if (bytes.size() > kMaxRecord) return make_error(Errc::invalid_argument, "batch larger than a spool record");
  uint64_t offset = 0;
  if (auto written = write_record(kBatch, instance, seq, bytes, &offset); !written) return written.error();
  ++segments_[active_].live;
  return SpoolRef{active_, offset, static_cast<uint32_t>(bytes.size())};
}

void Spool::acked(uint64_t instance, uint64_t seq, const SpoolRef& ref) {
  auto it = segments_.find(ref.segment);
  if (ref.segment == 0 || it == segments_.end() || it->second.live == 0) return;
  --it->second.live;
  if (it->second.live == 0 && ref.segment != active_) {
    remove_segment(ref.segment);  // its acks need not be written: nothing there to replay
    return;
  }
  // Noted so that a restart does not send it again (not synced: a lost note costs one duplicate).
  if (auto written = write_record(kAck, instance, seq, {}, nullptr); !written)
    RS_LOG(warn, "%s", written.error().message.c_str());
}

Result<std::string> Spool::read(const SpoolRef& ref) const {
  if (!segments_.count(ref.segment)) return make_error(Errc::not_found, "spool segment " + path(ref.segment) + " is gone");
  if (ref.offset < sizeof(Header)) return make_error(Errc::invalid_argument, "not a spool record reference");
  int fd = ::open(path(ref.segment).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return make_error(Errc::io, "cannot read spool segment " + path(ref.segment) + ": " + errno_text());
  Header h{};
  std::string bytes(ref.size, '\0');
  bool ok = read_at(fd, reinterpret_cast<char*>(&h), sizeof h, ref.offset - sizeof h) &&
            read_at(fd, bytes.data(), bytes.size(), ref.offset);
  ::close(fd);
  if (!ok) return make_error(Errc::io, "cannot read spool segment " + path(ref.segment) + ": short read");
  if (h.magic != kMagic || h.kind != kBatch || h.length != ref.size || record_crc(h, bytes.data(), bytes.size()) != h.crc)
    return make_error(Errc::io, "spool segment " + path(ref.segment) + ": the record at byte " +
                                    std::to_string(ref.offset - sizeof h) +
                                    " no longer matches its checksum (changed on disk since it was written)");
  return bytes;
}

std::optional<uint64_t> Spool::segment_to_drop() const {
  if (total_bytes_ <= limits_.max_bytes) return std::nullopt;
  for (const auto& [number, segment] : segments_)
    if (number != active_) return number;
  return std::nullopt;  // only the segment being written: it rotates at segment_bytes
}

void Spool::drop_segment(uint64_t segment) {
  if (segment != active_) remove_segment(segment);
}

void Spool::remove_segment(uint64_t segment) {
  auto it = segments_.find(segment);
  if (it == segments_.end()) return;
  if (::unlink(path(segment).c_str()) != 0 && errno != ENOENT)
    RS_LOG(warn, "cannot remove spool segment %s: %s", path(segment).c_str(), errno_text().c_str());
  else
    sync_dir(dir_);  // else a power loss may bring it back, and its batches with it
  total_bytes_ -= it->second.size;
  segments_.erase(it);
}

void Spool::maybe_sync(uint64_t now_ns) {
  if (!unsynced_ || active_fd_ < 0 || now_ns - last_sync_ns_ < limits_.sync_interval_ns) return;
  if (::fdatasync(active_fd_) != 0) RS_LOG(warn, "spool %s: fdatasync failed: %s", dir_.c_str(), errno_text().c_str());
  unsynced_ = false;
  last_sync_ns_ = now_ns;
}

}  // namespace rankscope::agent
