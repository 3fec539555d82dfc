#include "proto/codec.h"

#include <kj/io.h>

#include <algorithm>
#include <limits>

namespace rankscope::proto {

namespace {
// Writes `values` into a list only if one of them is non-zero: an empty list
// means "all zero" and costs nothing on the wire.
template <typename Value, typename InitList>
void put_column(const std::vector<Value>& values, InitList init) {
  bool any = false;
  for (Value v : values) any |= (v != 0);
  if (!any) return;
  auto list = init(static_cast<unsigned>(values.size()));
  for (unsigned i = 0; i < values.size(); ++i) list.set(i, values[i]);
}

template <typename Value, typename ListReader>
Result<std::vector<Value>> get_column(ListReader list, uint32_t count, const char* name) {
  std::vector<Value> values(count, 0);
  if (list.size() == 0) return values;
  if (list.size() != count)
    return make_error(Errc::protocol, std::string("column ") + name + " has " + std::to_string(list.size()) +
                                          " entries, expected " + std::to_string(count));
  for (uint32_t i = 0; i < count; ++i) values[i] = list[i];
  return values;
}
}  // namespace

namespace {
uint32_t pack_code(const CallRecord& r, uint8_t flags) {
  return static_cast<uint32_t>(r.op) | static_cast<uint32_t>(r.datatype) << 8 | static_cast<uint32_t>(r.redop) << 16 |
         static_cast<uint32_t>(flags) << 24;
}

void encode_block(const ColumnBlock& block, uint32_t comm_index, uint64_t base_ns,
                  wire::CollectiveColumns::Builder out) {
  const auto& records = block.records;
  size_t n = records.size();
  out.setPid(block.pid);
  out.setComm(comm_index);
  out.setRank(block.rank);
  out.setLane(block.lane);
  out.setCount(static_cast<uint32_t>(n));
  out.setSource(wire::TimingSource::HOST_ISSUE);
  if (n == 0) return;
  out.setFirstSeq(records[0].seq);
  out.setBaseOffsetNs(static_cast<int64_t>(records[0].issue_ns - base_ns));

  std::vector<uint32_t> seq_gap(n), duration(n), code(n);
  std::vector<uint64_t> issue_delta(n);
  std::vector<uint8_t> result(n);
  std::vector<int64_t> count_delta(n);
  std::vector<int32_t> peer(n);
  CallRecord prev{};
  prev.seq = records[0].seq - 1;  // so that the first gap is 0
  prev.issue_ns = records[0].issue_ns;
  // The header carries the first record's code and count, so that a block of
  // identical calls has all-zero (empty) code and count columns.
  uint32_t prev_code = pack_code(records[0], records[0].flags);
  prev.count = records[0].count;
  out.setFirstCode(prev_code);
  out.setFirstCount(prev.count);
  for (size_t i = 0; i < n; ++i) {
    const CallRecord& r = records[i];
    seq_gap[i] = static_cast<uint32_t>(r.seq - prev.seq - 1);
    issue_delta[i] = r.issue_ns - prev.issue_ns;
    uint64_t d = r.return_ns >= r.issue_ns ? r.return_ns - r.issue_ns : 0;
    uint8_t flags = r.flags;
    if (d > std::numeric_limits<uint32_t>::max()) {
      d = std::numeric_limits<uint32_t>::max();
      flags |= RS_CALL_DURATION_SAT;
    }
    duration[i] = static_cast<uint32_t>(d);
    uint32_t c = pack_code(r, flags);
    code[i] = c ^ prev_code;
    prev_code = c;
    count_delta[i] = static_cast<int64_t>(r.count - prev.count);
    peer[i] = r.peer ^ prev.peer;
    result[i] = r.result;
    prev = r;
  }
  put_column(seq_gap, [&](unsigned k) { return out.initSeqGap(k); });
  put_column(issue_delta, [&](unsigned k) { return out.initIssueDeltaNs(k); });
  put_column(duration, [&](unsigned k) { return out.initDurationNs(k); });
  put_column(code, [&](unsigned k) { return out.initCode(k); });
  put_column(count_delta, [&](unsigned k) { return out.initCountDelta(k); });
  put_column(peer, [&](unsigned k) { return out.initPeer(k); });
  put_column(result, [&](unsigned k) { return out.initResult(k); });
}
void encode_gpu_block(const GpuBlock& block, uint32_t comm_index, uint64_t base_ns, wire::GpuColumns::Builder out) {
  const auto& records = block.records;
  const size_t n = records.size();
  out.setPid(block.pid);
  out.setComm(comm_index);
  out.setRank(block.rank);
  out.setOp(block.op);
  out.setCount(static_cast<uint32_t>(n));
  if (n == 0) return;
  out.setFirstSeq(records[0].seq);
  out.setBaseOffsetNs(static_cast<int64_t>(records[0].enqueued_ns - base_ns));
  std::vector<uint32_t> seq_gap(n);
  std::vector<int64_t> enqueue_delta(n), start(n);
  std::vector<uint64_t> kernel(n), elements(n), link_wait(n);
  std::vector<uint32_t> link_peer(n);
  GpuRecord prev{};
  prev.seq = records[0].seq - 1;
  prev.enqueued_ns = records[0].enqueued_ns;
  for (size_t i = 0; i < n; ++i) {
    const GpuRecord& r = records[i];
    seq_gap[i] = static_cast<uint32_t>(r.seq - prev.seq - 1);
    enqueue_delta[i] = static_cast<int64_t>(r.enqueued_ns - prev.enqueued_ns);
    start[i] = static_cast<int64_t>(r.kernel_start_ns - r.enqueued_ns);
    kernel[i] = r.kernel_end_ns >= r.kernel_start_ns ? r.kernel_end_ns - r.kernel_start_ns : 0;
    elements[i] = r.count ^ prev.count;
    if (r.link_peer >= 0 && r.link_wait_ns > 0) {
      link_peer[i] = static_cast<uint32_t>(r.link_peer) + 1;
      link_wait[i] = r.link_wait_ns;
    }
    prev = r;
  }
  put_column(seq_gap, [&](unsigned k) { return out.initSeqGap(k); });
  put_column(enqueue_delta, [&](unsigned k) { return out.initEnqueueDeltaNs(k); });
  put_column(start, [&](unsigned k) { return out.initStartNs(k); });
  put_column(kernel, [&](unsigned k) { return out.initKernelNs(k); });
  put_column(elements, [&](unsigned k) { return out.initElements(k); });
  put_column(link_peer, [&](unsigned k) { return out.initLinkPeer(k); });
  put_column(link_wait, [&](unsigned k) { return out.initLinkWaitNs(k); });
}
}  // namespace

void encode_collectives(const std::vector<const ColumnBlock*>& blocks, wire::Batch::Builder batch,
                        const std::vector<const GpuBlock*>& gpu) {
  uint64_t base_ns = UINT64_MAX;
  std::vector<uint64_t> table;
  auto index_of = [&](uint64_t hash) {
    auto it = std::find(table.begin(), table.end(), hash);
    if (it == table.end()) table.push_back(hash);
    return static_cast<uint32_t>(std::find(table.begin(), table.end(), hash) - table.begin());
  };
  std::vector<uint32_t> index(blocks.size()), gpu_index(gpu.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!blocks[i]->records.empty()) base_ns = std::min(base_ns, blocks[i]->records[0].issue_ns);
    index[i] = index_of(blocks[i]->comm_hash);
  }
  for (size_t i = 0; i < gpu.size(); ++i) {
    for (const auto& r : gpu[i]->records) base_ns = std::min(base_ns, r.enqueued_ns);
    gpu_index[i] = index_of(gpu[i]->comm_hash);
  }
  if (base_ns == UINT64_MAX) base_ns = 0;
  batch.setBaseNs(base_ns);
  auto comm_table = batch.initCommTable(static_cast<unsigned>(table.size()));
  for (unsigned i = 0; i < table.size(); ++i) comm_table.set(i, table[i]);
  auto columns = batch.initCollectives(static_cast<unsigned>(blocks.size()));
  for (size_t i = 0; i < blocks.size(); ++i) encode_block(*blocks[i], index[i], base_ns, columns[i]);
  if (gpu.empty()) return;
  auto gpu_columns = batch.initGpuCollectives(static_cast<unsigned>(gpu.size()));
  for (size_t i = 0; i < gpu.size(); ++i) encode_gpu_block(*gpu[i], gpu_index[i], base_ns, gpu_columns[i]);
}

Result<ColumnBlock> decode_columns(wire::CollectiveColumns::Reader in, const BatchFrame& frame) {
  constexpr uint32_t kMaxRecords = 1u << 20;
  uint32_t n = in.getCount();
  if (n > kMaxRecords)
    return make_error(Errc::protocol, "column block claims " + std::to_string(n) + " records (limit " +
                                          std::to_string(kMaxRecords) + ")");
  const auto& table = frame.table;
  if (in.getComm() >= table.size())
    return make_error(Errc::protocol, "column block refers to communicator #" + std::to_string(in.getComm()) +
                                          " of a table of " + std::to_string(table.size()));
  ColumnBlock block;
  block.pid = in.getPid();
  block.comm_hash = table[in.getComm()];
  block.rank = in.getRank();
  block.lane = in.getLane();

  auto seq_gap = get_column<uint32_t>(in.getSeqGap(), n, "seqGap");
  auto issue_delta = get_column<uint64_t>(in.getIssueDeltaNs(), n, "issueDeltaNs");
  auto duration = get_column<uint32_t>(in.getDurationNs(), n, "durationNs");
  auto code = get_column<uint32_t>(in.getCode(), n, "code");
  auto count_delta = get_column<int64_t>(in.getCountDelta(), n, "countDelta");
  auto peer = get_column<int32_t>(in.getPeer(), n, "peer");
  auto result = get_column<uint8_t>(in.getResult(), n, "result");
  for (const Error* e : {seq_gap.ok() ? nullptr : &seq_gap.error(), issue_delta.ok() ? nullptr : &issue_delta.error(),
                         duration.ok() ? nullptr : &duration.error(), code.ok() ? nullptr : &code.error(),
                         count_delta.ok() ? nullptr : &count_delta.error(), peer.ok() ? nullptr : &peer.error(),
                         result.ok() ? nullptr : &result.error()}) {
    if (e) return *e;
  }

  block.records.resize(n);
  CallRecord prev{};
  prev.seq = in.getFirstSeq() - 1;
  prev.issue_ns = frame.base_ns + static_cast<uint64_t>(in.getBaseOffsetNs());
  prev.count = in.getFirstCount();
  uint32_t prev_code = in.getFirstCode();
  for (uint32_t i = 0; i < n; ++i) {
    CallRecord& r = block.records[i];
    // Overflow checked before it happens. The first record's predecessor is
    // firstSeq - 1, which wraps to 2^64-1 for firstSeq 0: only from the second
    // record on may the previous sequence number not be the largest.
    const uint64_t gap = seq_gap.value()[i];
    const uint64_t next = prev.seq + 1;  // 0 after the wrap of a first record only
    if ((i > 0 && prev.seq == UINT64_MAX) || gap > UINT64_MAX - next || issue_delta.value()[i] > UINT64_MAX - prev.issue_ns ||
        duration.value()[i] > UINT64_MAX - (prev.issue_ns + issue_delta.value()[i]))
      return make_error(Errc::protocol, "sequence or time overflows in record " + std::to_string(i));
    uint64_t seq = next + gap;
    uint64_t issue = prev.issue_ns + issue_delta.value()[i];
    uint32_t c = code.value()[i] ^ prev_code;
    prev_code = c;
    r.seq = seq;
    r.issue_ns = issue;
    r.return_ns = issue + duration.value()[i];
    r.op = static_cast<uint8_t>(c);
    r.datatype = static_cast<uint8_t>(c >> 8);
    r.redop = static_cast<uint8_t>(c >> 16);
    r.flags = static_cast<uint8_t>(c >> 24);
    r.count = prev.count + static_cast<uint64_t>(count_delta.value()[i]);
    r.peer = peer.value()[i] ^ prev.peer;
    r.result = result.value()[i];
    prev = r;
  }
  return block;
}

void encode_waits(const std::vector<WaitBlock>& blocks, wire::Batch::Builder batch) {
  if (batch.getBaseNs() == 0) {
    uint64_t base = UINT64_MAX;
    for (const auto& block : blocks)
      if (!block.waits.empty()) base = std::min(base, block.waits.front().start_ns);
    if (base != UINT64_MAX) batch.setBaseNs(base);
  }
  uint64_t base_ns = batch.getBaseNs();
  auto list = batch.initWaits(static_cast<unsigned>(blocks.size()));
  for (unsigned b = 0; b < blocks.size(); ++b) {
    const auto& waits = blocks[b].waits;
    auto out = list[b];
    out.setPid(blocks[b].pid);
    out.setTid(blocks[b].tid);
    out.setCount(static_cast<uint32_t>(waits.size()));
    if (waits.empty()) continue;
    size_t n = waits.size();
    out.setBaseOffsetNs(static_cast<int64_t>(waits[0].start_ns - base_ns));
    out.setFirstKind(waits[0].kind);
    out.setFirstObject(waits[0].object);
    std::vector<uint64_t> gap(n), duration(n), object(n);
    std::vector<uint8_t> kind(n);
    std::vector<int32_t> result(n);
    WaitRecord prev = waits[0];
    prev.end_ns = waits[0].start_ns;
    for (size_t i = 0; i < n; ++i) {
      const WaitRecord& w = waits[i];
      gap[i] = w.start_ns >= prev.end_ns ? w.start_ns - prev.end_ns : 0;
      duration[i] = w.end_ns >= w.start_ns ? w.end_ns - w.start_ns : 0;
      kind[i] = w.kind ^ prev.kind;
      object[i] = w.object ^ prev.object;
      result[i] = w.result;
      prev = w;
    }
    put_column(gap, [&](unsigned k) { return out.initGapNs(k); });
    put_column(duration, [&](unsigned k) { return out.initDurationNs(k); });
    put_column(kind, [&](unsigned k) { return out.initKind(k); });
    put_column(object, [&](unsigned k) { return out.initObject(k); });
    put_column(result, [&](unsigned k) { return out.initResult(k); });
  }
}

Result<GpuBlock> decode_gpu(wire::GpuColumns::Reader in, const BatchFrame& frame) {
  constexpr uint32_t kMaxRecords = 1u << 20;
  const uint32_t n = in.getCount();
  if (n > kMaxRecords)
    return make_error(Errc::protocol, "GPU block claims " + std::to_string(n) + " records (limit " +
                                          std::to_string(kMaxRecords) + ")");
  if (in.getComm() >= frame.table.size())
    return make_error(Errc::protocol, "GPU block refers to communicator #" + std::to_string(in.getComm()) +
                                          " of a table of " + std::to_string(frame.table.size()));
  auto seq_gap = get_column<uint32_t>(in.getSeqGap(), n, "seqGap");
  auto enqueue_delta = get_column<int64_t>(in.getEnqueueDeltaNs(), n, "enqueueDeltaNs");
  auto start = get_column<int64_t>(in.getStartNs(), n, "startNs");
  auto kernel = get_column<uint64_t>(in.getKernelNs(), n, "kernelNs");
  auto elements = get_column<uint64_t>(in.getElements(), n, "elements");
  auto link_peer = get_column<uint32_t>(in.getLinkPeer(), n, "linkPeer");
  auto link_wait = get_column<uint64_t>(in.getLinkWaitNs(), n, "linkWaitNs");
  for (const Error* e : {seq_gap.ok() ? nullptr : &seq_gap.error(), enqueue_delta.ok() ? nullptr : &enqueue_delta.error(),
                         start.ok() ? nullptr : &start.error(), kernel.ok() ? nullptr : &kernel.error(),
                         elements.ok() ? nullptr : &elements.error(), link_peer.ok() ? nullptr : &link_peer.error(),
                         link_wait.ok() ? nullptr : &link_wait.error()}) {
    if (e) return *e;
  }
  GpuBlock block;
  block.pid = in.getPid();
  block.comm_hash = frame.table[in.getComm()];
  block.rank = in.getRank();
  block.op = in.getOp();
  block.records.resize(n);
  // Every time is checked to stay within [0, 2^62): a hostile delta cannot wrap one.
  constexpr int64_t kMaxNs = int64_t{1} << 62;
  auto add = [](int64_t a, int64_t b, int64_t& out) { return !__builtin_add_overflow(a, b, &out) && out >= 0 && out < kMaxNs; };
  int64_t enqueued = 0;
  if (frame.base_ns >= static_cast<uint64_t>(kMaxNs) ||
      !add(static_cast<int64_t>(frame.base_ns), in.getBaseOffsetNs(), enqueued))
    return make_error(Errc::protocol, "GPU block's base time is out of range");
  uint64_t prev_seq = in.getFirstSeq() - 1, prev_count = 0;
  for (uint32_t i = 0; i < n; ++i) {
    GpuRecord& r = block.records[i];
    int64_t kernel_start = 0, kernel_end = 0;
    if (!add(enqueued, enqueue_delta.value()[i], enqueued))
      return make_error(Errc::protocol, "GPU times overflow in record " + std::to_string(i));
    if (!add(enqueued, start.value()[i], kernel_start) ||
        kernel.value()[i] >= static_cast<uint64_t>(kMaxNs) ||
        !add(kernel_start, static_cast<int64_t>(kernel.value()[i]), kernel_end))
      return make_error(Errc::protocol, "GPU times overflow in record " + std::to_string(i));
    r.seq = prev_seq + 1 + seq_gap.value()[i];
    if (r.seq <= prev_seq && !(i == 0 && in.getFirstSeq() == 0))
      return make_error(Errc::protocol, "GPU sequence numbers overflow in record " + std::to_string(i));
    r.count = elements.value()[i] ^ prev_count;
    r.enqueued_ns = static_cast<uint64_t>(enqueued);
    r.kernel_start_ns = static_cast<uint64_t>(kernel_start);
    r.kernel_end_ns = static_cast<uint64_t>(kernel_end);
    // A peer is a rank (checked against the communicator's size by its reader).
    const uint32_t peer = link_peer.value()[i];
    const uint64_t wait = link_wait.value()[i];
    if ((peer == 0) != (wait == 0) || peer > static_cast<uint32_t>(std::numeric_limits<int32_t>::max()) ||
        wait >= static_cast<uint64_t>(kMaxNs))
      return make_error(Errc::protocol, "GPU record " + std::to_string(i) + " has a link wait out of range");
    if (peer > 0) {
      r.link_peer = static_cast<int32_t>(peer - 1);
      r.link_wait_ns = wait;
    }
    prev_seq = r.seq;
    prev_count = r.count;
  }
  return block;
}

Result<WaitBlock> decode_waits(wire::WaitColumns::Reader in, const BatchFrame& frame) {
  constexpr uint32_t kMaxWaits = 1u << 20;
  uint32_t n = in.getCount();
  if (n > kMaxWaits) return make_error(Errc::protocol, "wait block claims " + std::to_string(n) + " waits");
  auto gap = get_column<uint64_t>(in.getGapNs(), n, "gapNs");
  auto duration = get_column<uint64_t>(in.getDurationNs(), n, "durationNs");
  auto kind = get_column<uint8_t>(in.getKind(), n, "kind");
  auto object = get_column<uint64_t>(in.getObject(), n, "object");
  auto result = get_column<int32_t>(in.getResult(), n, "result");
  for (const Error* e : {gap.ok() ? nullptr : &gap.error(), duration.ok() ? nullptr : &duration.error(),
                         kind.ok() ? nullptr : &kind.error(), object.ok() ? nullptr : &object.error(),
                         result.ok() ? nullptr : &result.error()}) {
    if (e) return *e;
  }
  WaitBlock block;
  block.pid = in.getPid();
  block.tid = in.getTid();
  block.waits.resize(n);
  WaitRecord prev;
  prev.kind = in.getFirstKind();
  prev.object = in.getFirstObject();
  prev.end_ns = frame.base_ns + static_cast<uint64_t>(in.getBaseOffsetNs());
  for (uint32_t i = 0; i < n; ++i) {
    WaitRecord& w = block.waits[i];
    w.start_ns = prev.end_ns + gap.value()[i];
    w.end_ns = w.start_ns + duration.value()[i];
    if (w.start_ns < prev.end_ns || w.end_ns < w.start_ns)
      return make_error(Errc::protocol, "wait times overflow in wait " + std::to_string(i));
    w.kind = kind.value()[i] ^ prev.kind;
    w.object = object.value()[i] ^ prev.object;
    w.result = result.value()[i];
    prev = w;
  }
  return block;
}

std::string to_packed(capnp::MessageBuilder& message) {
  kj::VectorOutputStream output;
  capnp::writePackedMessage(output, message);
  auto bytes = output.getArray();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

}  // namespace rankscope::proto
