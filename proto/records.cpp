#include "proto/records.h"

namespace rankscope::proto {

namespace {
struct OpName {
  uint8_t op;
  const char* name;
};
constexpr OpName kOps[] = {
    {RS_OP_ALLREDUCE, "AllReduce"},       {RS_OP_BROADCAST, "Broadcast"},
    {RS_OP_BCAST, "Bcast"},               {RS_OP_REDUCE, "Reduce"},
    {RS_OP_ALLGATHER, "AllGather"},       {RS_OP_REDUCESCATTER, "ReduceScatter"},
    {RS_OP_ALLTOALL, "AlltoAll"},         {RS_OP_GATHER, "Gather"},
    {RS_OP_SCATTER, "Scatter"},           {RS_OP_SEND, "Send"},
    {RS_OP_RECV, "Recv"},                 {RS_OP_COMM_INIT_RANK, "CommInitRank"},
    {RS_OP_COMM_INIT_RANK_CONFIG, "CommInitRankConfig"},
    {RS_OP_COMM_INIT_ALL, "CommInitAll"}, {RS_OP_COMM_SPLIT, "CommSplit"},
    {RS_OP_COMM_DESTROY, "CommDestroy"},  {RS_OP_COMM_ABORT, "CommAbort"},
    {RS_OP_GROUP_START, "GroupStart"},    {RS_OP_GROUP_END, "GroupEnd"},
};

// ncclDataType_t in nccl.h (NCCL 2.28): name and element size.
struct TypeInfo {
  const char* name;
  size_t size;
};
constexpr TypeInfo kTypes[] = {
    {"int8", 1},    {"uint8", 1},   {"int32", 4},    {"uint32", 4},     {"int64", 8},      {"uint64", 8},
    {"float16", 2}, {"float32", 4}, {"float64", 8},  {"bfloat16", 2},   {"float8e4m3", 1}, {"float8e5m2", 1},
};
}  // namespace

std::string op_name(uint8_t op) {
  for (const auto& entry : kOps)
    if (entry.op == op) return entry.name;
  return "op" + std::to_string(op);
}

uint8_t op_from_name(std::string_view name) {
  for (const auto& entry : kOps)
    if (name == entry.name) return entry.op;
  return RS_OP_NONE;
}

bool op_is_collective(uint8_t op) { return op >= RS_OP_ALLREDUCE && op <= RS_OP_SCATTER; }

std::string datatype_name(uint8_t datatype) {
  if (datatype < sizeof(kTypes) / sizeof(kTypes[0])) return kTypes[datatype].name;
  return "type" + std::to_string(datatype);
}

size_t datatype_size(uint8_t datatype) {
  if (datatype < sizeof(kTypes) / sizeof(kTypes[0])) return kTypes[datatype].size;
  return 0;
}

std::string redop_name(uint8_t redop) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  if (redop < 5) return kNames[redop];
  return "op" + std::to_string(redop);
}

uint64_t record_bytes(const CallRecord& record) { return record.count * datatype_size(record.datatype); }

std::string result_name(int32_t result) {
  static const char* const kNames[] = {"ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError",
                                       "ncclInternalError",   "ncclInvalidArgument",    "ncclInvalidUsage",
                                       "ncclRemoteError",     "ncclInProgress"};
  if (result >= 0 && result < 8) return kNames[result];
  return "ncclResult(" + std::to_string(result) + ")";
}

namespace {
// NCCL's hash, as its commHash uses it (NVIDIA/nccl src/include/bitops.h):
// a two-word accumulator; each input is prefixed by its length and fed eight
// bytes (little-endian, zero-padded) at a time, then the words are folded.
struct NcclHash {
  uint64_t a = 1, b = 1;
  void eat(const void* bytes, size_t size) {
    const auto* p = static_cast<const uint8_t*>(bytes);
    a ^= size;
    while (size != 0) {
      a += b;
      b ^= a;
      a ^= a >> 31;
      a *= 0x9de62bbc8cef3ce3ull;
      b ^= b >> 32;
      b *= 0x485cd6311b599e79ull;
      size_t chunk = size < 8 ? size : 8;
      uint64_t x = 0;
      for (size_t i = 0; i < chunk; ++i) x |= static_cast<uint64_t>(p[i]) << (8 * i);
      p += chunk;
      size -= chunk;
      a += x;
    }
  }
  uint64_t digest() const {
    uint64_t h = a;
    h ^= h >> 31;
    h *= 0xbac3bd562846de6bull;
    h += b;
    h ^= h >> 32;
    h *= 0x995a187a14e7b445ull;
    return h;
  }
};
}  // namespace

uint64_t comm_hash_of_unique_id(const uint8_t* id, size_t len) {
  NcclHash h;
  h.eat(id, len);
  return h.digest();
}

uint64_t comm_hash_of_split(uint64_t parent_hash, int32_t child_count, int32_t color) {
  NcclHash h;
  uint8_t bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(parent_hash >> (8 * i));
  h.eat(bytes, 8);
  for (int32_t v : {child_count, color}) {
    auto u = static_cast<uint32_t>(v);
    uint8_t four[4] = {static_cast<uint8_t>(u), static_cast<uint8_t>(u >> 8), static_cast<uint8_t>(u >> 16),
                       static_cast<uint8_t>(u >> 24)};
    h.eat(four, 4);
  }
  return h.digest();
}

}  // namespace rankscope::proto
