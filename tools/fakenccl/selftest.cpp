// fakenccl-selftest: one rank of a multi-process check of the NCCL API. Every
// collective, every reduction operator on every datatype, Send/Recv inside
// groups, CommSplit, CommInitAll and the error paths, each result compared
// exactly. Prints one line per check; exits 1 if any failed.
//
// Like fakenccl-train it uses only nccl.h, cuda_runtime_api.h and the
// standard library, and takes the same rank variables and --id-file.

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

[[noreturn]] void die(const char* format, ...) __attribute__((format(printf, 1, 2)));

void die(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::fprintf(stderr, "fakenccl-selftest: ");
  std::vfprintf(stderr, format, args);
  std::fprintf(stderr, "\n");
  va_end(args);
  std::exit(1);
}

void checkCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) die("%s failed: %s", what, cudaGetErrorString(error));
}

void checkNccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) die("%s failed: %s", what, ncclGetErrorString(result));
}

// ------------------------------------------------------ rank and the id --

struct World {
  int rank;
  int size;
  int localRank;
};

int envInt(const char* name, int fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::atoi(text) : fallback;
}

World worldFromEnvironment() {
  const char* sources[][3] = {{"RANK", "WORLD_SIZE", "LOCAL_RANK"},
                              {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
                              {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"}};
  for (const auto& names : sources) {
    const int rank = envInt(names[0], -1);
    const int size = envInt(names[1], -1);
    if (rank < 0 || size < 1) continue;
    if (rank >= size) die("%s=%d does not fit %s=%d", names[0], rank, names[1], size);
    return World{rank, size, envInt(names[2], 0)};
  }
  die("no rank in the environment: set RANK and WORLD_SIZE (or run under srun or mpirun)");
}

ncclUniqueId shareUniqueId(const World& world, const std::string& path) {
  ncclUniqueId id;
  if (world.rank == 0) {
    checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const std::string temporary = path + ".tmp." + std::to_string(getpid());
    FILE* file = std::fopen(temporary.c_str(), "wb");
    if (file == nullptr || std::fwrite(&id, sizeof(id), 1, file) != 1 || std::fclose(file) != 0 ||
        std::rename(temporary.c_str(), path.c_str()) != 0) {
      die("cannot write the unique id to %s", path.c_str());
    }
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    if (FILE* file = std::fopen(path.c_str(), "rb")) {
      const bool complete = std::fread(&id, sizeof(id), 1, file) == 1;
      std::fclose(file);
      if (complete) return id;
    }
    if (std::chrono::steady_clock::now() > deadline) die("no unique id in %s after 120 s", path.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// -------------------------------------------------------------- checks --

std::string printed(const char* format, ...) __attribute__((format(printf, 1, 2)));

std::string printed(const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  return text;
}

class Checks {
 public:
  explicit Checks(int rank) : rank_(rank) {}

  void expect(bool ok, const std::string& name, const std::string& detail = "") {
    ++count_;
    if (ok) {
      std::printf("fakenccl-selftest rank %d: ok   %s\n", rank_, name.c_str());
      return;
    }
    ++failed_;
    std::printf("fakenccl-selftest rank %d: FAIL %s%s%s\n", rank_, name.c_str(), detail.empty() ? "" : ": ",
                detail.c_str());
  }

  int count() const { return count_; }
  int failed() const { return failed_; }

 private:
  int rank_;
  int count_ = 0;
  int failed_ = 0;
};

// ------------------------------------------------------- device buffers --

// A cudaMalloc'd array, filled and read back with cudaMemcpy, so the program
// is as valid on a GPU as on fakenccl.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t size) : size_(size) {
    checkCuda(cudaMalloc(reinterpret_cast<void**>(&data_), std::max<size_t>(size, 1) * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceArray(const std::vector<T>& values) : DeviceArray(values.size()) { upload(values); }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  T* at(size_t offset) const { return data_ + offset; }
  void upload(const std::vector<T>& values) {
    checkCuda(cudaMemcpy(data_, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  std::vector<T> download() const {
    std::vector<T> values(size_);
    checkCuda(cudaMemcpy(values.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return values;
  }

 private:
  size_t size_;
  T* data_ = nullptr;
};

// Bitwise equality, which is what NCCL promises across ranks (and what tells
// -0 from 0 and compares NaNs).
template <class T>
bool sameBits(const std::vector<T>& a, const std::vector<T>& b) {
  // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison): the bits are the point
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Where the first difference is, for the failure message.
template <class T>
size_t firstDifference(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return i;  // NOLINT(bugprone-suspicious-memory-comparison)
  }
  return std::min(a.size(), b.size());
}

// ----------------------------------------------------------- datatypes --

// The ncclDataType_t of an element type, and its name in messages.
template <class T>
constexpr ncclDataType_t ncclTypeOf() {
  if constexpr (std::is_same_v<T, int8_t>) return ncclInt8;
  if constexpr (std::is_same_v<T, uint8_t>) return ncclUint8;
  if constexpr (std::is_same_v<T, int32_t>) return ncclInt32;
  if constexpr (std::is_same_v<T, uint32_t>) return ncclUint32;
  if constexpr (std::is_same_v<T, int64_t>) return ncclInt64;
  if constexpr (std::is_same_v<T, uint64_t>) return ncclUint64;
  if constexpr (std::is_same_v<T, __half>) return ncclFloat16;
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return ncclBfloat16;
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) return ncclFloat8e4m3;
  if constexpr (std::is_same_v<T, __nv_fp8_e5m2>) return ncclFloat8e5m2;
}

const char* typeName(ncclDataType_t type) {
  constexpr const char* kNames[ncclNumTypes] = {"int8",    "uint8",    "int32",      "uint32",
                                                "int64",   "uint64",   "float16",    "float32",
                                                "float64", "bfloat16", "float8e4m3", "float8e5m2"};
  return kNames[type];
}

// How the expected results are computed: native types in themselves (integer
// sums and products wrapping), half/bfloat16/fp8 in float rounded back to
// the type after every step: what a device reducing in that type does.
template <class T>
constexpr bool kNarrowFloat = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16> ||
                              std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>;

template <class T>
using Math = std::conditional_t<kNarrowFloat<T>, float, T>;

template <class T>
Math<T> load(T value) {
  return static_cast<Math<T>>(value);
}

template <class T>
T store(Math<T> value) {
  return T(value);
}

template <class T>
T fromInt(int value) {
  return store<T>(static_cast<Math<T>>(value));
}

template <class M>
M combine(ncclRedOp_t op, M a, M b) {
  if constexpr (std::is_integral_v<M>) {
    using U = std::make_unsigned_t<M>;
    if (op == ncclProd) return static_cast<M>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    if (op == ncclSum || op == ncclAvg) {
      return static_cast<M>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
  } else {
    if (op == ncclProd) return a * b;
    if (op == ncclSum || op == ncclAvg) return a + b;
  }
  return op == ncclMax ? std::max(a, b) : std::min(a, b);
}

// The reduction of value(0, i), value(1, i), ... in rank order.
template <class T>
T reduceInRankOrder(ncclRedOp_t op, int nranks, const std::function<T(int)>& value) {
  T acc = value(0);
  for (int r = 1; r < nranks; ++r) acc = store<T>(combine(op, load(acc), load(value(r))));
  if (op == ncclAvg) acc = store<T>(static_cast<Math<T>>(load(acc) / static_cast<Math<T>>(nranks)));
  return acc;
}

const char* opName(ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
      return "sum";
    case ncclProd:
      return "prod";
    case ncclMax:
      return "max";
    case ncclMin:
      return "min";
    case ncclAvg:
      return "avg";
    default:
      return "custom";
  }
}

// ------------------------------------------------------------- fixture --

struct Context {
  World world;
  ncclComm_t comm;
  cudaStream_t stream;
  Checks& checks;

  void sync() { checkCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }
  int rank() const { return world.rank; }
  int size() const { return world.size; }
};

// A distinct int32 per (rank, block, index).
int32_t tag(int rank, int block, size_t index) {
  return rank * 1'000'000 + block * 10'000 + static_cast<int32_t>(index);
}

std::vector<int32_t> tags(int rank, int blocks, size_t blockSize) {
  std::vector<int32_t> values;
  for (int b = 0; b < blocks; ++b) {
    for (size_t i = 0; i < blockSize; ++i) values.push_back(tag(rank, b, i));
  }
  return values;
}

// -------------------------------------------------------- the checks --

template <class T>
void checkAllReduceType(Context& ctx) {
  // Not a multiple of any small rank count, so the blocks differ in size.
  constexpr size_t kCount = 1001;
  auto input = [](int rank, size_t i) { return fromInt<T>(1 + ((rank + i) % 3 == 0 ? 1 : 0)); };
  for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
    std::vector<T> mine(kCount);
    std::vector<T> expected(kCount);
    for (size_t i = 0; i < kCount; ++i) {
      mine[i] = input(ctx.rank(), i);
      expected[i] = reduceInRankOrder<T>(op, ctx.size(), [&](int r) { return input(r, i); });
    }
    DeviceArray<T> send(mine);
    DeviceArray<T> recv(kCount);
    checkNccl(ncclAllReduce(send.get(), recv.get(), kCount, ncclTypeOf<T>(), op, ctx.comm, ctx.stream),
              "ncclAllReduce");
    ctx.sync();
    const std::vector<T> got = recv.download();
    ctx.checks.expect(sameBits(got, expected), std::string("AllReduce ") + opName(op) + " " + typeName(ncclTypeOf<T>()),
                      printed("first difference at element %zu", firstDifference(got, expected)));
  }
}

void checkAllReduceAllTypes(Context& ctx) {
  checkAllReduceType<int8_t>(ctx);
  checkAllReduceType<uint8_t>(ctx);
  checkAllReduceType<int32_t>(ctx);
  checkAllReduceType<uint32_t>(ctx);
  checkAllReduceType<int64_t>(ctx);
  checkAllReduceType<uint64_t>(ctx);
  checkAllReduceType<__half>(ctx);
  checkAllReduceType<float>(ctx);
  checkAllReduceType<double>(ctx);
  checkAllReduceType<__nv_bfloat16>(ctx);
  checkAllReduceType<__nv_fp8_e4m3>(ctx);
  checkAllReduceType<__nv_fp8_e5m2>(ctx);
}

void checkAllReduceInPlace(Context& ctx) {
  constexpr size_t kCount = 4099;
  DeviceArray<int32_t> buffer(tags(ctx.rank(), 1, kCount));
  checkNccl(ncclAllReduce(buffer.get(), buffer.get(), kCount, ncclInt32, ncclSum, ctx.comm, ctx.stream),
            "ncclAllReduce");
  ctx.sync();
  std::vector<int32_t> expected(kCount, 0);
  for (int r = 0; r < ctx.size(); ++r) {
    for (size_t i = 0; i < kCount; ++i) expected[i] += tag(r, 0, i);
  }
  ctx.checks.expect(buffer.download() == expected, "AllReduce in place");
}

void checkPreMulSum(Context& ctx) {
  constexpr size_t kCount = 512;
  float factor = 0.5f;
  DeviceArray<float> deviceFactor(std::vector<float>{factor});
  for (ncclScalarResidence_t residence : {ncclScalarHostImmediate, ncclScalarDevice}) {
    ncclRedOp_t op;
    void* scalar = residence == ncclScalarDevice ? static_cast<void*>(deviceFactor.get()) : static_cast<void*>(&factor);
    checkNccl(ncclRedOpCreatePreMulSum(&op, scalar, ncclFloat32, residence, ctx.comm), "ncclRedOpCreatePreMulSum");
    std::vector<float> mine(kCount);
    std::vector<float> expected(kCount, 0.0f);
    for (size_t i = 0; i < kCount; ++i) {
      mine[i] = static_cast<float>((ctx.rank() + static_cast<int>(i)) % 5);
      for (int r = 0; r < ctx.size(); ++r) expected[i] += static_cast<float>((r + static_cast<int>(i)) % 5) * factor;
    }
    DeviceArray<float> buffer(mine);
    checkNccl(ncclAllReduce(buffer.get(), buffer.get(), kCount, ncclFloat32, op, ctx.comm, ctx.stream),
              "ncclAllReduce");
    ctx.sync();
    checkNccl(ncclRedOpDestroy(op, ctx.comm), "ncclRedOpDestroy");
    ctx.checks.expect(buffer.download() == expected, residence == ncclScalarDevice
                                                         ? "AllReduce PreMulSum (device scalar)"
                                                         : "AllReduce PreMulSum (host scalar)");
  }
}

void checkBroadcast(Context& ctx) {
  constexpr size_t kCount = 3000;
  const int root = ctx.size() - 1;
  DeviceArray<int32_t> send(tags(ctx.rank(), 1, kCount));
  DeviceArray<int32_t> recv(kCount);
  checkNccl(ncclBroadcast(send.get(), recv.get(), kCount, ncclInt32, root, ctx.comm, ctx.stream), "ncclBroadcast");
  DeviceArray<int32_t> inPlace(tags(ctx.rank(), 2, kCount));
  checkNccl(ncclBcast(inPlace.get(), 2 * kCount, ncclInt32, 0, ctx.comm, ctx.stream), "ncclBcast");
  ctx.sync();
  ctx.checks.expect(recv.download() == tags(root, 1, kCount), "Broadcast from the last rank");
  ctx.checks.expect(inPlace.download() == tags(0, 2, kCount), "Bcast in place from rank 0");
}

void checkReduce(Context& ctx) {
  constexpr size_t kCount = 2000;
  const int root = 1 % ctx.size();
  DeviceArray<int32_t> send(tags(ctx.rank(), 1, kCount));
  DeviceArray<int32_t> recv(kCount);
  // nccl.h: recvbuff may be NULL except at the root.
  int32_t* target = ctx.rank() == root ? recv.get() : nullptr;
  checkNccl(ncclReduce(send.get(), target, kCount, ncclInt32, ncclMax, root, ctx.comm, ctx.stream), "ncclReduce");
  ctx.sync();
  if (ctx.rank() == root) {
    ctx.checks.expect(recv.download() == tags(ctx.size() - 1, 1, kCount), "Reduce max to rank 1");
  }
}

void checkAllGather(Context& ctx) {
  constexpr size_t kCount = 1500;
  const int n = ctx.size();
  std::vector<int32_t> expected;
  for (int r = 0; r < n; ++r) {
    std::vector<int32_t> block = tags(r, 1, kCount);
    expected.insert(expected.end(), block.begin(), block.end());
  }
  DeviceArray<int32_t> send(tags(ctx.rank(), 1, kCount));
  DeviceArray<int32_t> recv(n * kCount);
  checkNccl(ncclAllGather(send.get(), recv.get(), kCount, ncclInt32, ctx.comm, ctx.stream), "ncclAllGather");
  // nccl.h: in place when sendbuff == recvbuff + rank * sendcount.
  DeviceArray<int32_t> inPlace(n * kCount);
  std::vector<int32_t> seeded(n * kCount, -1);
  std::copy(expected.begin() + ctx.rank() * kCount, expected.begin() + (ctx.rank() + 1) * kCount,
            seeded.begin() + ctx.rank() * kCount);
  inPlace.upload(seeded);
  checkNccl(ncclAllGather(inPlace.at(ctx.rank() * kCount), inPlace.get(), kCount, ncclInt32, ctx.comm, ctx.stream),
            "ncclAllGather");
  ctx.sync();
  ctx.checks.expect(recv.download() == expected, "AllGather");
  ctx.checks.expect(inPlace.download() == expected, "AllGather in place");
}

void checkReduceScatter(Context& ctx) {
  constexpr size_t kCount = 1200;
  const int n = ctx.size();
  std::vector<int32_t> expected(kCount, 0);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < kCount; ++i) expected[i] += tag(r, ctx.rank(), i);
  }
  DeviceArray<int32_t> send(tags(ctx.rank(), n, kCount));
  DeviceArray<int32_t> recv(kCount);
  checkNccl(ncclReduceScatter(send.get(), recv.get(), kCount, ncclInt32, ncclSum, ctx.comm, ctx.stream),
            "ncclReduceScatter");
  // nccl.h: in place when recvbuff == sendbuff + rank * recvcount.
  DeviceArray<int32_t> inPlace(tags(ctx.rank(), n, kCount));
  checkNccl(ncclReduceScatter(inPlace.get(), inPlace.at(ctx.rank() * kCount), kCount, ncclInt32, ncclSum, ctx.comm,
                              ctx.stream),
            "ncclReduceScatter");
  ctx.sync();
  ctx.checks.expect(recv.download() == expected, "ReduceScatter");
  const std::vector<int32_t> all = inPlace.download();
  ctx.checks.expect(
      std::vector<int32_t>(all.begin() + ctx.rank() * kCount, all.begin() + (ctx.rank() + 1) * kCount) == expected,
      "ReduceScatter in place");
}

void checkAlltoAll(Context& ctx) {
  constexpr size_t kCount = 700;
  const int n = ctx.size();
  std::vector<int32_t> expected;  // block r comes from rank r, its block for me
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < kCount; ++i) expected.push_back(tag(r, ctx.rank(), i));
  }
  DeviceArray<int32_t> send(tags(ctx.rank(), n, kCount));
  DeviceArray<int32_t> recv(n * kCount);
  checkNccl(ncclAlltoAll(send.get(), recv.get(), kCount, ncclInt32, ctx.comm, ctx.stream), "ncclAlltoAll");
  ctx.sync();
  ctx.checks.expect(recv.download() == expected, "AlltoAll");
}

void checkGatherScatter(Context& ctx) {
  constexpr size_t kCount = 900;
  const int n = ctx.size();
  const int root = n / 2;
  DeviceArray<int32_t> send(tags(ctx.rank(), 1, kCount));
  DeviceArray<int32_t> gathered(n * kCount);
  checkNccl(ncclGather(send.get(), ctx.rank() == root ? gathered.get() : nullptr, kCount, ncclInt32, root, ctx.comm,
                       ctx.stream),
            "ncclGather");
  DeviceArray<int32_t> source(tags(root, n, kCount));
  DeviceArray<int32_t> scattered(kCount);
  checkNccl(ncclScatter(ctx.rank() == root ? source.get() : nullptr, scattered.get(), kCount, ncclInt32, root, ctx.comm,
                        ctx.stream),
            "ncclScatter");
  ctx.sync();
  if (ctx.rank() == root) {
    std::vector<int32_t> expected;
    for (int r = 0; r < n; ++r) {
      std::vector<int32_t> block = tags(r, 1, kCount);
      expected.insert(expected.end(), block.begin(), block.end());
    }
    ctx.checks.expect(gathered.download() == expected, "Gather to the middle rank");
  }
  std::vector<int32_t> mine = tags(root, n, kCount);
  ctx.checks.expect(scattered.download() == std::vector<int32_t>(mine.begin() + ctx.rank() * kCount,
                                                                 mine.begin() + (ctx.rank() + 1) * kCount),
                    "Scatter from the middle rank");
}

// Every rank sends to the next and receives from the previous: only works if
// the group lets the Send and the Recv progress together. 16 MiB each, far
// beyond the socket buffers.
void checkRingInGroup(Context& ctx) {
  constexpr size_t kCount = 4 << 20;
  const int next = (ctx.rank() + 1) % ctx.size();
  const int previous = (ctx.rank() + ctx.size() - 1) % ctx.size();
  std::vector<int32_t> mine(kCount);
  for (size_t i = 0; i < kCount; ++i) mine[i] = tag(ctx.rank(), 0, i % 10'000) ^ static_cast<int32_t>(i);
  DeviceArray<int32_t> send(mine);
  DeviceArray<int32_t> recv(kCount);
  checkNccl(ncclGroupStart(), "ncclGroupStart");
  checkNccl(ncclSend(send.get(), kCount, ncclInt32, next, ctx.comm, ctx.stream), "ncclSend");
  checkNccl(ncclRecv(recv.get(), kCount, ncclInt32, previous, ctx.comm, ctx.stream), "ncclRecv");
  checkNccl(ncclGroupEnd(), "ncclGroupEnd");
  ctx.sync();
  std::vector<int32_t> expected(kCount);
  for (size_t i = 0; i < kCount; ++i) expected[i] = tag(previous, 0, i % 10'000) ^ static_cast<int32_t>(i);
  ctx.checks.expect(recv.download() == expected, "Send/Recv ring in a group (16 MiB)");
}

// All-to-all written as Send/Recv pairs, the rank's own block included.
void checkSendRecvAllPairs(Context& ctx) {
  constexpr size_t kCount = 333;
  const int n = ctx.size();
  DeviceArray<int32_t> send(tags(ctx.rank(), n, kCount));
  DeviceArray<int32_t> recv(n * kCount);
  checkNccl(ncclGroupStart(), "ncclGroupStart");
  for (int peer = 0; peer < n; ++peer) {
    checkNccl(ncclSend(send.at(peer * kCount), kCount, ncclInt32, peer, ctx.comm, ctx.stream), "ncclSend");
    checkNccl(ncclRecv(recv.at(peer * kCount), kCount, ncclInt32, peer, ctx.comm, ctx.stream), "ncclRecv");
  }
  checkNccl(ncclGroupEnd(), "ncclGroupEnd");
  ctx.sync();
  std::vector<int32_t> expected;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < kCount; ++i) expected.push_back(tag(r, ctx.rank(), i));
  }
  ctx.checks.expect(recv.download() == expected, "Send/Recv with every peer and itself in a group");
}

// Three collectives fused by one group, a nested group, and a group whose
// calls use two streams.
void checkGroups(Context& ctx) {
  constexpr size_t kCount = 1024;
  const int n = ctx.size();
  DeviceArray<int32_t> a(tags(ctx.rank(), 1, kCount));
  DeviceArray<int32_t> b(tags(ctx.rank(), 1, kCount));
  DeviceArray<int32_t> gathered(n * kCount);
  DeviceArray<int32_t> c(tags(ctx.rank(), 1, kCount));
  checkNccl(ncclGroupStart(), "ncclGroupStart");
  checkNccl(ncclAllReduce(a.get(), a.get(), kCount, ncclInt32, ncclMin, ctx.comm, ctx.stream), "ncclAllReduce");
  checkNccl(ncclAllGather(b.get(), gathered.get(), kCount, ncclInt32, ctx.comm, ctx.stream), "ncclAllGather");
  checkNccl(ncclGroupStart(), "ncclGroupStart");  // nested
  checkNccl(ncclBroadcast(c.get(), c.get(), kCount, ncclInt32, 0, ctx.comm, ctx.stream), "ncclBroadcast");
  checkNccl(ncclGroupEnd(), "ncclGroupEnd");
  checkNccl(ncclGroupEnd(), "ncclGroupEnd");
  ctx.sync();
  std::vector<int32_t> all;
  for (int r = 0; r < n; ++r) {
    std::vector<int32_t> block = tags(r, 1, kCount);
    all.insert(all.end(), block.begin(), block.end());
  }
  ctx.checks.expect(
      a.download() == tags(0, 1, kCount) && gathered.download() == all && c.download() == tags(0, 1, kCount),
      "group of AllReduce, AllGather and a nested Broadcast");

  cudaStream_t second;
  checkCuda(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  DeviceArray<int32_t> d(tags(ctx.rank(), 1, kCount));
  DeviceArray<int32_t> e(tags(ctx.rank(), 1, kCount));
  checkNccl(ncclGroupStart(), "ncclGroupStart");
  checkNccl(ncclAllReduce(d.get(), d.get(), kCount, ncclInt32, ncclMax, ctx.comm, ctx.stream), "ncclAllReduce");
  checkNccl(ncclAllReduce(e.get(), e.get(), kCount, ncclInt32, ncclMin, ctx.comm, second), "ncclAllReduce");
  checkNccl(ncclGroupEnd(), "ncclGroupEnd");
  checkCuda(cudaStreamSynchronize(second), "cudaStreamSynchronize");
  ctx.sync();
  checkCuda(cudaStreamDestroy(second), "cudaStreamDestroy");
  ctx.checks.expect(d.download() == tags(n - 1, 1, kCount) && e.download() == tags(0, 1, kCount),
                    "group spanning two streams");
}

void checkZeroCount(Context& ctx) {
  DeviceArray<float> buffer(1);
  ncclResult_t result = ncclAllReduce(buffer.get(), buffer.get(), 0, ncclFloat32, ncclSum, ctx.comm, ctx.stream);
  ctx.sync();
  ctx.checks.expect(result == ncclSuccess, "AllReduce of 0 elements", ncclGetErrorString(result));
}

// Even ranks and odd ranks, each ordered backwards by key.
void checkSplit(Context& ctx) {
  const int color = ctx.rank() % 2;
  ncclComm_t child = nullptr;
  checkNccl(ncclCommSplit(ctx.comm, color, -ctx.rank(), &child, nullptr), "ncclCommSplit");
  std::vector<int> members;
  for (int r = ctx.size() - 1; r >= 0; --r) {
    if (r % 2 == color) members.push_back(r);
  }
  const int expectedRank = static_cast<int>(std::find(members.begin(), members.end(), ctx.rank()) - members.begin());
  int childRank = -1;
  int childCount = -1;
  checkNccl(ncclCommUserRank(child, &childRank), "ncclCommUserRank");
  checkNccl(ncclCommCount(child, &childCount), "ncclCommCount");
  ctx.checks.expect(
      childRank == expectedRank && childCount == static_cast<int>(members.size()),
      "CommSplit by parity: child rank and size",
      printed("got rank %d of %d, expected %d of %zu", childRank, childCount, expectedRank, members.size()));
  DeviceArray<int32_t> value(std::vector<int32_t>{ctx.rank()});
  checkNccl(ncclAllReduce(value.get(), value.get(), 1, ncclInt32, ncclSum, child, ctx.stream), "ncclAllReduce");
  ctx.sync();
  int32_t expectedSum = 0;
  for (int r : members) expectedSum += r;
  ctx.checks.expect(value.download()[0] == expectedSum, "AllReduce on a split communicator");
  checkNccl(ncclCommDestroy(child), "ncclCommDestroy");

  // The last rank opts out.
  const bool optOut = ctx.rank() == ctx.size() - 1;
  ncclComm_t rest = nullptr;
  checkNccl(ncclCommSplit(ctx.comm, optOut ? NCCL_SPLIT_NOCOLOR : 7, 0, &rest, nullptr), "ncclCommSplit");
  if (optOut) {
    ctx.checks.expect(rest == nullptr, "CommSplit with NCCL_SPLIT_NOCOLOR gives NULL");
    return;
  }
  int restCount = -1;
  checkNccl(ncclCommCount(rest, &restCount), "ncclCommCount");
  ctx.checks.expect(restCount == ctx.size() - 1, "CommSplit without the last rank");
  checkNccl(ncclCommDestroy(rest), "ncclCommDestroy");
}

// Three ranks in this one process, driven from this thread through a group.
void checkInitAll(Context& ctx) {
  constexpr int kDevices = 3;
  constexpr size_t kCount = 256;
  ncclComm_t comms[kDevices];
  checkNccl(ncclCommInitAll(comms, kDevices, nullptr), "ncclCommInitAll");
  cudaStream_t streams[kDevices];
  std::vector<std::unique_ptr<DeviceArray<int32_t>>> buffers;
  bool described = true;
  for (int i = 0; i < kDevices; ++i) {
    int rank = -1;
    int device = -1;
    checkNccl(ncclCommUserRank(comms[i], &rank), "ncclCommUserRank");
    checkNccl(ncclCommCuDevice(comms[i], &device), "ncclCommCuDevice");
    described = described && rank == i && device == i;
    checkCuda(cudaSetDevice(i), "cudaSetDevice");
    checkCuda(cudaStreamCreate(&streams[i]), "cudaStreamCreate");
    buffers.push_back(std::make_unique<DeviceArray<int32_t>>(tags(i, 1, kCount)));
  }
  checkNccl(ncclGroupStart(), "ncclGroupStart");
  for (int i = 0; i < kDevices; ++i) {
    checkNccl(ncclAllReduce(buffers[i]->get(), buffers[i]->get(), kCount, ncclInt32, ncclSum, comms[i], streams[i]),
              "ncclAllReduce");
  }
  checkNccl(ncclGroupEnd(), "ncclGroupEnd");
  std::vector<int32_t> expected(kCount, 0);
  for (int r = 0; r < kDevices; ++r) {
    for (size_t i = 0; i < kCount; ++i) expected[i] += tag(r, 0, i);
  }
  bool reduced = true;
  for (int i = 0; i < kDevices; ++i) {
    checkCuda(cudaSetDevice(i), "cudaSetDevice");
    checkCuda(cudaStreamSynchronize(streams[i]), "cudaStreamSynchronize");
    reduced = reduced && buffers[i]->download() == expected;
    checkCuda(cudaStreamDestroy(streams[i]), "cudaStreamDestroy");
    checkNccl(ncclCommDestroy(comms[i]), "ncclCommDestroy");
  }
  checkCuda(cudaSetDevice(ctx.world.localRank % kDevices), "cudaSetDevice");
  ctx.checks.expect(described, "CommInitAll: comm i is rank i on device i");
  ctx.checks.expect(reduced, "CommInitAll: grouped AllReduce over 3 in-process ranks");
}

void checkQueries(Context& ctx) {
  int version = 0;
  checkNccl(ncclGetVersion(&version), "ncclGetVersion");
  ctx.checks.expect(version == NCCL_VERSION_CODE, "GetVersion is NCCL_VERSION_CODE", printed("got %d", version));
  int count = -1;
  int rank = -1;
  checkNccl(ncclCommCount(ctx.comm, &count), "ncclCommCount");
  checkNccl(ncclCommUserRank(ctx.comm, &rank), "ncclCommUserRank");
  ctx.checks.expect(count == ctx.size() && rank == ctx.rank(), "CommCount and CommUserRank");
  ncclResult_t asyncError = ncclInternalError;
  checkNccl(ncclCommGetAsyncError(ctx.comm, &asyncError), "ncclCommGetAsyncError");
  ctx.checks.expect(asyncError == ncclSuccess, "CommGetAsyncError is ncclSuccess");
  void* handle = nullptr;
  DeviceArray<float> registered(64);
  ctx.checks.expect(ncclCommRegister(ctx.comm, registered.get(), 64 * sizeof(float), &handle) == ncclSuccess &&
                        ncclCommDeregister(ctx.comm, handle) == ncclSuccess,
                    "CommRegister and CommDeregister");
  void* memory = nullptr;
  ctx.checks.expect(
      ncclMemAlloc(&memory, 4096) == ncclSuccess && memory != nullptr && ncclMemFree(memory) == ncclSuccess,
      "MemAlloc and MemFree");
}

// Each of these must fail cleanly (they print their reason on stderr).
void checkErrors(Context& ctx) {
  DeviceArray<float> buffer(16);
  ctx.checks.expect(
      ncclAllReduce(buffer.get(), buffer.get(), 16, ncclFloat32, ncclSum, nullptr, ctx.stream) == ncclInvalidArgument,
      "AllReduce on a NULL comm is ncclInvalidArgument");
  ctx.checks.expect(ncclAllReduce(buffer.get(), buffer.get(), 16, static_cast<ncclDataType_t>(ncclNumTypes), ncclSum,
                                  ctx.comm, ctx.stream) == ncclInvalidArgument,
                    "AllReduce with an invalid datatype is ncclInvalidArgument");
  ctx.checks.expect(ncclAllReduce(buffer.get(), buffer.get(), 16, ncclFloat32, static_cast<ncclRedOp_t>(77), ctx.comm,
                                  ctx.stream) == ncclInvalidArgument,
                    "AllReduce with an invalid operator is ncclInvalidArgument");
  ctx.checks.expect(ncclBroadcast(buffer.get(), buffer.get(), 16, ncclFloat32, ctx.size(), ctx.comm, ctx.stream) ==
                        ncclInvalidArgument,
                    "Broadcast from a root outside the communicator is ncclInvalidArgument");
  ctx.checks.expect(
      ncclAllReduce(nullptr, buffer.get(), 16, ncclFloat32, ncclSum, ctx.comm, ctx.stream) == ncclInvalidArgument,
      "AllReduce with a NULL sendbuff is ncclInvalidArgument");
  int count = 0;
  ctx.checks.expect(ncclCommCount(nullptr, &count) == ncclInvalidArgument,
                    "CommCount on a NULL comm is ncclInvalidArgument");
  ctx.checks.expect(std::strlen(ncclGetLastError(nullptr)) > 0, "GetLastError explains the last failure");
  ncclUniqueId bogus;
  std::memset(&bogus, 0, sizeof(bogus));
  ncclComm_t never = nullptr;
  ctx.checks.expect(ncclCommInitRank(&never, 2, bogus, 0) == ncclInvalidArgument,
                    "CommInitRank with an id not from ncclGetUniqueId is ncclInvalidArgument");
  ctx.checks.expect(ncclGroupEnd() == ncclInvalidUsage, "GroupEnd without GroupStart is ncclInvalidUsage");
  ctx.checks.expect(std::strlen(ncclGetErrorString(ncclRemoteError)) > 0, "GetErrorString has text");
}

}  // namespace

int main(int argc, char** argv) {
  std::string idFile;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--id-file") == 0 && i + 1 < argc) idFile = argv[++i];
  }
  if (idFile.empty()) die("usage: fakenccl-selftest --id-file PATH (rank from RANK/WORLD_SIZE or a launcher)");
  const World world = worldFromEnvironment();

  int deviceCount = 0;
  checkCuda(cudaGetDeviceCount(&deviceCount), "cudaGetDeviceCount");
  checkCuda(cudaSetDevice(world.localRank % deviceCount), "cudaSetDevice");
  const ncclUniqueId id = shareUniqueId(world, idFile);
  ncclComm_t comm = nullptr;
  checkNccl(ncclCommInitRank(&comm, world.size, id, world.rank), "ncclCommInitRank");
  cudaStream_t stream = nullptr;
  checkCuda(cudaStreamCreate(&stream), "cudaStreamCreate");

  Checks checks(world.rank);
  Context ctx{world, comm, stream, checks};
  checkQueries(ctx);
  checkAllReduceAllTypes(ctx);
  checkAllReduceInPlace(ctx);
  checkPreMulSum(ctx);
  checkBroadcast(ctx);
  checkReduce(ctx);
  checkAllGather(ctx);
  checkReduceScatter(ctx);
  checkAlltoAll(ctx);
  checkGatherScatter(ctx);
  checkRingInGroup(ctx);
  checkSendRecvAllPairs(ctx);
  checkGroups(ctx);
  checkZeroCount(ctx);
  checkSplit(ctx);
  checkErrors(ctx);
  checkInitAll(ctx);

  checkCuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  checkNccl(ncclCommDestroy(comm), "ncclCommDestroy");
  std::printf("fakenccl-selftest rank %d/%d: %d checks, %d failed\n", world.rank, world.size, checks.count(),
              checks.failed());
  return checks.failed() == 0 ? 0 : 1;
}
