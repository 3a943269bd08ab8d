#pragma once
/// IntrusivePtr: a shared pointer to an object that counts its own references
/// (T::add_ref() / T::release()), so sharing costs no separate control block.

#include <utility>

namespace spindle {

/// Holds one reference to a T. T::release() destroys the object when the count reaches zero.
template <typename T>
class IntrusivePtr {
 public:
  IntrusivePtr() = default;
  /// Adopts one reference already counted for the caller.
  static IntrusivePtr adopt(T* p) {
    IntrusivePtr r;
    r.p_ = p;
    return r;
  }
  /// Takes a new reference to `p`.
  explicit IntrusivePtr(T* p) : p_(p) {
    if (p_) p_->add_ref();
  }
  IntrusivePtr(const IntrusivePtr& o) : IntrusivePtr(o.p_) {}
  IntrusivePtr(IntrusivePtr&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  template <typename U>
  IntrusivePtr(IntrusivePtr<U>&& o) noexcept : p_(o.detach()) {}
  IntrusivePtr& operator=(IntrusivePtr o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~IntrusivePtr() {
    if (p_) p_->release();
  }

  T* get() const { return p_; }
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }
  /// Gives up the reference without releasing it.
  T* detach() { return std::exchange(p_, nullptr); }

 private:
  /// The referenced object, or nullptr.
  T* p_ = nullptr;
};

}  // namespace spindle
