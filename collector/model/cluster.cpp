#include "collector/model/cluster.h"

#include <algorithm>

namespace rankscope::collector {

void AckWindow::insert(uint64_t seq) {
  if (seq >= 1 && seq <= through) return;
  above.insert(seq);
  while (!above.empty() && *above.begin() == through + 1) {
    through = *above.begin();
    above.erase(above.begin());
  }
  while (above.size() > kMaxAbove) above.erase(above.begin());
}

std::string ProcessInfo::gpu() const {
  std::vector<std::string> devices;
  size_t start = 0;
  while (start < visible_devices.size()) {
    size_t comma = visible_devices.find(',', start);
    if (comma == std::string::npos) comma = visible_devices.size();
    if (comma > start) devices.push_back(visible_devices.substr(start, comma - start));
    start = comma + 1;
  }
  if (devices.size() == 1) return devices[0];
  // cudaSetDevice told which one (the first it chose).
  if (!cuda_devices.empty()) {
    int32_t d = cuda_devices.front();
    if (devices.empty()) return std::to_string(d);
    if (d >= 0 && static_cast<size_t>(d) < devices.size()) return devices[d];
  }
  if (local_rank >= 0 && static_cast<size_t>(local_rank) < devices.size()) return devices[local_rank];
  if (devices.empty() && local_rank >= 0) return std::to_string(local_rank);
  return {};
}

CgroupUsage::Rate CgroupUsage::rate(uint64_t now_ns, uint64_t window_ns) const {
  Rate out;
  if (samples_.size() < 2) return out;
  const CgroupSample& last = samples_.back();
  if (now_ns > last.ns + window_ns) return out;  // quiet since: not reported any more
  const CgroupSample* first = nullptr;
  for (auto it = samples_.rbegin(); it != samples_.rend(); ++it) {
    first = &*it;
    if (last.ns - it->ns >= window_ns) break;
  }
  if (!first || last.ns <= first->ns) return out;
  out.cpus = static_cast<double>(last.cpu_ns - std::min(last.cpu_ns, first->cpu_ns)) /
             static_cast<double>(last.ns - first->ns);
  out.tcp_retransmits = last.tcp_retransmits - std::min(last.tcp_retransmits, first->tcp_retransmits);
  out.known = true;
  return out;
}

}  // namespace rankscope::collector
