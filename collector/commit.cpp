#include "collector/commit.h"

#include <string>

#include "common/log.h"

namespace rankscope::collector {

Result<void> Commit::run(uint64_t now_ns, bool final) {
  for (CommitParticipant* participant : participants_) {
    // One writer that cannot stage (a read it needed failed) does not hold
    // back the others' commit: it stages what it still has next time.
    if (auto staged = participant->stage(writes_, now_ns, final); !staged)
      log_error(staged.error().message, now_ns);
  }
  if (!writes_.empty()) {
    if (auto written = target_.commit(writes_); !written) {
      failing_ = true;
      ++failures_;
      log_error(written.error().message + "; " + std::to_string(writes_.bytes()) +
                    " bytes kept for the next commit, none of it acknowledged",
                now_ns);
      return written;
    }
  }
  if (failing_) RS_LOG(info, "commit: written again after %llu failed commit(s) in all", static_cast<unsigned long long>(failures_));
  failing_ = false;
  for (CommitParticipant* participant : participants_) participant->committed();
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
