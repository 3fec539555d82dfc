#include "tools/fakenccl/reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace rankscope::fakenccl {
namespace {

// How an element type computes: native types in themselves, the narrow float
// types (through NVIDIA's own host conversions in cuda_fp16.h, cuda_bf16.h
// and cuda_fp8.h) in float.
template <class T>
struct Arithmetic {
  using Type = T;
  static Type load(T value) { return value; }
  static T store(Type value) { return value; }
};

template <class T>
struct NarrowFloat {
  using Type = float;
  static Type load(T value) { return static_cast<float>(value); }
  static T store(Type value) { return T(value); }
};

template <>
struct Arithmetic<__half> : NarrowFloat<__half> {};
template <>
struct Arithmetic<__nv_bfloat16> : NarrowFloat<__nv_bfloat16> {};
template <>
struct Arithmetic<__nv_fp8_e4m3> : NarrowFloat<__nv_fp8_e4m3> {};
template <>
struct Arithmetic<__nv_fp8_e5m2> : NarrowFloat<__nv_fp8_e5m2> {};

// Integer sums and products wrap, as they do on the device; computing in the
// unsigned type keeps signed overflow defined.
template <class A>
A add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <class A>
A multiply(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

template <class T>
T loadElement(const void* base, size_t index) {
  T value;
  std::memcpy(&value, static_cast<const std::byte*>(base) + index * sizeof(T), sizeof(T));
  return value;
}

template <class T>
void storeElement(void* base, size_t index, T value) {
  std::memcpy(static_cast<std::byte*>(base) + index * sizeof(T), &value, sizeof(T));
}

// dst[i] = combine(dst[i], src[i]) in T's arithmetic, rounded back to T.
template <class T, class Combine>
void foldInto(void* dst, const void* src, size_t count, Combine combine) {
  using Math = Arithmetic<T>;
  for (size_t i = 0; i < count; ++i) {
    const auto a = Math::load(loadElement<T>(dst, i));
    const auto b = Math::load(loadElement<T>(src, i));
    storeElement<T>(dst, i, Math::store(combine(a, b)));
  }
}

// dst[i] = src[i] * scale, for PreMulSum's first input.
template <class T>
void scaleInto(void* dst, const void* src, size_t count, typename Arithmetic<T>::Type scale) {
  using Math = Arithmetic<T>;
  for (size_t i = 0; i < count; ++i) {
    storeElement<T>(dst, i, Math::store(multiply(Math::load(loadElement<T>(src, i)), scale)));
  }
}

template <class T>
void divideInPlace(void* dst, size_t count, size_t divisor) {
  using Math = Arithmetic<T>;
  using A = typename Math::Type;
  for (size_t i = 0; i < count; ++i) {
    const A value = Math::load(loadElement<T>(dst, i));
    storeElement<T>(dst, i, Math::store(static_cast<A>(value / static_cast<A>(divisor))));
  }
}

template <class T>
typename Arithmetic<T>::Type preMulScalar(const Reduction& reduction) {
  const void* source = reduction.scalarAddress != nullptr ? reduction.scalarAddress : reduction.scalar.data();
  return Arithmetic<T>::load(loadElement<T>(source, 0));
}

template <class T>
void reduceTyped(void* dst, std::span<const void* const> inputs, size_t count, const Reduction& reduction) {
  using A = typename Arithmetic<T>::Type;
  if (reduction.preMulSum) {
    const A scale = preMulScalar<T>(reduction);
    scaleInto<T>(dst, inputs[0], count, scale);
    for (size_t k = 1; k < inputs.size(); ++k) {
      foldInto<T>(dst, inputs[k], count, [scale](A a, A b) { return add(a, multiply(b, scale)); });
    }
    return;
  }
  if (dst != inputs[0]) std::memmove(dst, inputs[0], count * sizeof(T));
  for (size_t k = 1; k < inputs.size(); ++k) {
    switch (reduction.builtin) {
      case ncclProd:
        foldInto<T>(dst, inputs[k], count, multiply<A>);
        break;
      case ncclMax:
        foldInto<T>(dst, inputs[k], count, [](A a, A b) { return std::max(a, b); });
        break;
      case ncclMin:
        foldInto<T>(dst, inputs[k], count, [](A a, A b) { return std::min(a, b); });
        break;
      default:
        foldInto<T>(dst, inputs[k], count, add<A>);
        break;  // ncclSum, ncclAvg
    }
  }
  if (reduction.builtin == ncclAvg) divideInPlace<T>(dst, count, inputs.size());
}

// Calls fn(T{}) with the element type of `type`; false for an invalid type.
template <class Fn>
bool withElementType(ncclDataType_t type, Fn&& fn) {
  switch (type) {
    case ncclInt8:
      fn(int8_t{});
      return true;
    case ncclUint8:
      fn(uint8_t{});
      return true;
    case ncclInt32:
      fn(int32_t{});
      return true;
    case ncclUint32:
      fn(uint32_t{});
      return true;
    case ncclInt64:
      fn(int64_t{});
      return true;
    case ncclUint64:
      fn(uint64_t{});
      return true;
    case ncclFloat16:
      fn(__half{});
      return true;
    case ncclFloat32:
      fn(float{});
      return true;
    case ncclFloat64:
      fn(double{});
      return true;
    case ncclBfloat16:
      fn(__nv_bfloat16{});
      return true;
    case ncclFloat8e4m3:
      fn(__nv_fp8_e4m3{});
      return true;
    case ncclFloat8e5m2:
      fn(__nv_fp8_e5m2{});
      return true;
    default:
      return false;
  }
}

}  // namespace

size_t datatypeSize(ncclDataType_t type) {
  size_t size = 0;
  withElementType(type, [&](auto element) { size = sizeof(element); });
  return size;
}

const char* datatypeName(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
      return "int8";
    case ncclUint8:
      return "uint8";
    case ncclInt32:
      return "int32";
    case ncclUint32:
      return "uint32";
    case ncclInt64:
      return "int64";
    case ncclUint64:
      return "uint64";
    case ncclFloat16:
      return "float16";
    case ncclFloat32:
      return "float32";
    case ncclFloat64:
      return "float64";
    case ncclBfloat16:
      return "bfloat16";
    case ncclFloat8e4m3:
      return "float8e4m3";
    case ncclFloat8e5m2:
      return "float8e5m2";
    default:
      return "invalid";
  }
}

void reduceInOrder(void* dst, std::span<const void* const> inputs, size_t count, ncclDataType_t type,
                   const Reduction& reduction) {
  withElementType(type, [&](auto element) { reduceTyped<decltype(element)>(dst, inputs, count, reduction); });
}

}  // namespace rankscope::fakenccl
