#pragma once
// Expected failures travel as Result<T>: a value or a typed error with a
// message a user can act on. "Nothing yet" is std::optional, not an error.
#include <string>
#include <utility>
#include <variant>

namespace rankscope {

enum class Errc {
  invalid_argument,
  not_found,
  io,
  storage,
  protocol,
  unsupported_version,
  refused,
  system,
};

struct Error {
  Errc code;
  std::string message;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}
  Result(Error error) : state_(std::move(error)) {}

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(state_); }
  T&& value() && { return std::get<0>(std::move(state_)); }
  const T& value() const& { return std::get<0>(state_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const Error& error() const { return std::get<1>(state_); }

 private:
  std::variant<T, Error> state_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_{};
  bool ok_ = true;
};

inline Error make_error(Errc code, std::string message) { return Error{code, std::move(message)}; }

}  // namespace rankscope
