#include "collector/query.h"

#include <capnp/message.h>

#include <algorithm>
#include <optional>

#include "collector/detect/finding_store.h"
#include "collector/usage/report_query.h"
#include "common/format.h"
#include "common/version.h"
#include "proto/codec.h"
#include "proto/drops.h"

namespace rankscope::collector {

namespace query = proto::query;

namespace {
void answer_status(const QueryContext& ctx, query::StatusReply::Builder out) {
  const Ingest& ingest = ctx.ingest;
  uint64_t now = ctx.clock.realtime_ns();
  out.setCollectorVersion(kVersion);
  out.setStartedNs(ingest.started_ns());
  out.setNowNs(now);
  out.setBatchesStored(ingest.counters().batches_stored);
  out.setRecordsStored(ingest.counters().records_stored);
  out.setDuplicateBatches(ingest.counters().duplicate_batches);
  out.setBadMessages(ingest.counters().bad_messages);
  out.setBatchBytes(ingest.counters().batch_bytes);
  out.setThrottledMessages(ingest.counters().throttled_messages);
  out.setRefusedClaims(ingest.counters().refused_claims);
  if (ctx.fleet) out.setCollectorId(ctx.fleet->view().self);
  auto nodes = out.initNodes(static_cast<unsigned>(ingest.nodes().size()));
  unsigned i = 0;
  for (const auto& [name, node] : ingest.nodes()) {
    auto n = nodes[i++];
    n.setNode(name);
    n.setConnected(node.last_contact_ns != 0 && now - node.last_contact_ns < ctx.liveness_ns);
    n.setLastContactNs(node.last_contact_ns);
    n.setAgentVersion(node.agent_version);
    n.setInstanceId(node.instance);
    n.setBatches(node.batches);
    n.setRecords(node.records);
    proto::write_drops(node.drops, n.initDrops());
    n.setClockOffsetNs(node.clock.offset_ns());
    n.setClockUncertaintyNs(node.clock.uncertainty_ns());
    n.setClockSamples(node.clock.samples());
    n.setTracedProcesses(node.traced_processes);
    n.setWallClockSkewNs(node.wall_offset_ns - node.clock.offset_ns());
    n.setClockRefinementNs(node.clock.refinement_ns());
    n.setClockViolations(node.clock_violations);
    n.setClockDriftPpb(static_cast<int64_t>(node.clock.drift_ppb()));
    n.setBadMessages(node.bad_messages);
    n.setThrottledMessages(node.throttled_messages);
    n.setRefusedClaims(node.refused_claims);
  }
}

// `members`: the fleet as last read (empty: this collector is alone).
void fill_comm(const Ingest& ingest, const CommState& comm, const std::vector<fleet::Member>& members,
               query::CommInfo::Builder out) {
  out.setCommHash(comm.hash);
  if (const fleet::Member* owner = fleet::owner(fleet::placement_key(comm.job, comm.hash), members))
    out.setOwner(owner->id);
  out.setNranks(comm.nranks);
  out.setOrigin(to_wire(comm.origin));
  auto ranks = out.initRanks(static_cast<unsigned>(comm.members.size()));
  unsigned i = 0;
  for (const auto& [rank, m] : comm.members) {
    auto r = ranks[i++];
    r.setRank(m.rank);
    r.setNode(m.node);
    r.setPid(m.pid);
    r.setRecords(m.records);
    r.setLastSeq(m.last_seq);
    r.setLastIssueNs(m.last_issue_ns);
    r.setAnnouncedRank(m.announced_rank);
    r.setParentRank(m.parent_rank);
    r.setSplitKey(m.split_key);
    if (const ProcessInfo* process = ingest.process(m.node, m.pid)) {
      r.setGpu(process->gpu());
      r.setUser(process->user);
      r.setAccount(process->account);
      r.setSlurmStep(process->slurm_step);
      r.setPodUid(process->pod_uid);
      r.setPodNamespace(process->pod_namespace);
      r.setPodName(process->pod_name);
      r.setContainerId(process->container_id);
      r.setLauncherRank(process->rank);
      r.setLocalRank(process->local_rank);
      r.setWorldSize(process->world_size);
    }
  }
}

void answer_jobs(const QueryContext& ctx, query::JobsReply::Builder out) {
  std::map<std::string, std::vector<const CommState*>> jobs;
  for (const auto& [hash, comm] : ctx.ingest.comms()) jobs[comm.job.empty() ? "(unknown)" : comm.job].push_back(&comm);
  auto list = out.initJobs(static_cast<unsigned>(jobs.size()));
  const std::vector<fleet::Member> members = ctx.fleet ? ctx.fleet->view().members : std::vector<fleet::Member>{};
  unsigned i = 0;
  for (const auto& [name, comms] : jobs) {
    auto job = list[i++];
    job.setJob(name);
    uint64_t first = UINT64_MAX, last = 0;
    auto out_comms = job.initComms(static_cast<unsigned>(comms.size()));
    for (unsigned k = 0; k < comms.size(); ++k) {
      first = std::min(first, comms[k]->first_ns);
      last = std::max(last, comms[k]->last_ns);
      fill_comm(ctx.ingest, *comms[k], members, out_comms[k]);
    }
    job.setFirstNs(first == UINT64_MAX ? 0 : first);
    job.setLastNs(last);
  }
}

void answer_fleet(const QueryContext& ctx, query::FleetReply::Builder out) {
  if (!ctx.fleet) return;  // alone
  fleet::FleetView view = ctx.fleet->view();
  out.setSelf(view.self);
  out.setEtcd(ctx.fleet->etcd_endpoints());
  out.setEtcdOk(view.etcd_ok);
  out.setEtcdError(view.etcd_error);
  out.setReadNs(view.read_ns);
  out.setRegistrations(view.registrations);
  out.setLeaseTtlS(static_cast<uint32_t>(ctx.fleet->lease_ttl_s()));
  auto members = out.initMembers(static_cast<unsigned>(view.members.size()));
  for (unsigned i = 0; i < view.members.size(); ++i) {
    const fleet::Member& m = view.members[i];
    auto member = members[i];
    member.setId(m.id);
    member.setAgents(m.agents);
    member.setQueries(m.queries);
    member.setMetrics(m.metrics);
    member.setPublicKey(m.public_key);
    member.setVersion(m.version);
    member.setStartedNs(m.started_ns);
  }
}

// Finds the communicator whose hash in hex starts with `prefix`.
Result<const CommState*> resolve_comm(const Ingest& ingest, const std::string& prefix) {
  if (prefix.empty() || prefix.size() > 16 || prefix.find_first_not_of("0123456789abcdef") != std::string::npos)
    return make_error(Errc::invalid_argument, "--comm takes a communicator hash in lower-case hex (see `rankscope jobs`)");
  const CommState* found = nullptr;
  for (const auto& [hash, comm] : ingest.comms()) {
    if (hex64(hash).rfind(prefix, 0) != 0) continue;
    if (found) return make_error(Errc::invalid_argument, "communicator prefix " + prefix + " is ambiguous; give more digits");
    found = &comm;
  }
  if (!found) return make_error(Errc::not_found, "no communicator " + prefix + " (see `rankscope jobs`)");
  return found;
}

Result<void> answer_timeline(const QueryContext& ctx, query::TimelineQuery::Reader q, query::TimelineReply::Builder out) {
  // A live communicator, else a retired one (a finished job's) from the database.
  auto comm = resolve_comm(ctx.ingest, q.getComm());
  std::optional<CommState> retired;
  if (!comm && comm.error().code == Errc::not_found) {
    auto stored = ctx.ingest.retired_comm(q.getComm());
    if (!stored) return stored.error();
    retired = std::move(*stored);
  } else if (!comm) {
    return comm.error();
  }
  const CommState& c = retired ? *retired : **comm;
  // The collector answers between batches: a reply is bounded, so that a
  // query over every call of a big job neither stalls ingest for long nor
  // builds a message the client cannot read. Each (rank, lane) then gives its
  // last `per_tail`, and the reply says so.
  uint64_t tails = 0;
  for (const auto& [rank, member] : c.members)
    if (q.getRank() < 0 || rank == q.getRank()) tails += c.lanes.size();
  uint32_t per_tail = q.getLast();
  uint32_t limited_to = 0;
  if (tails > 0) {
    const uint64_t fair = std::max<uint64_t>(1, kMaxTimelineRecords / tails);
    if (per_tail == 0 || per_tail > fair) {
      // Fewer only if the stored records would really pass the bound.
      uint64_t stored = 0;
      for (const auto& [rank, member] : c.members)
        if (q.getRank() < 0 || rank == q.getRank())
          stored += per_tail == 0 ? member.records : std::min<uint64_t>(member.records, per_tail * c.lanes.size());
      if (stored > kMaxTimelineRecords) per_tail = limited_to = static_cast<uint32_t>(fair);
    }
  }
  std::vector<StoredRecord> records;
  for (const auto& [rank, member] : c.members) {
    if (q.getRank() >= 0 && rank != q.getRank()) continue;
    for (uint32_t lane : c.lanes) {
      auto tail = ctx.store.tail(c.hash, lane, rank, per_tail);
      if (!tail) return tail.error();
      records.insert(records.end(), tail->begin(), tail->end());
    }
  }
  out.setLimitedTo(limited_to);
  std::sort(records.begin(), records.end(), [](const StoredRecord& a, const StoredRecord& b) {
    return std::tie(a.key.lane, a.key.seq, a.key.rank) < std::tie(b.key.lane, b.key.seq, b.key.rank);
  });
  out.setCommHash(c.hash);
  out.setJob(c.job);
  out.setNranks(c.nranks);
  auto list = out.initRecords(static_cast<unsigned>(records.size()));
  for (unsigned i = 0; i < records.size(); ++i) {
    const StoredRecord& r = records[i];
    auto o = list[i];
    o.setRank(r.key.rank);
    o.setLane(r.key.lane);
    o.setSeq(r.key.seq);
    o.setOp(r.call.op);
    o.setDatatype(r.call.datatype);
    o.setRedop(r.call.redop);
    o.setPeer(r.call.peer);
    o.setCount(r.call.count);
    o.setBytes(proto::record_bytes(r.call));
    o.setIssueNs(r.call.issue_ns);
    o.setReturnNs(r.call.return_ns);
    o.setResult(r.call.result);
    o.setFlags(r.call.flags);
    auto member = c.members.find(r.key.rank);
    if (member != c.members.end()) o.setNode(member->second.node);
    o.setPid(r.pid);
  }
  return {};
}
Result<void> answer_findings(const QueryContext& ctx, query::FindingsQuery::Reader q, query::FindingsReply::Builder out) {
  FindingKind kind{};
  std::string kind_name = q.getKind();
  if (!kind_name.empty() && !parse_finding_kind(kind_name, kind))
    return make_error(Errc::invalid_argument, "--kind must be hang, mismatch, straggler, node_lost or slow_link, not '" + kind_name + "'");
  std::vector<const Finding*> selected;
  for (const Finding* f : q.getOpenOnly() ? ctx.findings.open() : ctx.findings.all()) {
    if (!kind_name.empty() && f->kind != kind) continue;
    if (selected.size() >= q.getLimit()) break;
    selected.push_back(f);
  }
  out.setNowNs(ctx.clock.realtime_ns());
  auto list = out.initFindings(static_cast<unsigned>(selected.size()));
  for (unsigned i = 0; i < selected.size(); ++i) fill_finding(*selected[i], list[i]);
  return {};
}
}  // namespace

std::string answer_query(std::string_view request, const QueryContext& ctx, const std::string& client) {
  capnp::MallocMessageBuilder builder;
  auto reply = builder.initRoot<query::Reply>();
  auto read = proto::read_packed<query::Request>(request, proto::ReadLimits{1 << 20, 1 << 16, 8}, [&](auto req) {
    if (req.getProtocolVersion() > query::QUERY_PROTOCOL_VERSION) {
      reply.setError("query protocol version " + std::to_string(req.getProtocolVersion()) +
                     " is newer than this collector's (" + std::to_string(query::QUERY_PROTOCOL_VERSION) + ")");
      return;
    }
    switch (req.which()) {
      case query::Request::STATUS: answer_status(ctx, reply.initStatus()); break;
      case query::Request::JOBS: answer_jobs(ctx, reply.initJobs()); break;
      case query::Request::FLEET:
        answer_fleet(ctx, reply.initFleet());
        break;
      case query::Request::TIMELINE: {
        // Built aside so that an error leaves no half-filled union member.
        capnp::MallocMessageBuilder scratch;
        auto timeline = scratch.initRoot<query::TimelineReply>();
        auto result = answer_timeline(ctx, req.getTimeline(), timeline);
        if (result)
          reply.setTimeline(timeline.asReader());
        else
          reply.setError(result.error().message);
        break;
      }
      case query::Request::FINDINGS: {
        capnp::MallocMessageBuilder scratch;
        auto findings = scratch.initRoot<query::FindingsReply>();
        auto result = answer_findings(ctx, req.getFindings(), findings);
        if (result)
          reply.setFindings(findings.asReader());
        else
          reply.setError(result.error().message);
        break;
      }
      case query::Request::REPORT: {
        capnp::MallocMessageBuilder scratch;
        auto report = scratch.initRoot<query::ReportReply>();
        auto result = answer_report(ctx.store, ctx.findings, ctx.clock.realtime_ns(), req.getReport(), report);
        if (result)
          reply.setReport(report.asReader());
        else
          reply.setError(result.error().message);
        break;
      }
      case query::Request::ACK: {
        auto ack = req.getAck();
        const std::string self = ctx.fleet ? ctx.fleet->view().self : "";
        if (ack.getCollector().size() > 0 && ack.getCollector() != self) {
          reply.setError("finding ids are per collector: this is " +
                         (self.empty() ? std::string("a collector alone") : "collector " + self) + ", not " +
                         std::string(ack.getCollector()) + "; nothing acknowledged");
          break;
        }
        std::string by = valid_utf8(std::string(ack.getBy()).substr(0, 256));
        if (by.empty()) by = "unnamed";
        by += client.empty() ? " (no key: --insecure)" : " (key " + client + ")";
        auto acknowledged = ctx.findings.acknowledge(ack.getId(), by, ctx.clock.realtime_ns());
        if (acknowledged)
          fill_finding(*acknowledged, reply.initAck());
        else
          reply.setError(acknowledged.error().message);
        break;
      }
      default: reply.setError("this collector does not know that request; upgrade it"); break;
    }
  });
  if (!read) reply.setError("bad request: " + read.error().message);
  return proto::to_packed(builder);
}

}  // namespace rankscope::collector
