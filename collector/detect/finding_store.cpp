#include "collector/detect/finding_store.h"

#include <capnp/message.h>

#include "proto/codec.h"

namespace rankscope::collector {

std::string encode_finding(const Finding& f) {
  capnp::MallocMessageBuilder builder;
  fill_finding(f, builder.initRoot<proto::query::Finding>());
  return proto::to_packed(builder);
}

void fill_finding(const Finding& f, proto::query::Finding::Builder out) {
  out.setId(f.id);
  out.setKind(finding_kind_name(f.kind));
  out.setJob(f.job);
  out.setComm(f.comm);
  out.setSeq(f.seq);
  auto ranks = out.initRanks(static_cast<unsigned>(f.ranks.size()));
  for (unsigned i = 0; i < f.ranks.size(); ++i) ranks.set(i, f.ranks[i]);
  auto nodes = out.initNodes(static_cast<unsigned>(f.nodes.size()));
  for (unsigned i = 0; i < f.nodes.size(); ++i) nodes.set(i, f.nodes[i]);
  out.setOpenedNs(f.opened_ns);
  out.setResolvedNs(f.resolved_ns);
  out.setUpdatedNs(f.updated_ns);
  out.setSummary(f.summary);
  out.setDetail(f.detail);
  out.setLatenessS(f.lateness_s);
  out.setWaitShare(f.wait_share);
  out.setGpuHoursLost(f.gpu_hours_lost);
  out.setAcknowledgedNs(f.acknowledged_ns);
  out.setAcknowledgedBy(f.acknowledged_by);
}

Result<Finding> decode_finding(const std::string& bytes) {
  Finding f;
  bool kind_ok = true;
  auto read = proto::read_packed<proto::query::Finding>(bytes, proto::ReadLimits{}, [&](auto in) {
    f.id = in.getId();
    kind_ok = parse_finding_kind(in.getKind(), f.kind);
    f.job = in.getJob();
    f.comm = in.getComm();
    f.seq = in.getSeq();
    for (auto r : in.getRanks()) f.ranks.push_back(r);
    for (auto n : in.getNodes()) f.nodes.emplace_back(n.cStr());
    f.opened_ns = in.getOpenedNs();
    f.resolved_ns = in.getResolvedNs();
    f.updated_ns = in.getUpdatedNs();
    f.summary = in.getSummary();
    f.detail = in.getDetail();
    f.lateness_s = in.getLatenessS();
    f.wait_share = in.getWaitShare();
    f.gpu_hours_lost = in.getGpuHoursLost();
    f.acknowledged_ns = in.getAcknowledgedNs();
    f.acknowledged_by = in.getAcknowledgedBy();
  });
  if (!read) return read.error();
  if (!kind_ok) return make_error(Errc::storage, "stored finding " + std::to_string(f.id) + " has an unknown kind");
  return f;
}

Result<void> FindingWriter::restore(const TimelineStore& store) {
  auto values = store.all_findings();
  if (!values) return values.error();
  std::vector<Finding> stored;
  for (const auto& bytes : *values) {
    auto f = decode_finding(bytes);
    if (!f) return make_error(Errc::storage, "a stored finding is unreadable: " + f.error().message);
    stored.push_back(std::move(*f));
  }
  book_.restore(std::move(stored));
  return {};
}

Result<void> FindingWriter::stage(WriteSet& writes, uint64_t, bool) {
  // A failed commit keeps them in the set.
  for (const Finding& f : book_.take_changed()) writes.put_finding(f.id, encode_finding(f));
  return {};
}

}  // namespace rankscope::collector
