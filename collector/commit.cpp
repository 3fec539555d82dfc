#include "collector/commit.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/log.h"

namespace rankscope::collector {

Commit::~Commit() {
  if (writer_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    wake_.notify_one();
    writer_.join();
  }
  if (done_fd_ >= 0) close(done_fd_);
}

void Commit::stage_all(uint64_t now_ns, bool final) {
  for (CommitParticipant* participant : participants_) {
    // One writer that cannot stage (a read it needed failed) does not hold
    // back the others' commit: it stages what it still has next time.
    if (auto staged = participant->stage(writes_, now_ns, final); !staged)
      log_error(staged.error().message, now_ns);
  }
}

void Commit::succeeded() {
  if (failing_)
    RS_LOG(info, "commit: written again after %llu failed commit(s) in all",
           static_cast<unsigned long long>(failures_));
  failing_ = false;
  for (CommitParticipant* participant : participants_) participant->committed();
}

void Commit::failed(const Error& error, uint64_t now_ns) {
  failing_ = true;
  ++failures_;
  log_error(error.message + "; " + std::to_string(backlog_bytes()) +
                " bytes kept for the next commit, none of it acknowledged",
            now_ns);
}

Result<void> Commit::run(uint64_t now_ns, bool final) {
  if (writing_) (void)finish();  // its outcome is applied (a failure logged); this run writes what it kept
  stage_all(now_ns, final);
  if (!writes_.empty()) {
    if (auto written = target_.commit(writes_); !written) {
      failed(written.error(), now_ns);
      return written;
    }
  }
  succeeded();
  return {};
}

void Commit::start_writer() {
  if (writer_.joinable()) return;
  done_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (done_fd_ < 0) RS_LOG(error, "commit: eventfd: %s (the loop polls for finished writes instead)", strerror(errno));
  writer_ = std::thread([this] { writer_loop(); });
}

void Commit::writer_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return job_ || quit_; });
    if (quit_) return;
    lock.unlock();
    Result<void> written = target_.commit(in_flight_);
    lock.lock();
    job_ = false;
    result_ = std::move(written);
    done_.notify_all();
    if (done_fd_ >= 0) {
      const uint64_t one = 1;
      if (write(done_fd_, &one, sizeof(one)) < 0) {
        // Only a full counter (2^64 - 2 unread) fails: it is readable anyway.
      }
    }
  }
}

bool Commit::begin(uint64_t now_ns) {
  if (writing_) return true;
  if (!writer_.joinable()) start_writer();
  stage_all(now_ns, false);
  if (writes_.empty()) {
    succeeded();
    return false;
  }
  // The set goes to the writer; writes_ (the same object the ingest puts
  // records into) takes what in_flight_ held: nothing, since a failed
  // write's set was put back under writes_.
  std::swap(writes_, in_flight_);
  in_flight_bytes_ = in_flight_.bytes();
  in_flight_now_ns_ = now_ns;
  writing_ = true;
  {
    std::lock_guard lock(mutex_);
    result_.reset();
    job_ = true;
  }
  wake_.notify_one();
  return true;
}

bool Commit::write_done() const {
  std::lock_guard lock(mutex_);
  return writing_ && result_.has_value();
}

Result<void> Commit::finish() {
  if (!writing_) return {};
  Result<void> outcome;
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return result_.has_value(); });
    outcome = std::move(*result_);
    result_.reset();
  }
  if (done_fd_ >= 0) {
    uint64_t count = 0;
    if (read(done_fd_, &count, sizeof(count)) < 0) {
      // EAGAIN: nothing to drain.
    }
  }
  writing_ = false;
  in_flight_bytes_ = 0;
  if (!outcome) {
    writes_.put_under(in_flight_);
    failed(outcome.error(), in_flight_now_ns_);
    return outcome;
  }
  succeeded();
  return {};
}

void Commit::log_error(const std::string& what, uint64_t now_ns) {
  constexpr uint64_t kIntervalNs = 10'000'000'000ull;
  if (logged_ns_ != 0 && now_ns - logged_ns_ < kIntervalNs) {
    ++suppressed_;
    return;
  }
  if (suppressed_)
    RS_LOG(error, "commit: %s (and %llu more errors in the last 10 s)", what.c_str(),
           static_cast<unsigned long long>(suppressed_));
  else
    RS_LOG(error, "commit: %s", what.c_str());
  logged_ns_ = now_ns;
  suppressed_ = 0;
}

}  // namespace rankscope::collector
