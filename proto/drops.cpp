#include "proto/drops.h"

namespace rankscope::proto {
namespace {

using R = wire::DropCounters::Reader;
using B = wire::DropCounters::Builder;

struct WireField {
  uint64_t (R::*get)() const;
  void (B::*set)(uint64_t);
};

// In kDropReasons' order.
constexpr std::array<WireField, kDropReasons.size()> kFields = {{
    {&R::getRingbufFull, &B::setRingbufFull},
    {&R::getMapFull, &B::setMapFull},
    {&R::getUnknownComm, &B::setUnknownComm},
    {&R::getNested, &B::setNested},
    {&R::getSendQueueFull, &B::setSendQueueFull},
    {&R::getLostRecords, &B::setLostRecords},
    {&R::getSpoolDamaged, &B::setSpoolDamaged},
    {&R::getLostReturns, &B::setLostReturns},
    {&R::getMalformed, &B::setMalformed},
    {&R::getProfilerDropped, &B::setProfilerDropped},
    {&R::getUserShare, &B::setUserShare},
}};

}  // namespace

DropCounts read_drops(wire::DropCounters::Reader in) {
  DropCounts out;
  for (size_t i = 0; i < kDropReasons.size(); ++i) out.*kDropReasons[i].count = (in.*kFields[i].get)();
  return out;
}

void write_drops(const DropCounts& in, wire::DropCounters::Builder out) {
  for (size_t i = 0; i < kDropReasons.size(); ++i) (out.*kFields[i].set)(in.*kDropReasons[i].count);
}

}  // namespace rankscope::proto
