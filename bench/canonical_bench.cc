// What making a request canonical costs (http/canonical.h) beside what the drivers did in the
// same place before it (the target's normalisation), both after the same parse, for a wrk
// request and a browser's (bench/http/browser-headers.txt). Names: <request>/<step>, where the
// step is "parsed" (the parse alone), "normalised" (the peer) or "canonical". At the end it
// prints, per request, canonical / normalised (parse included, CPU time) and what each step
// costs on top of the parse, all measured in this run.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "spindle/h1/parser.h"
#include "spindle/http/canonical.h"

using namespace spindle::http;

namespace {

std::string wrk_request() { return "GET /plaintext HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"; }

std::string browser_request() {
  std::ifstream in(SPINDLE_SOURCE_DIR "/bench/http/browser-headers.txt");
  std::stringstream fields;
  fields << in.rdbuf();
  std::string request = "GET /index.html HTTP/1.1\r\nhost: 127.0.0.1:8443\r\n";
  for (std::string line; std::getline(fields, line);) request += line + "\r\n";
  return request + "\r\n";
}

/// What is done after the parse.
enum class Step { kParsed, kNormalised, kCanonical };

/// Parses `text` (a fresh copy each time: the canonical request is made in the buffer) and then
/// takes `step`.
void parse_and(benchmark::State& state, const std::string& text, Step step) {
  RequestParser parser(ParserLimits{});
  RequestHead head;
  std::string buffer = text;
  const PathRules rules;
  for (auto _ : state) {
    buffer.assign(text);
    parser.reset();
    if (parser.parse(buffer, head).state != ParseResult::State::kComplete) {
      state.SkipWithError("not parsed");
      return;
    }
    char* target = buffer.data() + (head.target.data() - buffer.data());
    if (step == Step::kCanonical) {
      benchmark::DoNotOptimize(canonicalize_request(head, target, rules));
    } else if (step == Step::kNormalised) {
      benchmark::DoNotOptimize(normalize_target(target, head.target.size(), rules));
    }
    benchmark::DoNotOptimize(head);
  }
}

/// Prints as the console does and keeps each benchmark's CPU time per iteration (the median of
/// the repetitions when there are some): on a shared machine the real time counts the other
/// processes' turns.
class KeepingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      if (run.run_type == Run::RT_Iteration || median) {
        ns_[run.run_name.function_name] = run.GetAdjustedCPUTime();
      }
    }
  }
  /// CPU nanoseconds per iteration of benchmark `name`, or 0 if it did not run.
  double ns(const std::string& name) const {
    auto it = ns_.find(name);
    return it == ns_.end() ? 0 : it->second;
  }

 private:
  std::map<std::string, double> ns_;
};

void print_ratios(const KeepingReporter& times, const std::vector<std::string>& requests) {
  fmt::print("\nCPU ns per request: the parse alone, then with each step after it\n");
  fmt::print("{:<10} {:>10} {:>12} {:>11} {:>22} {:>24}\n", "request", "parsed", "normalised",
             "canonical", "canonical/normalised", "step alone: norm -> can");
  for (const std::string& request : requests) {
    const double parsed = times.ns(request + "/parsed");
    const double normalised = times.ns(request + "/normalised");
    const double canonical = times.ns(request + "/canonical");
    if (parsed == 0 || normalised == 0 || canonical == 0) continue;
    fmt::print("{:<10} {:>10.1f} {:>12.1f} {:>11.1f} {:>21.2f}x {:>12.1f} -> {:<8.1f}\n", request,
               parsed, normalised, canonical, canonical / normalised, normalised - parsed,
               canonical - parsed);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::pair<std::string, std::string>> requests = {
      {"Wrk", wrk_request()}, {"Browser", browser_request()}};
  const std::pair<const char*, Step> steps[] = {{"parsed", Step::kParsed},
                                                {"normalised", Step::kNormalised},
                                                {"canonical", Step::kCanonical}};
  std::vector<std::string> names;
  for (const auto& [name, text] : requests) {
    names.push_back(name);
    for (const auto& [step_name, step] : steps) {
      benchmark::RegisterBenchmark((name + "/" + step_name).c_str(), parse_and, text, step);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  KeepingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  print_ratios(reporter, names);
  benchmark::Shutdown();
}
