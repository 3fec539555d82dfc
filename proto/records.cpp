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

uint64_t comm_hash_of_unique_id(const uint8_t* id, size_t len) {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a 64 offset basis
  for (size_t i = 0; i < len; ++i) {
    hash ^= id[i];
    hash *= 0x100000001b3ull;  // FNV-1a 64 prime
  }
  return hash;
}

}  // namespace rankscope::proto
