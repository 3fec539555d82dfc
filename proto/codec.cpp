#include "proto/codec.h"

#include <kj/io.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <unordered_map>

#include "proto/limits.h"

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

// The first error among `results` (in order), or null.
template <typename... Results>
const Error* first_error(const Results&... results) {
  const Error* first = nullptr;
  ((first = first ? first : results.ok() ? nullptr : &results.error()), ...);
  return first;
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

// The record columns of one block (CollectiveColumns), or of a table's
// blocks one after another (CollectiveTable).
struct RecordColumns {
  std::vector<uint32_t> seq_gap, duration, code;
  std::vector<uint64_t> issue_delta;
  std::vector<uint8_t> result;
  std::vector<int64_t> count_delta;
  std::vector<int32_t> peer;
  size_t size() const { return seq_gap.size(); }
  void resize(size_t n) {
    for (auto* c : {&seq_gap, &duration, &code}) c->resize(n);
    issue_delta.resize(n);
    result.resize(n);
    count_delta.resize(n);
    peer.resize(n);
  }
  template <typename Builder>
  void put(Builder out) const {
    put_column(seq_gap, [&](unsigned k) { return out.initSeqGap(k); });
    put_column(issue_delta, [&](unsigned k) { return out.initIssueDeltaNs(k); });
    put_column(duration, [&](unsigned k) { return out.initDurationNs(k); });
    put_column(code, [&](unsigned k) { return out.initCode(k); });
    put_column(count_delta, [&](unsigned k) { return out.initCountDelta(k); });
    put_column(peer, [&](unsigned k) { return out.initPeer(k); });
    put_column(result, [&](unsigned k) { return out.initResult(k); });
  }
  // Reads every column of `in` (a CollectiveColumns or CollectiveTable), each
  // empty or `n` long.
  template <typename Reader>
  Result<void> get(Reader in, uint32_t n) {
    auto a = get_column<uint32_t>(in.getSeqGap(), n, "seqGap");
    auto b = get_column<uint64_t>(in.getIssueDeltaNs(), n, "issueDeltaNs");
    auto c = get_column<uint32_t>(in.getDurationNs(), n, "durationNs");
    auto d = get_column<uint32_t>(in.getCode(), n, "code");
    auto e = get_column<int64_t>(in.getCountDelta(), n, "countDelta");
    auto f = get_column<int32_t>(in.getPeer(), n, "peer");
    auto g = get_column<uint8_t>(in.getResult(), n, "result");
    if (const Error* error = first_error(a, b, c, d, e, f, g)) return *error;
    seq_gap = std::move(*a), issue_delta = std::move(*b), duration = std::move(*c), code = std::move(*d);
    count_delta = std::move(*e), peer = std::move(*f), result = std::move(*g);
    return {};
  }
};

// What a block's header says of its first record (its code and count are
// "previous" to it, so that a block of identical calls has all-zero code
// and count columns).
struct FirstRecord {
  uint64_t seq = 0;
  uint64_t issue_ns = 0;
  uint32_t code = 0;
  uint64_t count = 0;
  // The peer "previous" to the first record's (not on the wire: a block's
  // says -1, a row's its lane's).
  int32_t peer = -1;
};

// The peer a table row's first record is coded against: a point-to-point
// lane's peer (lane = 1 + 2 * peer + isRecv), none for collectives.
int32_t lane_peer(uint32_t lane) {
  return lane == 0 ? -1 : static_cast<int32_t>((lane - 1) / 2);
}

// Codes `records` into `out` from row `at` on, the first record's peer
// against `peer`.
FirstRecord code_records(const std::vector<CallRecord>& records, RecordColumns& out, size_t at, int32_t peer = -1) {
  FirstRecord first;
  if (records.empty()) return first;
  first = {records[0].seq, records[0].issue_ns, pack_code(records[0], records[0].flags), records[0].count, peer};
  CallRecord prev{};
  prev.seq = first.seq - 1;  // so that the first gap is 0
  prev.issue_ns = first.issue_ns;
  prev.count = first.count;
  prev.peer = peer;
  uint32_t prev_code = first.code;
  for (size_t i = 0; i < records.size(); ++i, ++at) {
    const CallRecord& r = records[i];
    out.seq_gap[at] = static_cast<uint32_t>(r.seq - prev.seq - 1);
    out.issue_delta[at] = r.issue_ns - prev.issue_ns;
    uint64_t d = r.return_ns >= r.issue_ns ? r.return_ns - r.issue_ns : 0;
    uint8_t flags = r.flags;
    if (d > std::numeric_limits<uint32_t>::max()) {
      d = std::numeric_limits<uint32_t>::max();
      flags |= RS_CALL_DURATION_SAT;
    }
    out.duration[at] = static_cast<uint32_t>(d);
    uint32_t c = pack_code(r, flags);
    out.code[at] = c ^ prev_code;
    prev_code = c;
    out.count_delta[at] = static_cast<int64_t>(r.count - prev.count);
    out.peer[at] = r.peer ^ prev.peer;
    out.result[at] = r.result;
    prev = r;
  }
  return first;
}

// Decodes `n` records from row `at` of `in` into `out`. Checks that sequence
// numbers and times do not overflow.
Result<void> decode_records(const RecordColumns& in, size_t at, uint32_t n, const FirstRecord& first,
                            std::vector<CallRecord>& out) {
  out.resize(n);
  CallRecord prev{};
  prev.seq = first.seq - 1;
  prev.issue_ns = first.issue_ns;
  prev.count = first.count;
  prev.peer = first.peer;
  uint32_t prev_code = first.code;
  for (uint32_t i = 0; i < n; ++i, ++at) {
    CallRecord& r = out[i];
    // Overflow checked before it happens. The first record's predecessor is
    // firstSeq - 1, which wraps to 2^64-1 for firstSeq 0: only from the second
    // record on may the previous sequence number not be the largest.
    const uint64_t gap = in.seq_gap[at];
    const uint64_t next = prev.seq + 1;  // 0 after the wrap of a first record only
    const uint64_t delta = in.issue_delta[at];
    if ((i > 0 && prev.seq == UINT64_MAX) || gap > UINT64_MAX - next || delta > UINT64_MAX - prev.issue_ns ||
        in.duration[at] > UINT64_MAX - (prev.issue_ns + delta))
      return make_error(Errc::protocol, "sequence or time overflows in record " + std::to_string(i));
    uint64_t issue = prev.issue_ns + delta;
    uint32_t c = in.code[at] ^ prev_code;
    prev_code = c;
    r.seq = next + gap;
    r.issue_ns = issue;
    r.return_ns = issue + in.duration[at];
    r.op = static_cast<uint8_t>(c);
    r.datatype = static_cast<uint8_t>(c >> 8);
    r.redop = static_cast<uint8_t>(c >> 16);
    r.flags = static_cast<uint8_t>(c >> 24);
    r.count = prev.count + static_cast<uint64_t>(in.count_delta[at]);
    r.peer = in.peer[at] ^ prev.peer;
    r.result = in.result[at];
    prev = r;
  }
  return {};
}

void encode_block(const ColumnBlock& block, uint32_t comm_index, uint64_t base_ns,
                  wire::CollectiveColumns::Builder out) {
  const size_t n = block.records.size();
  out.setPid(block.pid);
  out.setComm(comm_index);
  out.setRank(block.rank);
  out.setLane(block.lane);
  out.setCount(static_cast<uint32_t>(n));
  out.setSource(wire::TimingSource::HOST_ISSUE);
  if (n == 0) return;
  RecordColumns columns;
  columns.resize(n);
  const FirstRecord first = code_records(block.records, columns, 0);
  out.setFirstSeq(first.seq);
  out.setBaseOffsetNs(static_cast<int64_t>(first.issue_ns - base_ns));
  out.setFirstCode(first.code);
  out.setFirstCount(first.count);
  columns.put(out);
}

// zigzag: a small difference either way is a small number.
uint32_t zigzag(uint32_t d) {
  return (d << 1) ^ (0u - (d >> 31));
}
uint64_t zigzag(uint64_t d) {
  return (d << 1) ^ (uint64_t{0} - (d >> 63));
}
uint32_t unzigzag(uint32_t z) {
  return (z >> 1) ^ (0u - (z & 1));
}
uint64_t unzigzag(uint64_t z) {
  return (z >> 1) ^ (uint64_t{0} - (z & 1));
}

// The blocks as one CollectiveTable, ordered by (communicator, lane, rank)
// so that the rows of a node's ranks in one communicator are side by side.
void encode_table(const std::vector<const ColumnBlock*>& blocks, const std::vector<uint32_t>& index, uint64_t base_ns,
                  wire::CollectiveTable::Builder out) {
  std::vector<size_t> order;  // a block without records has nothing to say: no row
  for (size_t i = 0; i < blocks.size(); ++i)
    if (!blocks[i]->records.empty()) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tuple(index[a], blocks[a]->lane, blocks[a]->rank, blocks[a]->pid) <
           std::tuple(index[b], blocks[b]->lane, blocks[b]->rank, blocks[b]->pid);
  });
  const size_t rows = order.size();
  std::vector<uint32_t> pid(rows), comm(rows), rank(rows), lane(rows), count(rows), first_code(rows);
  std::vector<uint64_t> first_seq(rows), offset(rows), first_count(rows);
  size_t records = 0;
  for (const ColumnBlock* block : blocks) records += block->records.size();
  RecordColumns columns;
  columns.resize(records);
  FirstRecord prev;
  uint32_t prev_pid = 0, prev_comm = 0, prev_rank = 0, prev_lane = 0, prev_n = 0;
  uint64_t prev_offset = 0;
  size_t at = 0;
  for (size_t row = 0; row < rows; ++row) {
    const ColumnBlock& block = *blocks[order[row]];
    const auto n = static_cast<uint32_t>(block.records.size());
    const FirstRecord first = code_records(block.records, columns, at, lane_peer(block.lane));
    at += n;
    const uint64_t block_offset = first.issue_ns - base_ns;
    pid[row] = block.pid ^ prev_pid;
    comm[row] = index[order[row]] - prev_comm;
    rank[row] = zigzag(static_cast<uint32_t>(block.rank) - prev_rank);
    lane[row] = block.lane ^ prev_lane;
    count[row] = n ^ prev_n;
    first_seq[row] = zigzag(first.seq - prev.seq);
    offset[row] = zigzag(block_offset - prev_offset);
    first_code[row] = first.code ^ prev.code;
    first_count[row] = first.count ^ prev.count;
    prev_pid = block.pid, prev_comm = index[order[row]], prev_rank = static_cast<uint32_t>(block.rank);
    prev_lane = block.lane, prev_n = n, prev_offset = block_offset, prev = first;
  }
  out.setBlocks(static_cast<uint32_t>(rows));
  put_column(pid, [&](unsigned k) { return out.initPid(k); });
  put_column(comm, [&](unsigned k) { return out.initComm(k); });
  put_column(rank, [&](unsigned k) { return out.initRank(k); });
  put_column(lane, [&](unsigned k) { return out.initLane(k); });
  put_column(first_seq, [&](unsigned k) { return out.initFirstSeq(k); });
  put_column(offset, [&](unsigned k) { return out.initBaseOffsetNs(k); });
  put_column(count, [&](unsigned k) { return out.initCount(k); });
  put_column(first_code, [&](unsigned k) { return out.initFirstCode(k); });
  put_column(first_count, [&](unsigned k) { return out.initFirstCount(k); });
  columns.put(out);
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
                        const std::vector<const GpuBlock*>& gpu, BlockLayout layout) {
  uint64_t base_ns = UINT64_MAX;
  std::vector<uint64_t> table;
  std::unordered_map<uint64_t, uint32_t> indices;  // a batch may name 65,536 communicators
  auto index_of = [&](uint64_t hash) {
    auto [it, fresh] = indices.emplace(hash, static_cast<uint32_t>(table.size()));
    if (fresh) table.push_back(hash);
    return it->second;
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
  if (layout == BlockLayout::table && !blocks.empty()) {
    encode_table(blocks, index, base_ns, batch.initCollectiveTable());
  } else if (!blocks.empty()) {
    auto columns = batch.initCollectives(static_cast<unsigned>(blocks.size()));
    for (size_t i = 0; i < blocks.size(); ++i) encode_block(*blocks[i], index[i], base_ns, columns[i]);
  }
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
  RecordColumns columns;
  if (auto read = columns.get(in, n); !read) return read.error();
  const FirstRecord first{in.getFirstSeq(), frame.base_ns + static_cast<uint64_t>(in.getBaseOffsetNs()),
                          in.getFirstCode(), in.getFirstCount()};
  if (auto decoded = decode_records(columns, 0, n, first, block.records); !decoded) return decoded.error();
  return block;
}

std::optional<std::string> batch_without_table(std::string_view bytes) {
  capnp::MallocMessageBuilder message;
  bool rewritten = false;
  auto read = read_packed<wire::AgentMessage>(bytes, ReadLimits{}, [&](wire::AgentMessage::Reader in) {
    if (in.which() != wire::AgentMessage::BATCH || !in.getBatch().hasCollectiveTable()) return;
    std::vector<ColumnBlock> blocks;
    for_each_block(in.getBatch(), BatchFrame(in.getBatch()), [&](Result<ColumnBlock> block) {
      if (block) blocks.push_back(std::move(*block));
    });
    message.setRoot(in);
    auto batch = message.getRoot<wire::AgentMessage>().getBatch();
    batch.disownCollectiveTable();
    auto table = batch.getCommTable();
    std::unordered_map<uint64_t, uint32_t> index;
    for (uint32_t i = table.size(); i-- > 0;) index[table[i]] = i;  // the first of a repeated hash
    auto columns = batch.initCollectives(static_cast<unsigned>(blocks.size()));
    for (size_t i = 0; i < blocks.size(); ++i)
      encode_block(blocks[i], index.at(blocks[i].comm_hash), batch.getBaseNs(), columns[static_cast<unsigned>(i)]);
    rewritten = true;
  });
  if (!read || !rewritten) return std::nullopt;
  return to_packed(message);
}

namespace {
// A table's header columns, undone (each row's own values).
struct TableRows {
  std::vector<uint32_t> pid, comm, rank, lane, count, first_code;
  std::vector<uint64_t> first_seq, offset, first_count;
  uint64_t records = 0;
};

Result<TableRows> read_rows(wire::CollectiveTable::Reader in) {
  const uint32_t rows = in.getBlocks();
  if (rows > kMaxListEntries)
    return make_error(Errc::protocol, "collective table claims " + std::to_string(rows) + " blocks (limit " +
                                          std::to_string(kMaxListEntries) + ")");
  auto pid = get_column<uint32_t>(in.getPid(), rows, "table pid");
  auto comm = get_column<uint32_t>(in.getComm(), rows, "table comm");
  auto rank = get_column<uint32_t>(in.getRank(), rows, "table rank");
  auto lane = get_column<uint32_t>(in.getLane(), rows, "table lane");
  auto count = get_column<uint32_t>(in.getCount(), rows, "table count");
  auto first_code = get_column<uint32_t>(in.getFirstCode(), rows, "table firstCode");
  auto first_seq = get_column<uint64_t>(in.getFirstSeq(), rows, "table firstSeq");
  auto offset = get_column<uint64_t>(in.getBaseOffsetNs(), rows, "table baseOffsetNs");
  auto first_count = get_column<uint64_t>(in.getFirstCount(), rows, "table firstCount");
  if (const Error* e = first_error(pid, comm, rank, lane, count, first_code, first_seq, offset, first_count)) return *e;
  TableRows out{std::move(*pid),       std::move(*comm),   std::move(*rank),
                std::move(*lane),      std::move(*count),  std::move(*first_code),
                std::move(*first_seq), std::move(*offset), std::move(*first_count)};
  if (rows > 0) {  // the first row against zeros
    out.rank[0] = unzigzag(out.rank[0]);
    out.first_seq[0] = unzigzag(out.first_seq[0]);
    out.offset[0] = unzigzag(out.offset[0]);
  }
  for (uint32_t row = 1; row < rows; ++row) {  // each row against the one before
    out.pid[row] ^= out.pid[row - 1];
    out.comm[row] += out.comm[row - 1];
    out.rank[row] = out.rank[row - 1] + unzigzag(out.rank[row]);
    out.lane[row] ^= out.lane[row - 1];
    out.count[row] ^= out.count[row - 1];
    out.first_code[row] ^= out.first_code[row - 1];
    out.first_seq[row] = out.first_seq[row - 1] + unzigzag(out.first_seq[row]);
    out.offset[row] = out.offset[row - 1] + unzigzag(out.offset[row]);
    out.first_count[row] ^= out.first_count[row - 1];
  }
  for (uint32_t n : out.count) {
    if (n == 0) return make_error(Errc::protocol, "collective table has a row without records");
    out.records += n;
  }
  if (out.records > kMaxRecordsPerBatch)
    return make_error(Errc::protocol, "collective table claims " + std::to_string(out.records) + " records (limit " +
                                          std::to_string(kMaxRecordsPerBatch) + ")");
  return out;
}
}  // namespace

Result<BlockShape> block_shape(wire::Batch::Reader batch) {
  BlockShape shape;
  for (auto block : batch.getCollectives()) shape.records += block.getCount();
  shape.blocks = batch.getCollectives().size();
  if (batch.hasCollectiveTable()) {
    auto rows = read_rows(batch.getCollectiveTable());
    if (!rows) return rows.error();
    shape.blocks += rows->count.size();
    shape.records += rows->records;
  }
  shape.claimed = shape.records;
  for (auto block : batch.getWaits()) shape.claimed += block.getCount();
  for (auto block : batch.getGpuCollectives()) shape.claimed += block.getCount();
  return shape;
}

std::vector<uint32_t> block_comms(wire::Batch::Reader batch) {
  std::vector<uint32_t> comms;
  for (auto block : batch.getCollectives()) comms.push_back(block.getComm());
  if (!batch.hasCollectiveTable()) return comms;
  if (auto rows = read_rows(batch.getCollectiveTable()))
    comms.insert(comms.end(), rows->comm.begin(), rows->comm.end());
  return comms;
}

void for_each_block(wire::Batch::Reader batch, const BatchFrame& frame,
                    const std::function<void(Result<ColumnBlock>)>& use) {
  for (auto columns : batch.getCollectives()) use(decode_columns(columns, frame));
  if (!batch.hasCollectiveTable()) return;
  auto in = batch.getCollectiveTable();
  auto rows = read_rows(in);
  RecordColumns columns;
  if (rows) {
    if (auto read = columns.get(in, static_cast<uint32_t>(rows->records)); !read) rows = read.error();
  }
  if (!rows) {
    use(make_error(Errc::protocol, "collective table: " + rows.error().message + " (all its blocks)"));
    return;
  }
  size_t at = 0;
  for (size_t row = 0; row < rows->count.size(); ++row) {
    const uint32_t n = rows->count[row];
    const size_t from = at;
    at += n;
    if (rows->comm[row] >= frame.table.size()) {
      use(make_error(Errc::protocol, "collective table row " + std::to_string(row) + " refers to communicator #" +
                                         std::to_string(rows->comm[row]) + " of a table of " +
                                         std::to_string(frame.table.size())));
      continue;
    }
    ColumnBlock block;
    block.pid = rows->pid[row];
    block.comm_hash = frame.table[rows->comm[row]];
    block.rank = static_cast<int32_t>(rows->rank[row]);
    block.lane = rows->lane[row];
    const FirstRecord first{rows->first_seq[row], frame.base_ns + rows->offset[row], rows->first_code[row],
                            rows->first_count[row], lane_peer(block.lane)};
    auto decoded = decode_records(columns, from, n, first, block.records);
    if (!decoded) {
      use(make_error(Errc::protocol, "collective table row " + std::to_string(row) + ": " + decoded.error().message));
      continue;
    }
    use(std::move(block));
  }
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
  if (const Error* e = first_error(seq_gap, enqueue_delta, start, kernel, elements, link_peer, link_wait)) return *e;
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
  if (const Error* e = first_error(gap, duration, kind, object, result)) return *e;
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
