#pragma once
// Which exchange a host's wait on the GPU waited for (the straggler
// detector's releases: Detector::ProcHistory).
#include <algorithm>
#include <cstdint>

namespace rankscope::collector {

// A host wait on the GPU that began within this of an exchange's release
// (and the clocks' margin, below) waited for it (a synchronize right after
// a Recv, or at a step's end after the last bucket). One that began later
// waited for GPU work of its own.
constexpr uint64_t kWaitJoinNs = 2'000'000;
// A wait is matched to the exchanges its host entered at most this long
// before it began (an exchange whose wait record came first is matched when
// it completes).
constexpr uint64_t kWaitLookbackNs = 1'000'000'000ull;

// Whether a host wait (start, end) of a member that arrived at `arrival`
// waited for an exchange released at `release` (the last arrival): the
// exchange was on its stream before the wait began, and the wait held the
// host past the release. All on the cluster clock, and not all alike: the
// release is often another node's arrival, and the member's wait came in
// a later batch than its arrival, put on the cluster clock with its node's
// estimate of then, anywhere within that estimate's bound. `margin` is the
// clocks' margin the member's lag is judged less (Detector::refresh_margins:
// its node's uncertainty and the most uncertain other node's, or its
// node's recent moves against ranks of the same node), at most
// kWaitLookbackNs (a clock not known yet). Without it, a member that
// arrived last or nearly, on a node whose estimate moved a few ms forward
// between its batches, had its synchronize taken for a wait of its own:
// free at the release, not once the data came, it was late at its next
// collective by the whole transfer, and whole nodes of healthy sync-each
// jobs were found slow on a busy machine (docs/benchmarks.md). Moved back
// instead, even by less than a millisecond, the synchronize begun tens of
// microseconds after its call seemed to begin before it, and every member
// of the node was late the same way, on a quiet machine too: the wait
// began after the arrival within the margin. The price: a wait for GPU
// work of its own begun within the margin after the release counts as one
// for the exchange, as a lag within the margin does not count; and a wait
// that ended just before the member's call (a copy after the previous
// exchange's synchronize) can be matched to it. Such a wait ended before
// the call, and dates the data at the release or within the margin after
// it (data_moved): every member is then free at about the release alike,
// as if no one had waited, and none is made late against the others by
// more than the margin, which its lag is judged less.
inline bool waited_for(uint64_t start, uint64_t end, uint64_t arrival, uint64_t release, uint64_t margin) {
  margin = std::min(margin, kWaitLookbackNs);
  return arrival <= start + margin && start <= release + kWaitJoinNs + margin && end + margin >= release;
}

// When a wait that waited for an exchange says its data had moved: its
// end, or the release where the clocks put the end before it (a wait
// within the margin), so that one such wait never makes the exchange's
// members free before its release.
inline uint64_t data_moved(uint64_t end, uint64_t release) {
  return std::max(end, release);
}

}  // namespace rankscope::collector
