#pragma once
// The one median of the project: the middle value, or the mean of the two
// middle values of an even count (0 for none). Takes its input by value
// (it reorders it).
#include <algorithm>
#include <cstdint>
#include <vector>

namespace rankscope {

template <typename T>
T median(std::vector<T> values) {
  if (values.empty()) return T{};
  size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  T upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  T lower = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return lower + (upper - lower) / 2;
}

// The same of values already in ascending order, without a copy.
template <typename T>
T median_of_sorted(const std::vector<T>& sorted) {
  if (sorted.empty()) return T{};
  size_t mid = sorted.size() / 2;
  if (sorted.size() % 2 == 1) return sorted[mid];
  return sorted[mid - 1] + (sorted[mid] - sorted[mid - 1]) / 2;
}

}  // namespace rankscope
