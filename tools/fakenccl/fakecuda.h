// The private interface between fakenccl's two stand-in libraries.
//
// libnccl.so.2 (the NCCL stand-in) runs each collective as host work queued on a
// cudaStream_t; libcudart.so.13 (the CUDA runtime stand-in) owns the streams.
// Real NCCL links the CUDA runtime statically, so a tracer never sees NCCL
// calling the public cuda* API; to keep traces of fakenccl programs looking the
// same, libnccl reaches the streams only through these fakecuda_* functions,
// which no NVIDIA library exports.
#pragma once

#include <cuda_runtime_api.h>

// Both libraries build with -fvisibility=hidden; this marks what they export
// (and their linker version scripts list the same names).
#define FAKENCCL_EXPORT __attribute__((visibility("default")))

extern "C" {

typedef void (*fakecuda_work_fn)(void* arg);

// Queues fn(arg) on `stream`; the stream's worker thread runs it after all work
// queued before it, and cudaStreamSynchronize(stream) returns only once it has
// returned. The NULL stream (0, cudaStreamLegacy, cudaStreamPerThread) means
// the default stream of `device`. Returns cudaErrorInvalidResourceHandle for a
// stream that does not exist (fn is then never called).
FAKENCCL_EXPORT cudaError_t fakecuda_stream_enqueue(cudaStream_t stream, int device, fakecuda_work_fn fn, void* arg);

// Whether fakecuda_stream_enqueue(stream, device, ...) would find a stream:
// a live stream, or the NULL stream of an existing device.
FAKENCCL_EXPORT int fakecuda_stream_is_valid(cudaStream_t stream, int device);

// How many devices this process sees (cudaGetDeviceCount, untraced).
FAKENCCL_EXPORT int fakecuda_device_count(void);

// The calling thread's current device (cudaSetDevice), without going through
// the traced public API.
FAKENCCL_EXPORT int fakecuda_current_device(void);

}  // extern "C"
