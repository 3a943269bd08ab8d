#include "spindle/base/error.h"

#include <string>

namespace spindle {
namespace {

class SpindleCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "spindle"; }
  std::string message(int value) const override {
    switch (static_cast<Errc>(value)) {
      case Errc::kEndOfStream:
        return "end of stream before the expected data";
    }
    return "unknown spindle error";
  }
};

}  // namespace

const std::error_category& spindle_category() {
  static const SpindleCategory category;
  return category;
}

}  // namespace spindle
