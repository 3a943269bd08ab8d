#pragma once
// Turning a fiber stack overflow into a clear message instead of a bare SIGSEGV.

namespace spindle {

/// Installs (once per process) a SIGSEGV handler that recognises a fault in the running fiber's
/// guard page, prints which fiber overflowed and aborts. Other faults go to the handler that was
/// installed before (for example AddressSanitizer's) or to the default action.
void install_stack_overflow_handler();

/// An alternate signal stack for the calling thread while in scope: the handler cannot run on
/// the stack that just overflowed.
class AltSignalStack {
 public:
  AltSignalStack();
  ~AltSignalStack();
  AltSignalStack(const AltSignalStack&) = delete;
  AltSignalStack& operator=(const AltSignalStack&) = delete;

 private:
  /// The mapped alternate stack, or nullptr if it could not be set.
  void* memory_ = nullptr;
};

}  // namespace spindle
