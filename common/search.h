#pragma once
// A partition point found from a guess: for searches repeated at nearby
// places of a long sequence (a process's history, asked about at each of
// its calls in turn), where a binary search over the whole of it reads
// entries out of the cache at every step.
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace rankscope {

// The first index of [0, size) at which `before` is false (it is true up
// to some index and false from there, as for std::partition_point),
// searched from `guess` outward and then by halves: where the answer is
// near the guess, only the entries near it are read.
template <typename Before>
size_t partition_from(size_t size, size_t guess, const Before& before) {
  size_t lo = 0, hi = size;  // the answer is in [lo, hi]
  guess = std::min(guess, size);
  if (guess < size && before(guess)) {
    lo = guess + 1;
    for (size_t step = 1; lo < size; step *= 2) {
      const size_t probe = std::min(size - 1, lo + step - 1);
      if (!before(probe)) {
        hi = probe;
        break;
      }
      lo = probe + 1;
    }
  } else {
    hi = guess;
    for (size_t step = 1; hi > 0; step *= 2) {
      const size_t probe = hi >= step ? hi - step : 0;
      if (before(probe)) {
        lo = probe + 1;
        break;
      }
      hi = probe;
    }
  }
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (before(mid)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

}  // namespace rankscope
